// SPDX-License-Identifier: Apache-2.0
// What the accelerator providers (cuda, hip, ze) share from providers/common:
// the IPC handle header, the message of a failed vendor call and opening the
// first of a list of libraries.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstring>
#include <string>

#include "wia_common/host_messages.hpp"
#include "wia_common/ipc_header.hpp"
#include "wia_common/vendor_library.hpp"

namespace {

using wia::common::ipc_pack;
using wia::common::ipc_unpack;
using wia::common::IpcHeader;

constexpr std::uint32_t kMagic = 0x54534554u;  // "TEST"

struct Vendor {
  unsigned char bytes[64];
};

Vendor pattern() {
  Vendor v{};
  for (int i = 0; i < 64; ++i) v.bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  return v;
}

// Runs ipc_unpack in a child process (handles are for other processes) and
// returns its refusal text, or "OK <size> <device> <vendor bytes equal>".
std::string unpack_in_child(const wia_ipc_handle_t& h, std::uint32_t magic) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    IpcHeader header{};
    Vendor v{};
    std::string out = ipc_unpack(h, magic, "test", &header, &v, sizeof(v));
    if (out.empty()) {
      const Vendor want = pattern();
      out = "OK " + std::to_string(header.size) + " " + std::to_string(header.exporter_device) +
            " " + (std::memcmp(&v, &want, sizeof(v)) == 0 ? "same" : "different");
    }
    const ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;)
    got.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  return got;
}

std::string last_error;
void set_error(void*, const char* message) { last_error = message; }

void vendor_error(const wia_host_services_v1_t* host, std::int32_t dev, const char* name,
                  const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  wia::common::host_vendor_error(host, dev, name, "VENDOR_ERROR_X", fmt, ap);
  va_end(ap);
}

}  // namespace

TEST_CASE("an IPC handle packed here opens in another process with its size, device and bytes") {
  const Vendor v = pattern();
  wia_ipc_handle_t h{};
  ipc_pack(&h, kMagic, 3, 123456789, &v, sizeof(v));
  CHECK(unpack_in_child(h, kMagic) == "OK 123456789 3 same");
}

TEST_CASE(
    "IPC handles of this process, of another provider, torn or of another version are refused") {
  const Vendor v = pattern();
  wia_ipc_handle_t h{};
  ipc_pack(&h, kMagic, 0, 4096, &v, sizeof(v));
  IpcHeader header{};
  Vendor out{};
  CHECK(
      ipc_unpack(h, kMagic, "test", &header, &out, sizeof(out)).find("exported by this process") !=
      std::string::npos);
  CHECK(unpack_in_child(h, kMagic + 1) == "not a test provider IPC handle (magic 0x54534554)");
  wia_ipc_handle_t torn = h;
  torn.bytes[6] ^= 0x01;  // header size
  CHECK(unpack_in_child(torn, kMagic).find("not a test provider IPC handle") == 0);
  wia_ipc_handle_t newer = h;
  newer.bytes[4] = 2;  // version
  CHECK(unpack_in_child(newer, kMagic) == "IPC handle version 2, this provider reads version 1");
}

TEST_CASE("a failed vendor call names the call, the device and the vendor's error") {
  wia_host_services_v1_t host{};
  host.struct_size = sizeof(host);
  host.set_error = set_error;
  vendor_error(&host, 1, "Fake Device 1", "vendorAlloc(%d bytes)", 64);
  CHECK(last_error == "vendorAlloc(64 bytes) on device 1 (Fake Device 1): VENDOR_ERROR_X");
  vendor_error(&host, -1, nullptr, "vendorInit");
  CHECK(last_error == "vendorInit: VENDOR_ERROR_X");
}

TEST_CASE("open_first_library opens the first name dlopen finds and says why the others failed") {
  const auto none =
      wia::common::open_first_library({"/nonexistent/liba.so", "/nonexistent/libb.so"}, 0);
  CHECK(none.handle == nullptr);
  CHECK(none.tried.find("/nonexistent/liba.so: ") == 0);
  CHECK(none.tried.find("; /nonexistent/libb.so: ") != std::string::npos);
  const auto libc = wia::common::open_first_library({"/nonexistent/liba.so", "libc.so.6"}, 0);
  REQUIRE(libc.handle != nullptr);
  CHECK(libc.name == "libc.so.6");
  CHECK(libc.tried.find("/nonexistent/liba.so") == 0);
}
