// SPDX-License-Identifier: Apache-2.0
#include "kernels/element_access.hpp"

#include "kernels/cpu_reduce.hpp"

namespace wia::kernels {

double load_element(const void* base, std::uint64_t i, wia_datatype_t t) noexcept {
  const char* p = static_cast<const char*>(base);
  switch (t) {
    case WIA_INT8: return reinterpret_cast<const std::int8_t*>(p)[i];
    case WIA_UINT8: return reinterpret_cast<const std::uint8_t*>(p)[i];
    case WIA_INT32: return reinterpret_cast<const std::int32_t*>(p)[i];
    case WIA_UINT32: return reinterpret_cast<const std::uint32_t*>(p)[i];
    case WIA_INT64: return static_cast<double>(reinterpret_cast<const std::int64_t*>(p)[i]);
    case WIA_UINT64: return static_cast<double>(reinterpret_cast<const std::uint64_t*>(p)[i]);
    case WIA_FLOAT16: return half_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case WIA_BFLOAT16: return bfloat16_to_float(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case WIA_FLOAT32: return reinterpret_cast<const float*>(p)[i];
    case WIA_FLOAT64: return reinterpret_cast<const double*>(p)[i];
    default: return 0;
  }
}

void store_element(void* base, std::uint64_t i, wia_datatype_t t, double v) noexcept {
  char* p = static_cast<char*>(base);
  const auto whole = static_cast<long long>(v);
  switch (t) {
    case WIA_INT8: reinterpret_cast<std::int8_t*>(p)[i] = static_cast<std::int8_t>(whole); break;
    case WIA_UINT8: reinterpret_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(whole); break;
    case WIA_INT32: reinterpret_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(whole); break;
    case WIA_UINT32: reinterpret_cast<std::uint32_t*>(p)[i] = static_cast<std::uint32_t>(whole); break;
    case WIA_INT64: reinterpret_cast<std::int64_t*>(p)[i] = whole; break;
    case WIA_UINT64:
      reinterpret_cast<std::uint64_t*>(p)[i] = static_cast<std::uint64_t>(whole);
      break;
    case WIA_FLOAT16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_half(static_cast<float>(v));
      break;
    case WIA_BFLOAT16:
      reinterpret_cast<std::uint16_t*>(p)[i] = float_to_bfloat16(static_cast<float>(v));
      break;
    case WIA_FLOAT32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); break;
    case WIA_FLOAT64: reinterpret_cast<double*>(p)[i] = v; break;
    default: break;
  }
}

}  // namespace wia::kernels
