// SPDX-License-Identifier: Apache-2.0
// ABI v1 adapter: validates a wia_provider_v1 descriptor and copies it into
// the core's Descriptor. Every rule of provider.h that the loader can check
// without calling the provider is checked here, so a broken provider is
// refused with a message naming the defect instead of crashing later on a
// NULL entry or a struct read past its end.
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "provider/abi.hpp"

namespace wia::provider_abi {

namespace {

constexpr std::uint32_t kVersion = 1;

// Offset one past `field`: the smallest struct_size that contains it.
#define WIA_END_OF(type, field) (offsetof(type, field) + sizeof(type::field))

// The size of each struct as first released. A provider built against any
// v1 header is at least this long; a shorter struct_size is a corrupt or
// pre-release descriptor. These stay fixed when fields are appended later.
constexpr std::size_t kDescriptorMinSize = WIA_END_OF(wia_provider_v1_t, transport);
constexpr std::size_t kDeviceOpsMinSize = WIA_END_OF(wia_device_ops_v1_t, reduce_async);
constexpr std::size_t kTransportOpsMinSize = WIA_END_OF(wia_transport_ops_v1_t, get);
constexpr std::size_t kParamDeclMinSize = WIA_END_OF(wia_param_decl_v1_t, max_value);

// Larger sizes than these are not growth but garbage (an uninitialised
// field or a pointer mistaken for a size); refusing them keeps the copy
// below from reading far past the object.
constexpr std::uint32_t kMaxTableSize = 64 * 1024;
constexpr std::uint32_t kMaxParams = 1024;

// One function-pointer entry of a table. `cap` == 0 means required.
struct Entry {
  const char* name;
  std::size_t offset;
  std::uint64_t cap;
  const char* cap_name;
};

#define WIA_REQUIRED(type, field) \
  Entry { #field, offsetof(type, field), 0, nullptr }
#define WIA_OPTIONAL(type, field, cap) \
  Entry { #field, offsetof(type, field), cap, #cap }

constexpr Entry kDeviceEntries[] = {
    WIA_REQUIRED(wia_device_ops_v1_t, device_count),
    WIA_REQUIRED(wia_device_ops_v1_t, device_props),
    WIA_REQUIRED(wia_device_ops_v1_t, mem_alloc),
    WIA_REQUIRED(wia_device_ops_v1_t, mem_free),
    WIA_REQUIRED(wia_device_ops_v1_t, memset),
    WIA_REQUIRED(wia_device_ops_v1_t, memcpy),
    WIA_REQUIRED(wia_device_ops_v1_t, stream_create),
    WIA_REQUIRED(wia_device_ops_v1_t, stream_destroy),
    WIA_REQUIRED(wia_device_ops_v1_t, stream_synchronize),
    WIA_REQUIRED(wia_device_ops_v1_t, stream_query),
    WIA_REQUIRED(wia_device_ops_v1_t, memset_async),
    WIA_REQUIRED(wia_device_ops_v1_t, memcpy_async),
    WIA_REQUIRED(wia_device_ops_v1_t, event_create),
    WIA_REQUIRED(wia_device_ops_v1_t, event_destroy),
    WIA_REQUIRED(wia_device_ops_v1_t, event_record),
    WIA_REQUIRED(wia_device_ops_v1_t, event_query),
    WIA_REQUIRED(wia_device_ops_v1_t, event_synchronize),
    WIA_REQUIRED(wia_device_ops_v1_t, stream_wait_event),
    // provider.h: peer queries are required even without WIA_DEVICE_CAP_PEER.
    WIA_REQUIRED(wia_device_ops_v1_t, can_access_peer),
    WIA_OPTIONAL(wia_device_ops_v1_t, event_elapsed_ms, WIA_DEVICE_CAP_EVENT_TIMING),
    WIA_OPTIONAL(wia_device_ops_v1_t, launch_host_func, WIA_DEVICE_CAP_HOST_FUNC),
    WIA_OPTIONAL(wia_device_ops_v1_t, enable_peer_access, WIA_DEVICE_CAP_PEER),
    WIA_OPTIONAL(wia_device_ops_v1_t, memcpy_peer_async, WIA_DEVICE_CAP_PEER),
    WIA_OPTIONAL(wia_device_ops_v1_t, ipc_get_handle, WIA_DEVICE_CAP_IPC),
    WIA_OPTIONAL(wia_device_ops_v1_t, ipc_open_handle, WIA_DEVICE_CAP_IPC),
    WIA_OPTIONAL(wia_device_ops_v1_t, ipc_close_handle, WIA_DEVICE_CAP_IPC),
    WIA_OPTIONAL(wia_device_ops_v1_t, reduce_async, WIA_DEVICE_CAP_REDUCE),
    // Appended entries: a shorter table reads them as NULL (padded_copy),
    // so a provider that sets the bit without the entry is refused here.
    WIA_OPTIONAL(wia_device_ops_v1_t, scale_async, WIA_DEVICE_CAP_SCALE),
    WIA_OPTIONAL(wia_device_ops_v1_t, module_load, WIA_DEVICE_CAP_KERNEL),
    WIA_OPTIONAL(wia_device_ops_v1_t, module_unload, WIA_DEVICE_CAP_KERNEL),
    WIA_OPTIONAL(wia_device_ops_v1_t, module_function, WIA_DEVICE_CAP_KERNEL),
    WIA_OPTIONAL(wia_device_ops_v1_t, launch_kernel, WIA_DEVICE_CAP_KERNEL),
    WIA_OPTIONAL(wia_device_ops_v1_t, mem_export_dmabuf, WIA_DEVICE_CAP_DMABUF),
};

constexpr Entry kTransportEntries[] = {
    WIA_REQUIRED(wia_transport_ops_v1_t, endpoint_count),
    WIA_REQUIRED(wia_transport_ops_v1_t, endpoint_props),
    WIA_REQUIRED(wia_transport_ops_v1_t, listen),
    WIA_REQUIRED(wia_transport_ops_v1_t, connect),
    WIA_REQUIRED(wia_transport_ops_v1_t, accept),
    WIA_REQUIRED(wia_transport_ops_v1_t, close_listener),
    WIA_REQUIRED(wia_transport_ops_v1_t, reg_mr),
    WIA_REQUIRED(wia_transport_ops_v1_t, dereg_mr),
    WIA_REQUIRED(wia_transport_ops_v1_t, isend),
    WIA_REQUIRED(wia_transport_ops_v1_t, irecv),
    WIA_REQUIRED(wia_transport_ops_v1_t, test),
    WIA_REQUIRED(wia_transport_ops_v1_t, close),
    WIA_OPTIONAL(wia_transport_ops_v1_t, mr_rkey, WIA_TRANSPORT_CAP_RMA),
    WIA_OPTIONAL(wia_transport_ops_v1_t, put, WIA_TRANSPORT_CAP_RMA),
    WIA_OPTIONAL(wia_transport_ops_v1_t, get, WIA_TRANSPORT_CAP_RMA),
    WIA_OPTIONAL(wia_transport_ops_v1_t, send_inline, WIA_TRANSPORT_CAP_INLINE),
    WIA_OPTIONAL(wia_transport_ops_v1_t, recv_inline, WIA_TRANSPORT_CAP_INLINE),
    WIA_OPTIONAL(wia_transport_ops_v1_t, wait_fds, WIA_TRANSPORT_CAP_WAIT_FD),
};

#undef WIA_REQUIRED
#undef WIA_OPTIONAL

// A provider string for a message: bounded and with control bytes escaped,
// because a broken descriptor may point at anything.
std::string printable(const char* text, std::size_t max = 64) {
  std::string out;
  for (std::size_t i = 0; text[i] != '\0'; ++i) {
    if (i == max) return out + "...";
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

// Copies a table of `Table` type whose provider-side size is `size` into a
// zeroed struct of ours: fields the provider did not have read as zero.
template <typename Table>
Table padded_copy(const void* source, std::size_t size) {
  Table table;
  std::memset(&table, 0, sizeof(table));
  std::memcpy(&table, source, size < sizeof(table) ? size : sizeof(table));
  return table;
}

bool entry_is_null(const void* table, const Entry& entry) {
  void (*fn)() = nullptr;
  std::memcpy(&fn, static_cast<const char*>(table) + entry.offset, sizeof(fn));
  return fn == nullptr;
}

// "Must understand" bits this core honours, per table. A table setting any
// other bit asks for semantics this core would silently violate (e.g.
// posting receives out of order), so it is refused instead.
constexpr std::uint64_t kDeviceMustUnderstand = 0;
constexpr std::uint64_t kTransportMustUnderstand = WIA_TRANSPORT_REQ_ORDERED_RECV;

// Size, version and entry checks shared by the device and transport
// tables. Returns the refusal reason or "".
template <typename Table, std::size_t N>
std::string check_table(const char* what, const Table* source, std::size_t min_size,
                        std::uint64_t known_must_understand, const Entry (&entries)[N],
                        std::optional<Table>* out) {
  // struct_size and abi_version lead every table (provider.h), so they are
  // safe to read before the size is known.
  if (source->struct_size < min_size)
    return fmt::format("{} table: struct_size is {} bytes, smaller than the {} bytes of a v1 table",
                       what, source->struct_size, min_size);
  if (source->struct_size > kMaxTableSize)
    return fmt::format("{} table: struct_size {} is not plausible (more than {} bytes)", what,
                       source->struct_size, kMaxTableSize);
  if (source->abi_version != kVersion)
    return fmt::format("{} table: abi_version is {}, expected {}", what, source->abi_version,
                       kVersion);
  Table table = padded_copy<Table>(source, source->struct_size);
  if (const std::uint64_t unknown = table.must_understand & ~known_must_understand; unknown != 0)
    return fmt::format("{} table: must_understand has bit(s) {:#x} this libwia does not know", what,
                       unknown);
  for (const Entry& entry : entries) {
    if (!entry_is_null(&table, entry)) continue;
    if (entry.cap == 0)
      return fmt::format("{} table: required entry '{}' is NULL", what, entry.name);
    if ((table.caps & entry.cap) != 0)
      return fmt::format("{} table: optional entry '{}' is NULL but {} is set in caps", what,
                         entry.name, entry.cap_name);
  }
  *out = table;
  return {};
}

std::string check_params(const wia_provider_v1_t& d, Descriptor* out) {
  if (d.num_params == 0) return {};
  if (d.params == nullptr) return fmt::format("num_params is {} but params is NULL", d.num_params);
  if (d.num_params > kMaxParams)
    return fmt::format("num_params {} is not plausible (more than {})", d.num_params, kMaxParams);
  // The array stride is the provider's sizeof(wia_param_decl_v1_t), which
  // each element states in struct_size; it may differ from ours once the
  // struct grows, so index by bytes, never by our element type.
  const std::uint32_t stride = d.params[0].struct_size;
  if (stride < kParamDeclMinSize || stride > kMaxTableSize)
    return fmt::format("params[0]: struct_size {} is not a v1 parameter declaration (at least {})",
                       stride, kParamDeclMinSize);
  // The elements are read in place as wia_param_decl_v1_t: a stride that is
  // not a multiple of its alignment would misalign every element after the
  // first (undefined behaviour; a fault where alignment is enforced). No C
  // compiler lays out an array that way, so only a corrupt table has one
  // (found by fuzz_descriptor).
  if (stride % alignof(wia_param_decl_v1_t) != 0)
    return fmt::format(
        "params[0]: struct_size {} is not a multiple of {}, so the array's elements would be "
        "misaligned",
        stride, alignof(wia_param_decl_v1_t));
  const auto* base = reinterpret_cast<const char*>(d.params);
  std::vector<wia_param_decl_v1_t> params;
  params.reserve(d.num_params);
  for (std::uint32_t i = 0; i < d.num_params; ++i) {
    const auto* element =
        reinterpret_cast<const wia_param_decl_v1_t*>(base + std::size_t{i} * stride);
    if (element->struct_size != stride)
      return fmt::format("params[{}]: struct_size {} differs from params[0] ({})", i,
                         element->struct_size, stride);
    // Keys, types, ranges and defaults are checked by
    // Config::declare_provider(), which applies the same rules to core
    // keys; only the layout is this adapter's business.
    wia_param_decl_v1_t decl = padded_copy<wia_param_decl_v1_t>(element, stride);
    decl.struct_size = sizeof(decl);
    params.push_back(decl);
  }
  out->params = std::move(params);
  return {};
}

}  // namespace

std::string adapt_v1(const SymbolInfo& symbol, Descriptor* out) {
  constexpr std::size_t kHeader = WIA_END_OF(wia_provider_v1_t, abi_version);
  if (symbol.size != 0 && symbol.size < kHeader)
    return fmt::format("{} is a {}-byte object, too small to be a provider descriptor",
                       WIA_PROVIDER_SYMBOL_V1, symbol.size);
  // Only the two leading fields are common to every version: read them
  // first and decide from them whether the rest may be read at all.
  std::uint32_t struct_size = 0;
  std::uint32_t abi_version = 0;
  std::memcpy(&struct_size, symbol.address, sizeof(struct_size));
  std::memcpy(&abi_version,
              static_cast<const char*>(symbol.address) + offsetof(wia_provider_v1_t, abi_version),
              sizeof(abi_version));
  out->abi_version = abi_version;
  if (abi_version > WIA_PROVIDER_ABI_VERSION)
    return fmt::format("built for provider ABI v{}, this libwia supports up to v{}", abi_version,
                       WIA_PROVIDER_ABI_VERSION);
  if (abi_version != kVersion)
    return fmt::format("{} announces abi_version {}, expected {}", WIA_PROVIDER_SYMBOL_V1,
                       abi_version, kVersion);
  if (struct_size < kDescriptorMinSize)
    return fmt::format(
        "descriptor struct_size is {} bytes, smaller than the {} bytes of a v1 descriptor",
        struct_size, kDescriptorMinSize);
  if (symbol.size != 0 && struct_size > symbol.size)
    return fmt::format("descriptor struct_size {} exceeds the {}-byte {} object", struct_size,
                       symbol.size, WIA_PROVIDER_SYMBOL_V1);
  if (struct_size > kMaxTableSize)
    return fmt::format("descriptor struct_size {} is not plausible (more than {} bytes)",
                       struct_size, kMaxTableSize);

  const auto d = padded_copy<wia_provider_v1_t>(symbol.address, struct_size);
  out->caps = d.caps;
  out->host_services_version = d.host_services_version;
  if (d.version != nullptr) out->version = printable(d.version, 128);

  if (d.name == nullptr) return "descriptor name is NULL";
  const std::string name = d.name;
  if (!valid_provider_name(name))
    return fmt::format(
        "descriptor name '{}' is not a valid provider name ([a-z0-9_]+, at most {} "
        "characters)",
        printable(d.name), kMaxNameLength);
  out->name = name;

  if (d.host_services_version > WIA_HOST_SERVICES_VERSION)
    return fmt::format("needs host services v{}, this libwia offers v{}", d.host_services_version,
                       WIA_HOST_SERVICES_VERSION);
  if (d.init == nullptr) return "descriptor: required entry 'init' is NULL";
  if (d.fini == nullptr) return "descriptor: required entry 'fini' is NULL";
  out->init = d.init;
  out->fini = d.fini;

  const bool has_device_cap = (d.caps & WIA_PROVIDER_CAP_DEVICE) != 0;
  const bool has_transport_cap = (d.caps & WIA_PROVIDER_CAP_TRANSPORT) != 0;
  if (has_device_cap && d.device == nullptr)
    return "caps has WIA_PROVIDER_CAP_DEVICE but the device table is NULL";
  if (!has_device_cap && d.device != nullptr)
    return "the device table is set but caps lacks WIA_PROVIDER_CAP_DEVICE";
  if (has_transport_cap && d.transport == nullptr)
    return "caps has WIA_PROVIDER_CAP_TRANSPORT but the transport table is NULL";
  if (!has_transport_cap && d.transport != nullptr)
    return "the transport table is set but caps lacks WIA_PROVIDER_CAP_TRANSPORT";
  if (!has_device_cap && !has_transport_cap)
    return "offers neither a device nor a transport interface (caps has neither "
           "WIA_PROVIDER_CAP_DEVICE nor WIA_PROVIDER_CAP_TRANSPORT)";

  std::string why;
  if (has_device_cap) {
    why = check_table("device", d.device, kDeviceOpsMinSize, kDeviceMustUnderstand, kDeviceEntries,
                      &out->device);
    if (!why.empty()) return why;
  }
  if (has_transport_cap) {
    why = check_table("transport", d.transport, kTransportOpsMinSize, kTransportMustUnderstand,
                      kTransportEntries, &out->transport);
    if (!why.empty()) return why;
  }
  return check_params(d, out);
}

}  // namespace wia::provider_abi
