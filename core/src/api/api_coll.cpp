// SPDX-License-Identifier: Apache-2.0
// Communicators and collectives (spec 6.4 - 6.6): argument validation and
// translation into comm::Call; the communicator does the rest.
#include <wia/wia.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "api/communicators.hpp"
#include "api/compress_job.hpp"
#include "api/guard.hpp"
#include "api/p2p.hpp"
#include "common/hot_tls.hpp"
#include "common/log.hpp"
#include "coll/schedule.hpp"
#include "comm/device_communicator.hpp"
#include "comm/group.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"


using namespace wia;
using wia::api::communicators;
using wia::api::live;

namespace {

thread_local int t_group_depth WIA_HOT_TLS = 0;
thread_local wia_status_t t_group_error WIA_HOT_TLS = WIA_SUCCESS;

// The public ids and coll::Algorithm are numbered alike (checked below).
coll::Algorithm to_algorithm(const wia_algorithm_id_t& id) {
  return static_cast<coll::Algorithm>(
      api::checked_enum(id, WIA_ALGORITHM_ONE_SHOT + 1, "config->algorithm"));
}
static_assert(static_cast<int>(coll::Algorithm::kRing) == WIA_ALGORITHM_RING &&
              static_cast<int>(coll::Algorithm::kTree) == WIA_ALGORITHM_TREE &&
              static_cast<int>(coll::Algorithm::kBinomial) == WIA_ALGORITHM_BINOMIAL &&
              static_cast<int>(coll::Algorithm::kRabenseifner) == WIA_ALGORITHM_RABENSEIFNER &&
              static_cast<int>(coll::Algorithm::kRecursiveDoubling) ==
                  WIA_ALGORITHM_RECURSIVE_DOUBLING &&
              static_cast<int>(coll::Algorithm::kRecursiveHalving) ==
                  WIA_ALGORITHM_RECURSIVE_HALVING &&
              static_cast<int>(coll::Algorithm::kBruck) == WIA_ALGORITHM_BRUCK &&
              static_cast<int>(coll::Algorithm::kChain) == WIA_ALGORITHM_CHAIN &&
              static_cast<int>(coll::Algorithm::kScatterAllGather) ==
                  WIA_ALGORITHM_SCATTER_ALLGATHER &&
              static_cast<int>(coll::Algorithm::kDirect) == WIA_ALGORITHM_DIRECT &&
              static_cast<int>(coll::Algorithm::kPairwise) == WIA_ALGORITHM_PAIRWISE &&
              static_cast<int>(coll::Algorithm::kHierarchical) ==
                  WIA_ALGORITHM_HIERARCHICAL &&
              static_cast<int>(coll::Algorithm::kOneShot) == WIA_ALGORITHM_ONE_SHOT &&
              coll::kAlgorithmCount == WIA_ALGORITHM_ONE_SHOT + 1,
              "public algorithm ids must match coll::Algorithm");

// Checks that `bytes` at p are usable: non-NULL, and inside its allocation
// when libwia allocated it.
void check_buffer(const void* p, std::uint64_t bytes, const char* what, int rank) {
  if (bytes == 0) return;
  if (p == nullptr)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("rank {}: {} is NULL but {} bytes are needed", rank, what, bytes));
  if (auto a = objects().allocations.find(p)) {
    const std::uint64_t off = reinterpret_cast<std::uintptr_t>(p) - a->base;
    if (bytes > a->size - off)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("rank {}: {} needs {} bytes but only {} remain in its allocation "
                              "on device {}",
                              rank, what, bytes, a->size - off, a->device));
  }
}

bool overlap(const void* a, std::uint64_t na, const void* b, std::uint64_t nb) {
  if (!a || !b || !na || !nb) return false;
  auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + nb && y < x + na;
}

