// SPDX-License-Identifier: Apache-2.0
// Opening a vendor library at init (hip, ze): the first of a list of names
// that dlopen finds, and what every name that failed said, for the
// provider's "not found" message.
#pragma once

#include <string>
#include <vector>

namespace wia::common {

struct OpenedLibrary {
  void* handle = nullptr;  // NULL when no name could be opened
  std::string name;        // the name that opened
  std::string tried;       // "name: dlerror; name: dlerror" of those that did not
};

// dlopen(name, RTLD_NOW | RTLD_LOCAL | extra_flags) of each name in turn.
OpenedLibrary open_first_library(const std::vector<std::string>& names, int extra_flags);

}  // namespace wia::common
