// SPDX-License-Identifier: Apache-2.0
// Level 3: peer access between devices of the provider and IPC handles
// between processes.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"

namespace wia::conformance {
namespace {

void peer_query(Context& c) {
  const auto& o = c.dev_ops();
  const int n = c.device_count();
  std::vector<std::vector<int>> can(n, std::vector<int>(n, 0));
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      std::int32_t v = -1, again = -1;
      const std::string call =
          "can_access_peer(" + std::to_string(a) + ", " + std::to_string(b) + ")";
      c.step(call);
      c.ok(o.can_access_peer(c.ctx(), a, b, &v), call);
      c.ok(o.can_access_peer(c.ctx(), a, b, &again), call + " (again)");
      c.expect(v == 0 || v == 1, call + " answers 0 or 1", std::to_string(v));
      c.expect(v == again, call + " gives the same answer twice",
               std::to_string(v) + " then " + std::to_string(again));
      c.expect(v == 0 || c.has_cap(WIA_DEVICE_CAP_PEER), call + " == 0 without WIA_DEVICE_CAP_PEER",
               "1");
      can[a][b] = v;
    }
  }
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      c.expect(can[a][b] == can[b][a],
               "peer access symmetric between devices " + std::to_string(a) + " and " +
                   std::to_string(b),
               std::to_string(a) + "->" + std::to_string(b) + " = " + std::to_string(can[a][b]) +
                   ", " + std::to_string(b) + "->" + std::to_string(a) + " = " +
                   std::to_string(can[b][a]));
  // A peer out of range is an error, not an answer.
  std::int32_t v = 0;
  c.step("can_access_peer(0, device_count)");
  const wia_status_t st = n > 0 ? o.can_access_peer(c.ctx(), 0, n, &v) : WIA_ERROR_INVALID_DEVICE;
  c.take_error();
  c.expect(st < 0, "can_access_peer with a peer out of range to fail", status_text(st));
}

// Copies device `from` -> device `to` with memcpy_peer_async on a stream of
// `stream_dev`, at odd offsets, and checks the bytes.
void peer_copy(Context& c, int from, int to, int stream_dev, std::uint32_t seed) {
  const auto& o = c.dev_ops();
  const std::uint64_t size = (1ull << 20) + 333;
  auto* src = static_cast<std::uint8_t*>(c.alloc(size + 8, from));
  auto* dst = static_cast<std::uint8_t*>(c.alloc(size + 8, to));
  std::vector<std::uint8_t> h(size);
  fill_pattern(h.data(), size, seed);
  c.to_device(src + 3, h.data(), size, from);
  c.step("memset(0)");
  c.ok(o.memset(c.ctx(), to, dst, 0, size + 8), "memset(0)");
  auto s = c.stream(stream_dev);
  const std::string what = "memcpy_peer_async(device " + std::to_string(from) + " -> device " +
                           std::to_string(to) + ", stream of device " + std::to_string(stream_dev) +
                           ")";
  c.step(what);
  c.ok(o.memcpy_peer_async(c.ctx(), s, dst + 5, to, src + 3, from, size), what);
  c.sync(s);
  std::fill(h.begin(), h.end(), 0);
  c.to_host(h.data(), dst + 5, size, to);
  const std::string bad = check_pattern(h.data(), size, seed);
  c.expect(bad.empty(), what + " of " + size_text(size) + " intact", bad);
}