struct Request {
  coll::Collective collective;
  const void* send = nullptr;
  void* recv = nullptr;
  void* send_shards = nullptr;  // all-to-all, spec form: array of pointers
  void* recv_shards = nullptr;
  std::uint64_t count = 0;
  int root = 0;
  wia_datatype_t dtype = WIA_FLOAT32;
  wia_reduce_op_t op = WIA_REDUCE_SUM;
  const wia_collective_config_t* config = nullptr;
  wia_collective_op_t expected_operation = WIA_COLLECTIVE_ALLREDUCE;
  bool dtype_from_config = true;
  bool op_from_config = false;
};

int rank_of_stream(const comm::CommunicatorBase& comm, const wia_stream_s* s) {
  const int rank = comm.rank_of_device(s->device);
  if (rank < 0)
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("the stream's device {} is not a member of this communicator (a "
                            "call's rank is the rank of its stream's device)",
                            s->device));
  return rank;
}

// The last call this thread posted that passed every check below, and
// the state those checks read. A training loop posts the same call (same
// buffers, count and config) over and over; checking it again was a
// sixth of an 8-byte all-reduce across processes. Creating or destroying
// a communicator, stream or allocation, a new runtime or another current
// device changes the stamp and the call is checked again.
// What the checks read besides the arguments: the tables and the runtime
// (one epoch that every change of them bumps) and the current device.
struct Stamp {
  std::uint64_t objects = 0;
  std::uint64_t device = 0;  // the current device, which names the default stream
  bool operator==(const Stamp&) const = default;
};

Stamp stamp_now() {
  return {g_object_epoch.load(std::memory_order_acquire), current_device_stamp()};
}

struct CheckedCall {
  bool valid = false;
  wia_communicator_t handle = nullptr;
  wia_stream_t stream = nullptr;
  Request req{coll::Collective::kAllReduce};
  bool has_config = false;
  wia_collective_config_t config{};
  Stamp stamp;
  comm::CommunicatorBase* comm = nullptr;
  wia_stream_s* resolved = nullptr;
  int rank = 0;
  comm::Call call;
};
// Reached through an initial-exec pointer: the object itself (vectors
// inside, a destructor) can only be a general-dynamic thread_local, whose
// every access from this shared library is a __tls_get_addr call.
thread_local std::unique_ptr<CheckedCall> t_checked_owner;
thread_local CheckedCall* t_checked WIA_HOT_TLS = nullptr;

CheckedCall& checked_call() {
  if (CheckedCall* k = t_checked) return *k;
  t_checked_owner = std::make_unique<CheckedCall>();
  return *(t_checked = t_checked_owner.get());
}

bool same_request(const Request& a, const Request& b) {
  return a.collective == b.collective && a.send == b.send && a.recv == b.recv &&
         a.send_shards == b.send_shards && a.recv_shards == b.recv_shards && a.count == b.count &&
         a.root == b.root && a.dtype == b.dtype && a.op == b.op &&
         a.expected_operation == b.expected_operation &&
         a.dtype_from_config == b.dtype_from_config && a.op_from_config == b.op_from_config;
}

bool still_checked(const CheckedCall& k, wia_communicator_t c, const Request& req,
                   wia_stream_t stream) {
  if (!k.valid || k.handle != c || k.stream != stream || !same_request(k.req, req) ||
      k.has_config != (req.config != nullptr))
    return false;
  if (req.config && std::memcmp(&k.config, req.config, sizeof(k.config)) != 0) return false;
  return stamp_now() == k.stamp;
}

