// SPDX-License-Identifier: Apache-2.0
// wia_compression_config_from_string: one spelling of the compression
// methods for every front end (wia-bench --compress, wia_torch's hook).
#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "api/guard.hpp"
#include "common/error.hpp"
#include <wia/wia.h>

namespace {

using wia::Error;

constexpr const char* kMethods = "none, topk[:R], randomk[:R], int8, int4, onebit, lowrank[:r], fp16, bf16";

wia_compression_config_t parse(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const bool has_param = colon != std::string::npos;
  const std::string param = has_param ? spec.substr(colon + 1) : "";
  auto bad = [&](const std::string& why) {
    return Error(WIA_ERROR_INVALID_ARGUMENT, fmt::format("compression '{}': {}", spec, why));
  };
  auto number = [&](double fallback) {
    if (!has_param) return fallback;
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(param.c_str(), &end);
    if (param.empty() || *end || errno) throw bad(fmt::format("'{}' is not a number", param));
    return v;
  };
  wia_compression_config_t c{};
  if (name == "topk" || name == "randomk") {
    const double ratio = number(name == "topk" ? 0.01 : 0.1);
    if (!(ratio > 0 && ratio <= 1)) throw bad(fmt::format("ratio {} is outside (0, 1]", param));
    if (name == "topk") {
      c.method = WIA_COMPRESS_TOPK;
      c.parameters.topk.k_ratio = ratio;
      c.parameters.topk.use_magnitude = true;
      c.error_feedback = true;
    } else {
      c.method = WIA_COMPRESS_RANDOMK;
      c.parameters.randomk.k_ratio = ratio;
      c.parameters.randomk.seed = 1;
    }
    return c;
  }
  if (name == "lowrank") {
    const double rank = number(4);
    if (!(rank >= 1 && rank <= (1 << 20)) || rank != static_cast<double>(static_cast<int>(rank)))
      throw bad(fmt::format("rank {} is not an integer >= 1", param));
    c.method = WIA_COMPRESS_LOWRANK;
    c.parameters.lowrank.rank = static_cast<int>(rank);
    c.error_feedback = true;
    return c;
  }
  if (has_param) throw bad(fmt::format("'{}' takes no parameter", name));
  if (name == "none") {
    c.method = WIA_COMPRESS_NONE;
  } else if (name == "int8" || name == "int4") {
    c.method = WIA_COMPRESS_QUANTIZE;
    c.parameters.quantize.num_bits = name == "int8" ? 8 : 4;
    c.parameters.quantize.use_dynamic_range = true;
  } else if (name == "onebit") {
    c.method = WIA_COMPRESS_ONEBIT;
    c.error_feedback = true;
  } else if (name == "fp16") {
    c.method = WIA_COMPRESS_FP16;
  } else if (name == "bf16") {
    c.method = WIA_COMPRESS_BF16;
  } else {
    throw bad(fmt::format("unknown method '{}' (one of: {})", name, kMethods));
  }
  return c;
}

}  // namespace

WIA_API wia_status_t wia_compression_config_from_string(const char* spec,
                                                        wia_compression_config_t* config) {
  return wia::api::guard(__func__, [&] {
    wia::api::require_non_null(spec, "spec");
    wia::api::require_non_null(config, "config");
    *config = parse(spec);
  });
}
