// SPDX-License-Identifier: Apache-2.0
#include "wia_common/vendor_library.hpp"

#include <dlfcn.h>

namespace wia::common {

OpenedLibrary open_first_library(const std::vector<std::string>& names, int extra_flags) {
  OpenedLibrary out;
  for (const std::string& name : names) {
    out.handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | extra_flags);
    if (out.handle != nullptr) {
      out.name = name;
      return out;
    }
    const char* why = ::dlerror();
    if (!out.tried.empty()) out.tried += "; ";
    out.tried += name + ": " + (why != nullptr ? why : "unknown error");
  }
  return out;
}

}  // namespace wia::common