wia_status_t post(wia_communicator_t c, Request req, wia_stream_t stream) {
  // All-to-all reads arrays of pointers whose contents may change.
  const bool memo = req.collective != coll::Collective::kAllToAll;
  CheckedCall& checked = checked_call();
  if (memo && still_checked(checked, c, req, stream)) {
    if (checked.comm->try_post_repeat(checked.rank, checked.call, checked.resolved))
      return WIA_SUCCESS;
    return checked.comm->post(checked.rank, checked.call, checked.resolved);
  }
  checked.valid = false;
  // Read before the checks: a table that changes while they run makes the
  // next call check again.
  const Stamp stamp = stamp_now();
  comm::CommunicatorBase& comm = live(c);
  // Compression as a property of the links between hosts (a policy the
  // user set: a selector rule's compress key, compression.link_codec,
  // WIA_NET_COMPRESS_AUTO), for communicators that span hosts; never inside
  // a group, whose calls must stay plain collectives of comm. (A call it
  // takes leaves the memo unset, so the next one asks again.)
  if (req.collective == coll::Collective::kAllReduce && req.config != nullptr &&
      t_group_depth == 0 && comm.node_count() > 1 &&
      api::compressed::all_reduce_with_link_codec(c, req.send, req.recv, req.count, *req.config,
                                                  stream))
    return WIA_SUCCESS;
  wia_stream_s* s = resolve_stream(stream);
  const int rank = rank_of_stream(comm, s);
  comm::Call call;
  call.collective = req.collective;
  call.count = req.count;
  call.root = req.root;
  call.dtype = api::checked_enum(req.dtype, WIA_DATATYPE_COUNT, "datatype");
  call.op = req.op;
  if (const wia_collective_config_t* cfg = req.config) {
    // A zero-initialised config says ALLREDUCE (0): treat that as "unset".
    const wia_collective_op_t operation =
        api::checked_enum(cfg->operation, WIA_COLLECTIVE_SENDRECV + 1, "config->operation");
    if (operation != req.expected_operation && operation != WIA_COLLECTIVE_ALLREDUCE)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("config->operation is {} but the function called is for {}",
                              static_cast<int>(operation),
                              static_cast<int>(req.expected_operation)));
    if (req.dtype_from_config)
      call.dtype = api::checked_enum(cfg->datatype, WIA_DATATYPE_COUNT, "config->datatype");
    if (req.op_from_config)
      call.op = api::checked_enum(cfg->reduction_op, WIA_REDUCE_OP_COUNT, "config->reduction_op");
    call.algorithm = to_algorithm(cfg->algorithm);
    call.num_chunks = cfg->num_chunks;
    call.timeout_ms = cfg->timeout_ms;
  }

  coll::CollArgs args;
  args.collective = call.collective;
  args.op = call.op;
  args.dtype = call.dtype;
  args.count = call.count;
  args.nranks = comm.size();
  args.root = call.root;
  coll::validate_args(args);  // root, dtype, op, overflow: errors before posting
  const std::uint64_t es = kernels::dtype_size(call.dtype);
  const std::uint64_t n = call.count, p = static_cast<std::uint64_t>(comm.size());

  engine::RankBuffers& b = call.buffers;
  b.send = static_cast<char*>(const_cast<void*>(req.send));
  b.recv = static_cast<char*>(req.recv);
  switch (call.collective) {
    case coll::Collective::kAllGather:
      call.in_place = req.send && req.send == b.recv + rank * n * es;
      break;
    case coll::Collective::kReduceScatter:
      call.in_place = req.recv && b.recv == b.send + rank * n * es;
      break;
    case coll::Collective::kAllToAll: {
      api::require_non_null(req.send_shards, "send_shards");
      api::require_non_null(req.recv_shards, "recv_shards");
      auto** ss = static_cast<char**>(req.send_shards);
      auto** rs = static_cast<char**>(req.recv_shards);
      b.send_shards.assign(ss, ss + p);
      b.recv_shards.assign(rs, rs + p);
      call.in_place = b.send_shards == b.recv_shards;
      for (std::uint64_t j = 0; j < p; ++j) {
        check_buffer(b.recv_shards[j], n * es, "recv shard", rank);
        if (!call.in_place) check_buffer(b.send_shards[j], n * es, "send shard", rank);
      }
      break;
    }
    default:
      call.in_place = req.send == req.recv;
      break;
  }
  args.options.in_place = call.in_place;
  const coll::BufferSizes sizes = coll::user_buffer_sizes(args, rank);
  if (call.collective == coll::Collective::kReduceScatter && call.in_place) {
    check_buffer(b.send, p * n * es, "sendbuf", rank);
  } else if (call.collective != coll::Collective::kAllToAll) {
    check_buffer(b.send, sizes.send * es, "sendbuf", rank);
    check_buffer(b.recv, sizes.recv * es, "recvbuf", rank);
    if (!call.in_place && overlap(b.send, sizes.send * es, b.recv, sizes.recv * es))
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("rank {}: sendbuf and recvbuf overlap without being in place "
                              "(in place means {})",
                              rank,
                              call.collective == coll::Collective::kAllGather
                                  ? "sendbuf == recvbuf + rank * count elements"
                              : call.collective == coll::Collective::kReduceScatter
                                  ? "recvbuf == sendbuf + rank * recvcount elements"
                                  : "sendbuf == recvbuf"));
  }
  if (memo) {
    CheckedCall& k = checked;
    k.handle = c;
    k.stream = stream;
    k.req = req;
    k.has_config = req.config != nullptr;
    if (req.config) std::memcpy(&k.config, req.config, sizeof(k.config));
    k.stamp = stamp;
    k.comm = &comm;
    k.resolved = s;
    k.rank = rank;
    k.call = call;
    k.valid = true;
  }
  return comm.post(rank, std::move(call), s);
}

