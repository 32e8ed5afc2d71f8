// SPDX-License-Identifier: Apache-2.0
// ULFM-style recovery on process communicators (wia/fault_tolerance.h):
// revoke, agree, shrink, and the spec's
// wia_create_communicator_fault_tolerant; the work is in
// comm/process_recovery.cpp.
#include <fmt/format.h>
#include <wia/wia.h>

#include <vector>

#include "api/communicators.hpp"
#include "api/guard.hpp"
#include "comm/process_communicator.hpp"

using namespace wia;

namespace {

comm::ProcessCommunicator& recoverable(wia_communicator_t c, const char* what) {
  auto* p = dynamic_cast<comm::ProcessCommunicator*>(&api::live(c));
  if (!p)
    throw Error(WIA_ERROR_NOT_SUPPORTED,
                fmt::format("{} needs a process-based communicator: the ranks of a device-based "
                            "one share one process, which a failure takes down as a whole",
                            what));
  return *p;
}

void shrink_into(wia_communicator_t comm, wia_communicator_t* newcomm, const char* what) {
  api::require_non_null(newcomm, "newcomm");
  *newcomm = nullptr;
  auto child = recoverable(comm, what).shrink(nullptr);
  *newcomm = api::publish(std::move(child));
}

}  // namespace

extern "C" {

WIA_API wia_status_t wia_comm_revoke(wia_communicator_t comm) {
  return api::guard(__func__, [&] { recoverable(comm, "wia_comm_revoke").revoke(); });
}

WIA_API wia_status_t wia_comm_agree(wia_communicator_t comm, int* flag) {
  return api::guard(__func__, [&] {
    api::require_non_null(flag, "flag");
    *flag = recoverable(comm, "wia_comm_agree").agree(*flag).flag;
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
    const auto a = recoverable(comm, "wia_comm_agree_failed").agree(*flag);
    *flag = a.flag;
    for (std::size_t i = 0; i < a.failed.size() && i < static_cast<std::size_t>(capacity); ++i)
      failed_ranks[i] = a.failed[i];
    *failed_count = static_cast<int>(a.failed.size());
  });
}

WIA_API wia_status_t wia_comm_shrink(wia_communicator_t comm, wia_communicator_t* newcomm) {
  return api::guard(__func__, [&] { shrink_into(comm, newcomm, "wia_comm_shrink"); });
}

WIA_API wia_status_t wia_create_communicator_fault_tolerant(wia_communicator_t* new_comm,
                                                            wia_communicator_t comm) {
  return api::guard(__func__,
                    [&] { shrink_into(comm, new_comm, "wia_create_communicator_fault_tolerant"); });
}

}  // extern "C"
