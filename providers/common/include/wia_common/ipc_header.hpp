// SPDX-License-Identifier: Apache-2.0
// The IPC handle of the accelerator providers (cuda, hip, ze): a small
// header in front of the vendor's own handle bytes, inside the ABI's
// 128-byte wia_ipc_handle_t (all little-endian, as the node is). The header
// lets ipc_open_handle refuse a handle of another provider, of another
// layout version, a torn copy or one of its own process with a message,
// instead of failing inside the vendor library. Each provider has its own
// magic; the vendor part is opaque here.
#pragma once

#include <wia/provider.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace wia::common {

struct IpcHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t header_size;     // header + vendor bytes, as the exporter wrote them
  std::uint32_t exporter_pid;    // vendors open handles in other processes only
  std::int32_t exporter_device;  // provider-local ordinal in the exporting process
  std::uint64_t size;            // bytes of the allocation, as mem_alloc was asked
};
static_assert(sizeof(IpcHeader) == 24, "the header's layout is part of the handle");

constexpr std::uint16_t kIpcHeaderVersion = 1;
constexpr std::size_t kIpcVendorMax = WIA_IPC_HANDLE_SIZE - sizeof(IpcHeader);

// Writes header (this process, version 1) and `vendor_size` vendor bytes;
// the rest of the handle is zero.
void ipc_pack(wia_ipc_handle_t* out, std::uint32_t magic, std::int32_t device, std::uint64_t size,
              const void* vendor, std::size_t vendor_size) noexcept;

// Reads a handle packed by ipc_pack with `magic` and `vendor_size`: fills
// `header` and `vendor` and returns an empty string, or returns why the
// handle is refused ("not a <provider> provider IPC handle (magic ...)",
// version, or exported by this process). `provider` names the provider in
// that text.
std::string ipc_unpack(const wia_ipc_handle_t& in, std::uint32_t magic, const char* provider,
                       IpcHeader* header, void* vendor, std::size_t vendor_size);

}  // namespace wia::common