void post_point_to_point(wia_communicator_t comm, bool is_send, void* buf, std::uint64_t count,
                         const wia_datatype_t& datatype, int peer, wia_stream_t stream) {
  comm::CommunicatorBase& c = live(comm);
  const wia_datatype_t t = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
  wia_stream_s* s = resolve_stream(stream);
  const int rank = rank_of_stream(c, s);
  check_buffer(buf, count * kernels::dtype_size(t), "buf", rank);
  if (is_send)
    c.post_send(rank, peer, buf, count, t, 0, s);
  else
    c.post_recv(rank, peer, buf, count, t, 0, s);
}

// Runs a posting body; inside a group the first error is remembered for
// wia_group_end as well as returned.
template <typename Body>
wia_status_t coll_guard(const char* fn, Body&& body) {
  const wia_status_t st = api::guard(fn, std::forward<Body>(body));
  if (st < 0 && t_group_depth > 0 && t_group_error == WIA_SUCCESS) t_group_error = st;
  return st;
}

}  // namespace

namespace wia::api {

void destroy_communicator(wia_communicator_t c) {
  comm::CommunicatorBase& comm = live(c);
  communicators().remove(c);
  forget_distributed_communicator(c);
  forget_compression_state(c);
  forget_profiling(comm);
  if (!comm.drain()) {
    // Stream tasks still queued on streams would run on freed memory: keep the
    // communicator alive (a bounded leak) and say why.
    const int pending = comm.in_flight();
    throw Error(WIA_ERROR_TIMEOUT,
                fmt::format("{} collective(s) are still queued on streams that never reached "
                            "them; the communicator is abandoned, not freed",
                            pending));
  }
  write_trace_at_destroy(comm);
  delete c;
}

void destroy_all_communicators() noexcept {
  for (wia_communicator_s* c : communicators().all()) {
    try {
      destroy_communicator(c);
    } catch (const std::exception& e) {
      log::error("comm", "wia_finalize: {}", e.what());
    }
  }
}

}  // namespace wia::api

extern "C" {

WIA_API wia_status_t wia_create_communicator(const wia_device_t* devices, int ndevices,
                                             wia_communicator_t* comm) {
  return api::guard(__func__, [&] {
    api::require_non_null(comm, "comm");
    api::require_non_null(devices, "devices");
    if (ndevices < 1)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("ndevices is {}; a communicator needs at least one device",
                              ndevices));
    auto c = std::make_unique<wia_communicator_s>();
    c->impl = std::make_unique<comm::DeviceCommunicator>(std::vector<wia_device_t>(devices, devices + ndevices));
    communicators().add(c.get());
    *comm = c.release();
  });
}

WIA_API wia_status_t wia_destroy_communicator(wia_communicator_t comm) {
  return api::guard(__func__, [&] { api::destroy_communicator(comm); });
}