void peer_memcpy(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_PEER, "WIA_DEVICE_CAP_PEER");
  c.require_devices(2);
  const auto& o = c.dev_ops();
  for (const auto& [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {
    std::int32_t can = 0;
    c.ok(o.can_access_peer(c.ctx(), a, b, &can), "can_access_peer");
    if (can == 1) {
      const std::string call =
          "enable_peer_access(" + std::to_string(a) + ", " + std::to_string(b) + ")";
      c.ok(o.enable_peer_access(c.ctx(), a, b), call);
      c.ok(o.enable_peer_access(c.ctx(), a, b), call + " a second time (idempotent)");
    }
  }
  // memcpy_peer_async works whatever can_access_peer says: without direct
  // access the provider stages the copy itself.
  peer_copy(c, 0, 1, 0, 61);
  peer_copy(c, 1, 0, 0, 62);
  peer_copy(c, 0, 1, 1, 63);
}

bool read_all(int fd, void* buf, std::size_t size) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}
bool write_all(int fd, const void* buf, std::size_t size) {
  const auto* p = static_cast<const char*>(buf);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

constexpr std::uint64_t kIpcSize = (1ull << 20) + 17;
constexpr std::uint32_t kIpcSeed = 71, kReplySeed = 72;

// The importing process: its own init (forked before the exporter's init,
// so no provider threads or locks are inherited), opens the handle, checks
// the exporter's pattern, writes the reply pattern into the second half.
// Returns "" or what went wrong.
std::string ipc_importer(const wia_provider_v1_t& desc, const Options& opts, int dev, int in_fd) {
  Context c(opts, &desc, -1);
  try {
    c.init();
    wia_ipc_handle_t handle;
    if (!read_all(in_fd, &handle, sizeof(handle))) return "no handle from the exporting process";
    const auto& o = c.dev_ops();
    void* p = nullptr;
    const wia_status_t st = o.ipc_open_handle(c.ctx(), dev, &handle, &p);
    if (st != WIA_SUCCESS)
      return "ipc_open_handle in the child returned " + status_text(st) + ": " + c.take_error();
    // The halves differ by one byte (odd size): size for the larger.
    std::vector<std::uint8_t> h(kIpcSize - kIpcSize / 2);
    c.to_host(h.data(), p, kIpcSize / 2, dev);
    std::string bad = check_pattern(h.data(), kIpcSize / 2, kIpcSeed);
    if (!bad.empty()) return "the child read the exporter's buffer wrongly: " + bad;
    fill_pattern(h.data(), kIpcSize - kIpcSize / 2, kReplySeed);
    c.to_device(static_cast<std::uint8_t*>(p) + kIpcSize / 2, h.data(), kIpcSize - kIpcSize / 2,
                dev);
    c.ok(o.ipc_close_handle(c.ctx(), dev, p), "ipc_close_handle in the child");
    c.finish();
  } catch (const std::exception& e) {
    return std::string("in the child: ") + e.what();
  }
  return {};
}

void ipc_roundtrip(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_IPC, "WIA_DEVICE_CAP_IPC");
  const int dev = c.options().device;
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) c.fail("pipe: " + std::string(strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) c.fail("fork: " + std::string(strerror(errno)));
  if (pid == 0) {
    close(to_child[1]);
    close(from_child[0]);
    const std::string err = ipc_importer(c.desc(), c.options(), dev, to_child[0]);
    const std::uint32_t len = static_cast<std::uint32_t>(err.size());
    write_all(from_child[1], &len, sizeof(len));
    write_all(from_child[1], err.data(), err.size());
    _exit(0);
  }
  close(to_child[0]);
  close(from_child[1]);
  // Under Yama ptrace_scope 1 only an ancestor may take our descriptors
  // (pidfd_getfd and friends); allow the importer explicitly. Harmless
  // (EINVAL) without Yama.
  prctl(PR_SET_PTRACER, pid, 0, 0, 0);

  c.device();
  auto* d = static_cast<std::uint8_t*>(c.alloc(kIpcSize, dev));
  std::vector<std::uint8_t> h(kIpcSize);
  fill_pattern(h.data(), kIpcSize / 2, kIpcSeed);
  std::memset(h.data() + kIpcSize / 2, 0, kIpcSize - kIpcSize / 2);
  c.to_device(d, h.data(), kIpcSize, dev);
  wia_ipc_handle_t handle{};
  c.step("ipc_get_handle");
  c.ok(c.dev_ops().ipc_get_handle(c.ctx(), dev, d, &handle), "ipc_get_handle");
  c.step("waiting for the importing child");
  if (!write_all(to_child[1], &handle, sizeof(handle))) c.fail("the importing child went away");
  close(to_child[1]);
  std::uint32_t len = 0;
  std::string err;
  if (!read_all(from_child[0], &len, sizeof(len))) {
    err = "the importing child ended without a reply";
  } else {
    err.resize(len);
    if (len > 0 && !read_all(from_child[0], err.data(), len)) err = "truncated reply";
  }
  close(from_child[0]);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (err.empty() && WIFSIGNALED(wstatus))
    err = "the importing child crashed: signal " + std::to_string(WTERMSIG(wstatus));
  c.expect(err.empty(), "a forked child opens the IPC handle and sees the exporter's bytes", err);
  c.to_host(h.data(), d, kIpcSize, dev);
  const std::string bad =
      check_pattern(h.data() + kIpcSize / 2, kIpcSize - kIpcSize / 2, kReplySeed);
  c.expect(bad.empty(), "the child's reply written through the handle visible to the exporter",
           bad);
}

