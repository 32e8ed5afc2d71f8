// SPDX-License-Identifier: Apache-2.0
// Redundant gradient computation (spec 6.9.1): the pairwise exchange is a
// send and a receive on the communicator (posting never blocks, so both
// partners may send first), the comparison is on the host, a mismatch is
// recorded in the communicator's failed set.
#include <fmt/format.h>
#include <wia/wia.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "comm/redundancy_shards.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"
#include "kernels/element_access.hpp"

namespace wia::api {
namespace {

struct GradientExchange {
  wia_communicator_t comm = nullptr;
  std::size_t count = 0;
  wia_datatype_t datatype = WIA_FLOAT32;
  wia_stream_t stream = nullptr;
};
thread_local GradientExchange t_exchange;

void check_rank(wia_communicator_t comm, int rank, const char* what) {
  const int n = live(comm).size();
  if (rank < 0 || rank >= n)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("{} {} is not a rank of the communicator (0..{})", what, rank, n - 1));
}

// The calling rank: the rank of the stream's device (NULL: the current one).
int my_rank(wia_communicator_t comm, wia_stream_t stream) {
  wia_device_t device = 0;
  if (stream != nullptr) {
    if (wia_stream_get_device(stream, &device) != WIA_SUCCESS)
      throw Error(WIA_ERROR_INVALID_HANDLE, wia_get_last_error());
  } else if (wia_get_device(&device) != WIA_SUCCESS) {
    throw Error(WIA_ERROR_INTERNAL, wia_get_last_error());
  }
  const int r = live(comm).rank_of_device(device);
  if (r < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("device {} is not a member of the communicator", device));
  return r;
}

// Operations on a stream run one after the other, so the lower rank sends
// first and the higher receives first: each side's first operation is the
// other's match.
void exchange(wia_communicator_t comm, int partner, const void* mine, void* theirs,
              std::size_t count, wia_datatype_t dtype, wia_stream_t stream) {
  check_rank(comm, partner, "partner");
  const int me = my_rank(comm, stream);
  if (me == partner)
    throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("rank {} is its own partner", me));
  auto send = [&] { return wia_comm_send(comm, mine, count, dtype, partner, stream); };
  auto recv = [&] { return wia_comm_recv(comm, theirs, count, dtype, partner, stream); };
  wia_status_t st = me < partner ? send() : recv();
  if (st == WIA_SUCCESS) st = me < partner ? recv() : send();
  if (st != WIA_SUCCESS)
    throw Error(
        st, fmt::format("exchanging gradients with rank {}: {}", partner, wia_get_last_error()));
}

}  // namespace
}  // namespace wia::api

using namespace wia;

WIA_API wia_status_t wia_send_receive_gradients_ex(wia_communicator_t comm, int partner,
                                                   const void* gradients, void* partner_gradients,
                                                   size_t count, wia_datatype_t datatype,
                                                   wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::exchange(comm, partner, gradients, partner_gradients, count, datatype, stream);
  });
}

WIA_API wia_status_t wia_set_gradient_exchange(wia_communicator_t comm, size_t count,
                                               wia_datatype_t datatype, wia_stream_t stream) {
  return api::guard(__func__, [&] {
    api::live(comm);
    const wia_datatype_t d = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    api::t_exchange = {comm, count, d, stream};
  });
}

WIA_API wia_status_t wia_send_receive_gradients(int partner, const void* gradients,
                                                void* partner_gradients) {
  return api::guard(__func__, [&] {
    const api::GradientExchange& x = api::t_exchange;
    if (x.comm == nullptr)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  "no communicator for the 3-argument form: call wia_set_gradient_exchange first "
                  "(or use wia_send_receive_gradients_ex)");
    api::exchange(x.comm, partner, gradients, partner_gradients, x.count, x.datatype, x.stream);
    const wia_status_t st = wia_stream_synchronize(x.stream);
    if (st != WIA_SUCCESS)
      throw Error(
          st, fmt::format("exchanging gradients with rank {}: {}", partner, wia_get_last_error()));
  });
}

WIA_API bool wia_gradients_match(const void* a, const void* b, size_t count,
                                 wia_datatype_t datatype, double tolerance) {
  bool match = false;
  api::guard(__func__, [&] {
    const wia_datatype_t d = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    if (count > 0) {
      api::require_non_null(a, "a");
      api::require_non_null(b, "b");
    }
    if (!(tolerance >= 0.0))
      throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("tolerance {} is not >= 0", tolerance));
    for (std::size_t i = 0; i < count; ++i) {
      const double x = kernels::load_element(a, i, d);
      const double y = kernels::load_element(b, i, d);
      if (std::isnan(x) || std::isnan(y)) {
        if (std::isnan(x) && std::isnan(y)) continue;
        return;
      }
      if (std::fabs(x - y) > tolerance * std::fmax(1.0, std::fmax(std::fabs(x), std::fabs(y))))
        return;
    }
    match = true;
  });
  return match;
}

WIA_API wia_status_t wia_gradients_checksum_match(wia_communicator_t comm, int partner,
                                                  const void* gradients, size_t count,
                                                  wia_datatype_t datatype, wia_stream_t stream,
                                                  bool* match) {
  return api::guard(__func__, [&] {
    api::require_non_null(match, "match");
    const wia_datatype_t d = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    if (count > 0) api::require_non_null(gradients, "gradients");
    const std::uint64_t mine = XXH3_64bits(gradients, count * kernels::dtype_size(d));
    std::uint64_t theirs = ~mine;
    api::exchange(comm, partner, &mine, &theirs, 1, WIA_UINT64, stream);
    const wia_status_t st = wia_stream_synchronize(stream);
    if (st != WIA_SUCCESS)
      throw Error(
          st, fmt::format("exchanging checksums with rank {}: {}", partner, wia_get_last_error()));
    *match = mine == theirs;
  });
}

WIA_API wia_status_t wia_report_failure(wia_communicator_t comm, int my_rank, int partner) {
  return api::guard(__func__, [&] {
    api::check_rank(comm, partner, "partner");
    api::check_rank(comm, my_rank, "my_rank");
    log::error("comm", "rank {} and rank {} computed different gradients (wia_report_failure)",
               my_rank, partner);
    api::live(comm).report_failed(partner);
  });
}

WIA_API wia_status_t wia_comm_origin_rank(wia_communicator_t comm, int rank, int* origin_rank,
                                          int* origin_size) {
  return api::guard(__func__, [&] {
    api::require_non_null(origin_rank, "origin_rank");
    api::require_non_null(origin_size, "origin_size");
    api::check_rank(comm, rank, "rank");
    const comm::CommunicatorBase& c = api::live(comm);
    *origin_rank = c.origin_rank(rank);
    *origin_size = c.origin_size();
  });
}

WIA_API wia_status_t wia_get_redundancy_view(wia_communicator_t comm,
                                             const wia_redundancy_config_t* config, int rank,
                                             wia_redundancy_view_t* view) {
  return api::guard(__func__, [&] {
    api::require_non_null(config, "config");
    api::require_non_null(view, "view");
    api::check_rank(comm, rank, "rank");
    const comm::CommunicatorBase& c = api::live(comm);
    std::vector<int> origins(static_cast<std::size_t>(c.size()));
    for (int r = 0; r < c.size(); ++r) origins[static_cast<std::size_t>(r)] = c.origin_rank(r);
    const comm::RedundancyView v = comm::redundancy_view(*config, c.origin_size(), origins, rank);
    *view = {v.shard, v.num_shards, v.live_replicas, v.partner, v.gradient_scale};
  });
}
