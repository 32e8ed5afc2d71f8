// SPDX-License-Identifier: Apache-2.0
// libibverbs by dlopen, the device and port, the shared receive queue and
// slot memory, and the registration cache.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "verbs.hpp"
#include "wia_common/text.hpp"

namespace wia::verbs {

std::string size_text(std::uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0) return std::to_string(n >> 30) + " GiB";
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

std::string errno_text(int err) { return common::errno_text(err); }

wia_status_t Ctx::load_library() {
  lib.path = params.library;
  lib.handle = ::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) {
    const char* why = ::dlerror();
    return fail(WIA_ERROR_UNAVAILABLE,
                "verbs: cannot load %s: %s (Debian: apt install libibverbs1)", lib.path.c_str(),
                why != nullptr ? why : "unknown error");
  }
#define WIA_VERBS_RESOLVE(member, symbol, version, ret, args)                                \
  lib.member = reinterpret_cast<ret(*) args>(::dlvsym(lib.handle, symbol, version));         \
  if (lib.member == nullptr) {                                                               \
    const std::string path = lib.path;                                                       \
    ::dlclose(lib.handle);                                                                   \
    lib = Lib{};                                                                             \
    return fail(WIA_ERROR_UNAVAILABLE, "verbs: %s has no %s@%s: not rdma-core's libibverbs", \
                path.c_str(), symbol, version);                                              \
  }
  WIA_VERBS_SYMBOLS(WIA_VERBS_RESOLVE)
#undef WIA_VERBS_RESOLVE
  // Optional: without it (rdma-core < 34) device memory is refused by reg_mr.
  lib.reg_dmabuf_mr = reinterpret_cast<decltype(lib.reg_dmabuf_mr)>(
      ::dlvsym(lib.handle, kDmabufSymbol, kDmabufVersion));
  log(WIA_LOG_DEBUG, "verbs: %s@%s %s in %s", kDmabufSymbol, kDmabufVersion,
      lib.reg_dmabuf_mr != nullptr ? "found" : "absent (device memory refused)", lib.path.c_str());
  return WIA_SUCCESS;
}

namespace {

bool name_matches(const std::string& filter, const char* name) {
  if (filter.empty()) return true;
  std::size_t pos = 0;
  while (pos <= filter.size()) {
    std::size_t comma = filter.find(',', pos);
    if (comma == std::string::npos) comma = filter.size();
    const std::string token(common::trim(filter.substr(pos, comma - pos)));
    if (!token.empty() && std::strncmp(name, token.c_str(), token.size()) == 0) return true;
    pos = comma + 1;
  }
  return false;
}

// The address peers reach the handshake socket at: the first IPv4 address
// of an interface that is up, matches `filter` (name prefixes, "ib,eth")
// and, without a filter, is not loopback; loopback on a host without one.
std::uint32_t oob_address(const std::string& filter, std::string* text) {
  std::uint32_t pick = htonl(INADDR_LOOPBACK);
  std::string name = "lo";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
      if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) continue;
      if (!(ifa->ifa_flags & IFF_UP)) continue;
      if (filter.empty() ? (ifa->ifa_flags & IFF_LOOPBACK) != 0
                         : !name_matches(filter, ifa->ifa_name))
        continue;
      pick = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr.s_addr;
      name = ifa->ifa_name;
      break;
    }
    ::freeifaddrs(list);
  }
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &pick, buf, sizeof buf);
  *text = std::string(buf) + " (" + name + ")";
  return pick;
}

}  // namespace