WIA_API int wia_comm_size(wia_communicator_t comm) {
  int n = -1;
  api::guard(__func__, [&] { n = live(comm).size(); });
  return n;
}

WIA_API int wia_comm_rank(wia_communicator_t comm) {
  int r = -1;
  api::guard(__func__, [&] { r = live(comm).rank_of_device(current_device()); });
  return r;
}

WIA_API int wia_comm_rank_of_device(wia_communicator_t comm, wia_device_t device) {
  int r = -1;
  api::guard(__func__, [&] { r = live(comm).rank_of_device(device); });
  return r;
}

WIA_API wia_status_t wia_comm_get_async_error(wia_communicator_t comm) {
  return api::guard(__func__, [&] { return live(comm).async_error(); });
}

WIA_API wia_status_t wia_comm_abort(wia_communicator_t comm) {
  return api::guard(__func__, [&] {
    live(comm).request_abort();
    api::destroy_communicator(comm);
  });
}

WIA_API bool wia_detect_device_failure(wia_communicator_t comm) {
  bool failed = false;
  api::guard(__func__, [&] {
    const comm::CommunicatorBase& c = live(comm);
    failed = c.async_error() != WIA_SUCCESS || !c.failed_ranks().empty();
  });
  return failed;
}

WIA_API wia_status_t wia_comm_get_failed(wia_communicator_t comm, int* ranks, int capacity,
                                         int* count) {
  return api::guard(__func__, [&] {
    api::require_non_null(count, "count");
    if (capacity < 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("capacity is {}", capacity));
    if (capacity > 0) api::require_non_null(ranks, "ranks");
    const std::vector<int> failed = live(comm).failed_ranks();
    for (std::size_t i = 0; i < failed.size() && i < static_cast<std::size_t>(capacity); ++i)
      ranks[i] = failed[i];
    *count = static_cast<int>(failed.size());
  });
}

WIA_API wia_status_t wia_all_reduce(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                    size_t count, const wia_collective_config_t* config,
                                    wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kAllReduce};
    api::require_non_null(config, "config");
    r.send = sendbuf, r.recv = recvbuf, r.count = count, r.config = config;
    r.expected_operation = WIA_COLLECTIVE_ALLREDUCE;
    r.op_from_config = true;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_broadcast(wia_communicator_t comm, void* buf, size_t count, int root_rank,
                                   wia_datatype_t datatype, wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kBroadcast};
    r.send = buf, r.recv = buf, r.count = count, r.root = root_rank;
    r.dtype = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_broadcast_ex(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                      size_t count, int root_rank,
                                      const wia_collective_config_t* config, wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kBroadcast};
    api::require_non_null(config, "config");
    r.send = sendbuf, r.recv = recvbuf, r.count = count, r.root = root_rank, r.config = config;
    r.expected_operation = WIA_COLLECTIVE_BROADCAST;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_reduce(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                size_t count, int root_rank, const wia_collective_config_t* config,
                                wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kReduce};
    api::require_non_null(config, "config");
    r.send = sendbuf, r.recv = recvbuf, r.count = count, r.root = root_rank, r.config = config;
    r.expected_operation = WIA_COLLECTIVE_REDUCE;
    r.op_from_config = true;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_all_gather(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                    size_t count, wia_datatype_t datatype, wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kAllGather};
    r.send = sendbuf, r.recv = recvbuf, r.count = count;
    r.dtype = api::checked_enum(datatype, WIA_DATATYPE_COUNT, "datatype");
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_all_gather_ex(wia_communicator_t comm, const void* sendbuf, void* recvbuf,
                                       size_t count, const wia_collective_config_t* config,
                                       wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kAllGather};
    api::require_non_null(config, "config");
    r.send = sendbuf, r.recv = recvbuf, r.count = count, r.config = config;
    r.expected_operation = WIA_COLLECTIVE_ALLGATHER;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_reduce_scatter(wia_communicator_t comm, const void* sendbuf,
                                        void* recvbuf, size_t recvcount,
                                        const wia_collective_config_t* config,
                                        wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kReduceScatter};
    api::require_non_null(config, "config");
    r.send = sendbuf, r.recv = recvbuf, r.count = recvcount, r.config = config;
    r.expected_operation = WIA_COLLECTIVE_REDUCE_SCATTER;
    r.op_from_config = true;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_all_to_all(wia_communicator_t comm, void* send_shards, void* recv_shards,
                                    size_t shard_count, const wia_collective_config_t* config,
                                    wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    Request r{coll::Collective::kAllToAll};
    api::require_non_null(config, "config");
    r.send_shards = send_shards, r.recv_shards = recv_shards, r.count = shard_count;
    r.config = config;
    r.expected_operation = WIA_COLLECTIVE_ALLTOALL;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_all_to_all_contiguous(wia_communicator_t comm, const void* sendbuf,
                                               void* recvbuf, size_t shard_count,
                                               const wia_collective_config_t* config,
                                               wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    comm::CommunicatorBase& c = live(comm);
    api::require_non_null(config, "config");
    const std::size_t es = kernels::dtype_size(
        api::checked_enum(config->datatype, WIA_DATATYPE_COUNT, "config->datatype"));
    if (!sendbuf || !recvbuf)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, "sendbuf and recvbuf must not be NULL");
    std::vector<void*> sends(c.size()), recvs(c.size());
    for (int j = 0; j < c.size(); ++j) {
      sends[j] = const_cast<char*>(static_cast<const char*>(sendbuf)) + j * shard_count * es;
      recvs[j] = static_cast<char*>(recvbuf) + j * shard_count * es;
    }
    Request r{coll::Collective::kAllToAll};
    r.send_shards = sends.data(), r.recv_shards = recvs.data(), r.count = shard_count;
    r.config = config;
    r.expected_operation = WIA_COLLECTIVE_ALLTOALL;
    return post(comm, r, stream);
  });
}

