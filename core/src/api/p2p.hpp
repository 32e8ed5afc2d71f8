// SPDX-License-Identifier: Apache-2.0
// What api_process.cpp and api_coll.cpp tell wia_send/wia_recv
// (api_p2p.cpp): the process communicator created last, which the spec's
// five-argument calls use, and its destruction.
#pragma once

#include <wia/wia.h>

namespace wia::api {

void note_distributed_communicator(wia_communicator_t comm);
// `comm` is being destroyed: wia_send no longer uses it, and what was
// logged about it is forgotten (a later communicator may reuse its address).
void forget_distributed_communicator(wia_communicator_t comm) noexcept;

}  // namespace wia::api
