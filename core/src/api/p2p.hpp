// SPDX-License-Identifier: Apache-2.0
// What api_process.cpp tells wia_send/wia_recv (api_p2p.cpp): the process
// communicator created last, which the spec's five-argument calls use.
#pragma once

#include <wia/wia.h>

namespace wia::api {

void note_distributed_communicator(wia_communicator_t comm);

}  // namespace wia::api