wia_status_t Ctx::open_device() {
  int n = 0;
  ibv_device** list = lib.get_device_list(&n);
  if (list == nullptr || n <= 0) {
    if (list != nullptr) lib.free_device_list(list);
    return fail(WIA_ERROR_UNAVAILABLE, "verbs: no RDMA device (%s found none)", lib.path.c_str());
  }
  std::string names;
  for (int i = 0; i < n && dev == nullptr; ++i) {
    const std::string name = lib.get_device_name(list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (!params.device.empty() && name != params.device) continue;
    ibv_context* d = lib.open_device(list[i]);
    if (d == nullptr) {
      log(WIA_LOG_WARN, "verbs: ibv_open_device(%s): %s", name.c_str(), errno_text(errno).c_str());
      continue;
    }
    // The first active port, or the one asked for.
    for (int p = params.port > 0 ? params.port : 1; p <= (params.port > 0 ? params.port : 2); ++p) {
      ibv_port_attr a{};
      if (lib.query_port(d, static_cast<std::uint8_t>(p), &a) != 0) continue;
      if (a.state != IBV_PORT_ACTIVE) continue;
      dev = d;
      port = static_cast<std::uint8_t>(p);
      port_attr = a;
      dev_name = name;
      break;
    }
    if (dev == nullptr) lib.close_device(d);
  }
  lib.free_device_list(list);
  if (dev == nullptr) {
    if (!params.device.empty() && names.find(params.device) == std::string::npos)
      return fail(WIA_ERROR_UNAVAILABLE, "verbs: no RDMA device named '%s' (devices: %s)",
                  params.device.c_str(), names.c_str());
    return fail(WIA_ERROR_UNAVAILABLE,
                "verbs: no RDMA device with an active port%s%s (devices: %s)",
                params.port > 0 ? " " : "",
                params.port > 0 ? std::to_string(params.port).c_str() : "", names.c_str());
  }
  gid_index = params.gid_index >= 0 ? params.gid_index : 0;
  const bool need_gid = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (lib.query_gid(dev, port, gid_index, &gid) != 0) {
    if (need_gid)
      return fail(WIA_ERROR_CONFIG, "verbs: %s port %u has no GID at index %d (gid_index): %s",
                  dev_name.c_str(), port, gid_index, errno_text(errno).c_str());
    std::memset(&gid, 0, sizeof gid);
  }
  pd = lib.alloc_pd(dev);
  channel = pd != nullptr ? lib.create_comp_channel(dev) : nullptr;
  cq = channel != nullptr ? lib.create_cq(dev, static_cast<int>(kCqSize), this, channel, 0)
                          : nullptr;
  if (cq == nullptr)
    return fail(WIA_ERROR_UNAVAILABLE,
                "verbs: %s: cannot create the protection domain, "
                "completion channel or CQ: %s",
                dev_name.c_str(), errno_text(errno).c_str());
  const int flags = ::fcntl(channel->fd, F_GETFL);
  ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = kRecvSlots;
  sa.attr.max_sge = 1;
  srq = lib.create_srq(pd, &sa);
  if (srq == nullptr)
    return fail(WIA_ERROR_UNAVAILABLE, "verbs: %s: ibv_create_srq(%u receives): %s",
                dev_name.c_str(), kRecvSlots, errno_text(errno).c_str());
  recv_slab.reset(new char[std::size_t{kRecvSlots} * kSlotSize]);
  send_slab.reset(new char[std::size_t{kSendSlots} * kSlotSize]);
  recv_mr =
      lib.reg_mr(pd, recv_slab.get(), std::size_t{kRecvSlots} * kSlotSize, IBV_ACCESS_LOCAL_WRITE);
  send_mr =
      lib.reg_mr(pd, send_slab.get(), std::size_t{kSendSlots} * kSlotSize, IBV_ACCESS_LOCAL_WRITE);
  // Where the loopback QP's flush reads land (verbs_data.cpp).
  flush_mr = lib.reg_mr(pd, flush_byte, sizeof flush_byte, IBV_ACCESS_LOCAL_WRITE);
  if (recv_mr == nullptr || send_mr == nullptr || flush_mr == nullptr)
    return fail(WIA_ERROR_UNAVAILABLE, "verbs: %s: cannot register %s of slots: %s",
                dev_name.c_str(),
                size_text(std::uint64_t{kRecvSlots + kSendSlots} * kSlotSize).c_str(),
                errno_text(errno).c_str());
  for (std::uint32_t i = 0; i < kRecvSlots; ++i) {
    const wia_status_t st = post_recv_slot(i);
    if (st != WIA_SUCCESS) return st;
  }
  for (int i = static_cast<int>(kSendSlots) - 1; i >= 0; --i) free_send_slots.push_back(i);
  std::string filter = params.ifname;
  if (const char* env = std::getenv("WIA_SOCKET_IFNAME"); filter.empty() && env != nullptr)
    filter = env;
  oob_ipv4 = oob_address(filter, &oob_text);
  if (!filter.empty() && oob_text.find("(lo)") != std::string::npos && !name_matches(filter, "lo"))
    log(WIA_LOG_WARN,
        "verbs: no IPv4 interface that is up matches ifname '%s': the handshake "
        "uses loopback, which peers on other nodes cannot reach",
        filter.c_str());
  next_psn = static_cast<std::uint64_t>(now_ns());
  log(WIA_LOG_INFO, "verbs: %s port %u (%s, MTU %d, LID %u), handshake address %s",
      dev_name.c_str(), port,
      port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
      128 << port_attr.active_mtu, port_attr.lid, oob_text.c_str());
  return WIA_SUCCESS;
}

void Ctx::close_device() {
  close_loopback();
  loop_out.clear();
  if (flush_mr != nullptr) lib.dereg_mr(flush_mr);
  flush_mr = nullptr;
  for (auto& [key, e] : cache) {
    lib.dereg_mr(e->mr);
    delete e;
  }
  cache.clear();
  if (recv_mr != nullptr) lib.dereg_mr(recv_mr);
  if (send_mr != nullptr) lib.dereg_mr(send_mr);
  if (srq != nullptr) lib.destroy_srq(srq);
  if (cq != nullptr) {
    if (unarmed_events > 0) lib.ack_cq_events(cq, unarmed_events);
    lib.destroy_cq(cq);
  }
  if (channel != nullptr) lib.destroy_comp_channel(channel);
  if (pd != nullptr) lib.dealloc_pd(pd);
  if (dev != nullptr) lib.close_device(dev);
  recv_mr = send_mr = nullptr;
  srq = nullptr;
  cq = nullptr;
  channel = nullptr;
  pd = nullptr;
  dev = nullptr;
}

// One ibv_reg_mr per distinct (address, length) while any reference lives.
// Entries go when their last reference does: a cache that outlived its
// references would need to learn about munmap (memory hooks), which this
// provider does not install.
wia_status_t Ctx::reg(void* ptr, std::uint64_t size, MrEntry** out) {
  const auto key = std::make_pair(reinterpret_cast<std::uintptr_t>(ptr), size);
  auto it = cache.find(key);
  if (it != cache.end()) {
    ++it->second->refs;
    *out = it->second;
    return WIA_SUCCESS;
  }
  ++reg_calls;
  ibv_mr* mr = lib.reg_mr(
      pd, ptr, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) {
    reg_error = "ibv_reg_mr(" + size_text(size) + ") on " + dev_name + ": " + errno_text(errno);
    return fail(WIA_ERROR_IO, "verbs: %s", reg_error.c_str());
  }
  log(WIA_LOG_DEBUG, "verbs: ibv_reg_mr(%p, %s) = lkey 0x%x", ptr, size_text(size).c_str(),
      mr->lkey);
  auto* e = new MrEntry{mr, key.first, size, 1};
  cache[key] = e;
  *out = e;
  return WIA_SUCCESS;
}

// Device memory: the accelerator provider's dma-buf fd and the offset of the
// pointer in it; the iova is the device pointer itself, so the addresses
// the core passes (isend/irecv buffers, put/get remote addresses) need no
// translation. The fd is only borrowed: the registration holds its own
// reference to the dma-buf, and the caller may close the fd afterwards.
wia_status_t Ctx::reg_device(const wia_mr_desc_v1_t& desc, MrEntry** out) {
  if (lib.reg_dmabuf_mr == nullptr)
    return fail(WIA_ERROR_NOT_SUPPORTED,
                "verbs: cannot register device memory on %s: %s has no %s@%s (rdma-core 34 or "
                "later has it); stage through a host buffer",
                dev_name.c_str(), lib.path.c_str(), kDmabufSymbol, kDmabufVersion);
  const bool has_fd =
      desc.struct_size >= offsetof(wia_mr_desc_v1_t, dmabuf_offset) + sizeof desc.dmabuf_offset &&
      desc.dmabuf_fd >= 0;
  if (!has_fd)
    return fail(
        WIA_ERROR_NOT_SUPPORTED,
        "verbs: cannot register device memory at %p on %s without its dma-buf: "
        "wia_mr_desc_v1_t.dmabuf_fd is %d (the accelerator provider exports it); this "
        "provider does not use nvidia-peermem",
        desc.ptr, dev_name.c_str(),
        desc.struct_size >= offsetof(wia_mr_desc_v1_t, dmabuf_fd) + 4 ? desc.dmabuf_fd : -1);
  if (desc.ptr == nullptr || desc.size == 0)
    return fail(WIA_ERROR_INVALID_ARGUMENT,
                "verbs: reg_mr of device memory: %s at %p (a device region must be non-empty)",
                size_text(desc.size).c_str(), desc.ptr);
  ++reg_calls;
  const auto iova = reinterpret_cast<std::uintptr_t>(desc.ptr);
  ibv_mr* mr =
      lib.reg_dmabuf_mr(pd, desc.dmabuf_offset, desc.size, iova, desc.dmabuf_fd,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) {
    reg_error = "ibv_reg_dmabuf_mr(fd " + std::to_string(desc.dmabuf_fd) + ", offset " +
                std::to_string(desc.dmabuf_offset) + ", " + size_text(desc.size) + ") on " +
                dev_name + ": " + errno_text(errno);
    return fail(WIA_ERROR_IO, "verbs: %s", reg_error.c_str());
  }
  log(WIA_LOG_DEBUG, "verbs: ibv_reg_dmabuf_mr(%p, fd %d + %" PRIu64 ", %s) = lkey 0x%x", desc.ptr,
      desc.dmabuf_fd, desc.dmabuf_offset, size_text(desc.size).c_str(), mr->lkey);
  auto* e = new MrEntry{mr, iova, desc.size, 1};
  e->device = true;
  *out = e;
  return WIA_SUCCESS;
}

void Ctx::unreg(MrEntry* e) {
  if (e == nullptr || --e->refs > 0) return;
  if (!e->device) cache.erase(std::make_pair(e->base, e->len));
  lib.dereg_mr(e->mr);
  delete e;
}

}  // namespace wia::verbs