WIA_API wia_status_t wia_comm_send(wia_communicator_t comm, const void* buf, size_t count,
                                   wia_datatype_t datatype, int peer, wia_stream_t stream) {
  return coll_guard(__func__, [&] {
    post_point_to_point(comm, true, const_cast<void*>(buf), count, datatype, peer, stream);
  });
}

WIA_API wia_status_t wia_comm_recv(wia_communicator_t comm, void* buf, size_t count,
                                   wia_datatype_t datatype, int peer, wia_stream_t stream) {
  return coll_guard(__func__,
                    [&] { post_point_to_point(comm, false, buf, count, datatype, peer, stream); });
}

WIA_API wia_status_t wia_group_start(void) {
  if (t_group_depth++ == 0) t_group_error = WIA_SUCCESS;
  comm::group_enter();
  return WIA_SUCCESS;
}

WIA_API wia_status_t wia_group_end(void) {
  if (t_group_depth == 0)
    return api::fail(__func__, WIA_ERROR_INVALID_ARGUMENT,
                     "wia_group_end without a matching wia_group_start");
  --t_group_depth;
  // At the outermost end: streams of the device engine's collectives are
  // attached now (comm/group.hpp); a failure there is the group's too.
  comm::GroupResult deferred;
  if (comm::group_leave(&deferred) > 0) return WIA_SUCCESS;
  if (t_group_error == WIA_SUCCESS && deferred.status < 0) {
    t_group_error = WIA_SUCCESS;
    return api::fail(__func__, deferred.status, deferred.message);
  }
  const wia_status_t st = t_group_error;
  t_group_error = WIA_SUCCESS;
  return st;
}

WIA_API wia_algorithm_t wia_get_selected_algorithm(wia_communicator_t comm) {
  wia_algorithm_t a{};
  a.name = "none";
  a.collective = "none";
  api::guard(__func__, [&] {
    a = live(comm).last_selected();
    if (!a.name) a.name = "none", a.collective = "none";
  });
  return a;
}

}  // extern "C"
