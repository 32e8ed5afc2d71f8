// SPDX-License-Identifier: Apache-2.0
#include "wia_common/ipc_header.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace wia::common {

void ipc_pack(wia_ipc_handle_t* out, std::uint32_t magic, std::int32_t device, std::uint64_t size,
              const void* vendor, std::size_t vendor_size) noexcept {
  if (vendor_size > kIpcVendorMax) vendor_size = kIpcVendorMax;  // callers static_assert it fits
  IpcHeader h{};
  h.magic = magic;
  h.version = kIpcHeaderVersion;
  h.header_size = static_cast<std::uint16_t>(sizeof(IpcHeader) + vendor_size);
  h.exporter_pid = static_cast<std::uint32_t>(::getpid());
  h.exporter_device = device;
  h.size = size;
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->bytes, &h, sizeof(h));
  std::memcpy(out->bytes + sizeof(h), vendor, vendor_size);
}

std::string ipc_unpack(const wia_ipc_handle_t& in, std::uint32_t magic, const char* provider,
                       IpcHeader* header, void* vendor, std::size_t vendor_size) {
  IpcHeader h;
  std::memcpy(&h, in.bytes, sizeof(h));
  char text[256];
  if (vendor_size > kIpcVendorMax || h.magic != magic ||
      h.header_size != sizeof(IpcHeader) + vendor_size) {
    std::snprintf(text, sizeof(text), "not a %s provider IPC handle (magic 0x%08x)", provider,
                  h.magic);
    return text;
  }
  if (h.version != kIpcHeaderVersion) {
    std::snprintf(text, sizeof(text), "IPC handle version %u, this provider reads version %u",
                  h.version, kIpcHeaderVersion);
    return text;
  }
  if (h.exporter_pid == static_cast<std::uint32_t>(::getpid()))
    return "the handle was exported by this process (IPC handles are opened in other "
           "processes; use the pointer itself)";
  *header = h;
  std::memcpy(vendor, in.bytes + sizeof(h), vendor_size);
  return {};
}

}  // namespace wia::common