// A dma-buf of device memory (CAP_DMABUF): what a NIC registers. An
// interior pointer of an allocation exports, the returned range lies
// inside the dma-buf, the descriptor is the caller's to close; a pointer
// not from mem_alloc and a range past the allocation are refused. A device
// that says NOT_SUPPORTED (its driver or kernel cannot export) is a skip.
void dmabuf_export(Context& c) {
  c.require_cap(WIA_DEVICE_CAP_DMABUF, "WIA_DEVICE_CAP_DMABUF");
  const int dev = c.device();
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t size = 3 * page + 100, at = page + 100, len = 1000;
  auto* d = static_cast<std::uint8_t*>(c.alloc(size, dev));
  std::int32_t fd = -1;
  std::uint64_t offset = 0;
  c.step("mem_export_dmabuf(allocation + " + std::to_string(at) + ", " + std::to_string(len) + ")");
  const wia_status_t st = c.dev_ops().mem_export_dmabuf(c.ctx(), dev, d + at, len, &fd, &offset);
  if (st == WIA_ERROR_NOT_SUPPORTED) throw Skip("device cannot export a dma-buf: " + c.take_error());
  c.ok(st, "mem_export_dmabuf");
  c.expect(fd >= 0, "a file descriptor", std::to_string(fd));
  const off_t end = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
  c.expect(end > 0 && offset + len <= static_cast<std::uint64_t>(end),
           "[offset, offset + size) inside the dma-buf",
           "offset " + std::to_string(offset) + ", dma-buf of " + std::to_string(end) + " bytes");
  c.expect(offset % page == (reinterpret_cast<std::uintptr_t>(d + at)) % page,
           "offset at the pointer's place in its page (page-aligned export)",
           "offset " + std::to_string(offset));
  if (fd >= 0) close(fd);
  // Memory the provider did not allocate, and a range past the allocation.
  std::uint8_t host_bytes[64];
  c.step("mem_export_dmabuf(host memory)");
  const wia_status_t bad_ptr =
      c.dev_ops().mem_export_dmabuf(c.ctx(), dev, host_bytes, sizeof host_bytes, &fd, &offset);
  c.take_error();
  c.expect(bad_ptr < 0, "mem_export_dmabuf of memory not from mem_alloc to fail",
           status_text(bad_ptr));
  if (bad_ptr == WIA_SUCCESS && fd >= 0) close(fd);
  c.step("mem_export_dmabuf(past the allocation)");
  const wia_status_t past =
      c.dev_ops().mem_export_dmabuf(c.ctx(), dev, d + at, size - at + 1, &fd, &offset);
  c.take_error();
  c.expect(past < 0, "mem_export_dmabuf of a range past the allocation to fail",
           status_text(past));
  if (past == WIA_SUCCESS && fd >= 0) close(fd);
}

}  // namespace

void register_l3_tests() {
  auto add = [](const char* id, int timeout_ms, const char* what, void (*fn)(Context&)) {
    registry().push_back({id, 3, timeout_ms, what, fn, {}});
  };
  add("L3.peer.query", 10000, "can_access_peer answers 0/1, stable, symmetric; bad peer fails",
      peer_query);
  add("L3.peer.memcpy", 20000, "memcpy_peer_async between devices 0 and 1 both ways (CAP_PEER)",
      peer_memcpy);
  add("L3.ipc.roundtrip", 20000, "IPC handle opened in a forked child, pattern and reply (CAP_IPC)",
      ipc_roundtrip);
  add("L3.dmabuf.export", 10000,
      "mem_export_dmabuf of an interior pointer: a descriptor, the range inside it; bad "
      "pointers refused (CAP_DMABUF)",
      dmabuf_export);
}

}  // namespace wia::conformance
