// SPDX-License-Identifier: Apache-2.0
// ULFM-style recovery (wia/fault_tolerance.h): revoke, agree, shrink, and
// the spec's wia_create_communicator_fault_tolerant; for process
// communicators the work is in comm/process_recovery.cpp.
#include <fmt/format.h>
#include <wia/wia.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "comm/device_communicator.hpp"
#include "comm/process_communicator.hpp"

using namespace wia;

namespace {

// Process communicators: one rank per process, the calls are collective
// over the survivors. Device communicators: every rank is a device of this
// process, so one call acts for all of them and no agreement is needed;
// a rank fails when its device reports an error.
comm::ProcessCommunicator* as_process(wia_communicator_t c) {
  return dynamic_cast<comm::ProcessCommunicator*>(&api::live(c));
}

comm::DeviceCommunicator& as_device(wia_communicator_t c) {
  return dynamic_cast<comm::DeviceCommunicator&>(api::live(c));
}

struct Agreed {
  int flag = 0;
  std::vector<int> failed;
};

Agreed agree(wia_communicator_t comm, int flag) {
  if (comm::ProcessCommunicator* p = as_process(comm)) {
    const auto a = p->agree(flag);
    return {a.flag, a.failed};
  }
  return {flag, as_device(comm).failed_ranks()};
}

std::unique_ptr<comm::CommunicatorBase> shrink_device(comm::DeviceCommunicator& d) {
  const std::vector<int> failed = d.failed_ranks();
  std::vector<wia_device_t> devices;
  std::vector<int> origins;
  for (int r = 0; r < d.size(); ++r) {
    if (std::binary_search(failed.begin(), failed.end(), r)) continue;
    devices.push_back(d.device_of_rank(r));
    origins.push_back(d.origin_rank(r));
  }
  if (devices.empty())
    throw Error(WIA_ERROR_REMOTE,
                fmt::format("every one of the communicator's {} devices failed: nothing to "
                            "shrink to",
                            d.size()));
  auto child = std::make_unique<comm::DeviceCommunicator>(devices);
  child->set_origin(std::move(origins), d.origin_size());
  return child;
}

void shrink_into(wia_communicator_t comm, wia_communicator_t* newcomm) {
  api::require_non_null(newcomm, "newcomm");
  *newcomm = nullptr;
  if (comm::ProcessCommunicator* p = as_process(comm)) {
    *newcomm = api::publish(p->shrink(nullptr));
    return;
  }
  *newcomm = api::publish(shrink_device(as_device(comm)));
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_comm_revoke(wia_communicator_t comm) {
  return api::guard(__func__, [&] {
    if (comm::ProcessCommunicator* p = as_process(comm))
      p->revoke();
    else
      as_device(comm).revoke();
  });
}

WIA_API wia_status_t wia_comm_agree(wia_communicator_t comm, int* flag) {
  return api::guard(__func__, [&] {
    api::require_non_null(flag, "flag");
    *flag = agree(comm, *flag).flag;
  });
}

WIA_API wia_status_t wia_comm_agree_failed(wia_communicator_t comm, int* flag, int* failed_ranks,
                                           int capacity, int* failed_count) {
  return api::guard(__func__, [&] {
    api::require_non_null(flag, "flag");
    api::require_non_null(failed_count, "failed_count");
    if (capacity < 0)
      throw Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("capacity is {}", capacity));
    if (capacity > 0) api::require_non_null(failed_ranks, "failed_ranks");
    const Agreed a = agree(comm, *flag);
    *flag = a.flag;
    for (std::size_t i = 0; i < a.failed.size() && i < static_cast<std::size_t>(capacity); ++i)
      failed_ranks[i] = a.failed[i];
    *failed_count = static_cast<int>(a.failed.size());
  });
}

WIA_API wia_status_t wia_comm_shrink(wia_communicator_t comm, wia_communicator_t* newcomm) {
  return api::guard(__func__, [&] { shrink_into(comm, newcomm); });
}

WIA_API wia_status_t wia_create_communicator_fault_tolerant(wia_communicator_t* new_comm,
                                                            wia_communicator_t comm) {
  return api::guard(__func__, [&] { shrink_into(comm, new_comm); });
}

}  // extern "C"
