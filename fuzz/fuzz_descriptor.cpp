// SPDX-License-Identifier: Apache-2.0
// fuzz_descriptor: the wia_provider_v1 descriptor a provider exports
// (plugin_api/include/wia/provider.h), through the loader's ABI v1 adapter
// (provider_abi::adapt_v1, which the conformance suite's L0 checks mirror)
// and then Config::declare_provider for the parameters it declares, as the
// loader does before init().
//
// The harness builds the descriptor field by field from the input, as a
// broken or hostile provider could lay it out: any struct_size and
// abi_version, an object shorter than it claims (the ELF symbol size tells
// the truth), names and versions of any bytes, tables of any claimed size
// whose entries are NULL or not, and parameter arrays of any stride.
//
// Invariants beyond "no crash":
//  - the adapter reads nothing outside the objects it is given (ASan: each
//    object is allocated at exactly its size);
//  - an accepted descriptor is usable: a valid name, init and fini set, a
//    table for each capability claimed and every required entry set;
//    a refused one has a reason;
//  - a parameter declaration is accepted or refused with
//    WIA_ERROR_INVALID_ARGUMENT, and each accepted key then has a value.
#include <memory>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "provider/abi.hpp"

namespace {

namespace abi = wia::provider_abi;
using wia::fuzz::check;

extern "C" wia_status_t dummy_init(const wia_host_services_v1_t*, void**) { return WIA_SUCCESS; }
extern "C" wia_status_t dummy_fini(void*) { return WIA_SUCCESS; }
void dummy_entry() {}

// Owns every object the descriptor points at.
struct Arena {
  std::vector<std::unique_ptr<char[]>> blocks;
  char* alloc(std::size_t n) {
    blocks.push_back(std::make_unique<char[]>(n));
    std::memset(blocks.back().get(), 0, n);
    return blocks.back().get();
  }
  const char* text(wia::fuzz::Bytes& in) {
    const auto bytes = in.take(in.u8() % 80);
    char* s = alloc(bytes.size() + 1);
    std::memcpy(s, bytes.data(), bytes.size());
    return s;
  }
  // NULL, a string, or (for keys) one of the names providers really use.
  const char* maybe_text(wia::fuzz::Bytes& in) {
    switch (in.u8() % 4) {
      case 0:
        return nullptr;
      default:
        return text(in);
    }
  }
};

// A table (device or transport) of the claimed size: the leading
// struct_size and abi_version, then 8-byte slots that are zero, a function
// pointer, or raw input (caps and must_understand words live there too).
const void* table(wia::fuzz::Bytes& in, Arena& arena) {
  const std::uint32_t claimed = in.u16();  // up to 64 KiB: the adapter's bound
  const std::uint32_t abi_version = in.u8() % 3;
  const std::size_t bytes = std::max<std::size_t>(claimed, 8);
  char* t = arena.alloc(bytes);
  std::memcpy(t, &claimed, 4);
  std::memcpy(t + 4, &abi_version, 4);
  const std::uint8_t fill = in.u8();  // the default slot kind for the slots past the input
  for (std::size_t off = 8; off + 8 <= bytes; off += 8) {
    const std::uint8_t kind = in.remaining() > 0 ? in.u8() : fill;
    std::uint64_t v = 0;
    if (kind % 3 == 1) {
      void (*fn)() = &dummy_entry;
      std::memcpy(&v, &fn, 8);
    } else if (kind % 3 == 2) {
      v = in.u64();
    }
    std::memcpy(t + off, &v, 8);
  }
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  wia::fuzz::Bytes in(data, size);
  Arena arena;
  wia_provider_v1_t d{};
  d.struct_size = in.u8() % 2 ? sizeof(d) : in.u16();
  d.abi_version = in.u8() % 4;
  const std::uint8_t nulls = in.u8();
  d.name = (nulls & 1) ? nullptr : arena.text(in);
  d.version = (nulls & 2) ? nullptr : arena.text(in);
  d.caps = in.u8() & 0x7;
  d.host_services_version = in.u8() % 3;
  if (!(nulls & 4)) d.init = &dummy_init;
  if (!(nulls & 8)) d.fini = &dummy_fini;
  if (nulls & 16) d.device = static_cast<const wia_device_ops_v1_t*>(table(in, arena));
  if (nulls & 32) d.transport = static_cast<const wia_transport_ops_v1_t*>(table(in, arena));
  if (nulls & 64) {
    d.num_params = in.u8() % 8;
    const std::uint32_t stride = (in.u8() % 2) ? sizeof(wia_param_decl_v1_t) : in.u8();
    char* params = arena.alloc(std::max<std::size_t>(std::size_t{stride} * d.num_params, 8));
    for (std::uint32_t i = 0; i < d.num_params && stride >= 4; ++i) {
      char* e = params + std::size_t{i} * stride;
      wia_param_decl_v1_t p{};
      // params[0].struct_size is the stride the core steps by, so it must
      // be the array's real one (a provider that lies there hands over an
      // object the core cannot bound); later elements may say anything.
      p.struct_size = (i == 0 || in.u8() % 8) ? stride : in.u32();
      p.type = static_cast<wia_param_type_t>(in.u8() % 5);
      p.key = arena.maybe_text(in);
      p.default_value = arena.maybe_text(in);
      p.description = arena.maybe_text(in);
      p.min_value = static_cast<std::int64_t>(in.u64());
      p.max_value = static_cast<std::int64_t>(in.u64());
      std::memcpy(e, &p, std::min<std::size_t>(stride, sizeof(p)));
    }
    d.params = reinterpret_cast<const wia_param_decl_v1_t*>(params);
  }
  // The exported object: its real (ELF) size, which may be shorter than
  // struct_size claims.
  const std::size_t object_size =
      (nulls & 128) ? sizeof(d) : std::max<std::size_t>(8, in.u8() % (sizeof(d) + 1));
  char* object = arena.alloc(object_size);
  std::memcpy(object, &d, std::min(object_size, sizeof(d)));

  abi::Descriptor out;
  const std::string why = abi::adapt_v1({object, object_size}, &out);
  if (!why.empty()) return 0;
  check(abi::valid_provider_name(out.name), "accepted an invalid name '" + out.name + "'");
  check(out.init != nullptr && out.fini != nullptr, "accepted without init or fini");
  check(((out.caps & WIA_PROVIDER_CAP_DEVICE) != 0) == out.device.has_value(),
        "device capability and table disagree");
  check(((out.caps & WIA_PROVIDER_CAP_TRANSPORT) != 0) == out.transport.has_value(),
        "transport capability and table disagree");
  if (out.device) check(out.device->device_count != nullptr, "device table without device_count");
  if (out.transport) check(out.transport->isend != nullptr, "transport table without isend");

  wia::Config config;
  try {
    config.declare_provider(out.name, out.params);
  } catch (const wia::Error& e) {
    wia::fuzz::check_rejection(e, WIA_ERROR_INVALID_ARGUMENT, "declare_provider");
    return 0;
  }
  for (const auto& p : out.params)
    check(config.provider_param(out.name, p.key) != nullptr,
          std::string("declared key '") + p.key + "' has no value");
  return 0;
}
