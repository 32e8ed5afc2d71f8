// SPDX-License-Identifier: Apache-2.0
// The bootstrap secret of fuzz_bootstrap's job, shared with the corpus
// generator so that seeds carry valid authentication.
#pragma once

#include "bootstrap/siphash.hpp"

namespace wia::fuzz {

inline const bootstrap::Secret kSecret = {{0x77, 0x69, 0x61, 0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x2d,
                                           0x73, 0x65, 0x63, 0x72, 0x65, 0x74, 0x21}};

}  // namespace wia::fuzz
