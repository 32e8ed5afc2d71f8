// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the configuration tests: an injected environment (tests
// never touch the real one) and error capture.
#pragma once

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "config/config.hpp"

namespace wia::test {

// Owns its variables; the lookup keeps them alive through a shared_ptr, so
// a Config may outlive the FakeEnv object it was built from.
class FakeEnv {
 public:
  FakeEnv() : vars_(std::make_shared<std::map<std::string, std::string>>()) {}
  FakeEnv(std::initializer_list<std::pair<const std::string, std::string>> vars)
      : vars_(std::make_shared<std::map<std::string, std::string>>(vars)) {}

  EnvLookup lookup() const {
    return [vars = vars_](const char* name) -> const char* {
      auto it = vars->find(name);
      return it == vars->end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::shared_ptr<std::map<std::string, std::string>> vars_;
};

inline EnvLookup no_env() {
  return [](const char*) -> const char* { return nullptr; };
}

// Runs `fn`, which must throw wia::Error with `status`; returns its message.
template <typename Fn>
std::string error_of(Fn&& fn, wia_status_t status = WIA_ERROR_CONFIG) {
  try {
    fn();
  } catch (const Error& e) {
    // doctest streams the message with operator*, so pass one value.
    const std::string why = std::string(status_name(e.status())) + " instead of " +
                            status_name(status) + ": " + e.what();
    CHECK_MESSAGE(e.status() == status, why);
    return e.what();
  }
  FAIL((std::string("expected wia::Error(") + status_name(status) + "), nothing was thrown"));
  return {};
}

// The message of parsing `yaml` (named "f.yaml") with `env`.
inline std::string parse_error(std::string_view yaml, const EnvLookup& env = no_env()) {
  return error_of([&] { Config::parse(yaml, "f.yaml", env); });
}

}  // namespace wia::test
