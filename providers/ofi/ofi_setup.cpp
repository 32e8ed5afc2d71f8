// SPDX-License-Identifier: Apache-2.0
// libfabric at init (dlopen), the choice of fabric endpoints (fi_getinfo,
// with a verdict for every result), and the fabric objects of one wia
// endpoint: fabric, domain, AV (FI_AV_TABLE), CQ (FI_WAIT_FD when the
// fabric has one) and the RDM endpoint itself.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ofi.hpp"

namespace wia::ofi {

namespace {

// Core fabric providers that run over the kernel's sockets or shared
// memory: nothing under them is RDMA hardware, so the default rules do not
// prefer ofi over the tcp provider for inter-node links on them.
bool is_sockets_provider(const std::string& prov) {
  const std::string core = prov.substr(0, prov.find(';'));
  return core == "tcp" || core == "sockets" || core == "udp" || core == "net" || core == "shm";
}

int tag_width(std::uint64_t format) {
  if (format == 0) return 64;  // no restriction announced
  return 64 - __builtin_clzll(format);
}

std::string pci_text(const fi_info* info) {
  if (info->nic == nullptr || info->nic->bus_attr == nullptr ||
      info->nic->bus_attr->bus_type != FI_BUS_PCI)
    return {};
  const fi_pci_attr& p = info->nic->bus_attr->attr.pci;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", p.domain_id, p.bus_id, p.device_id,
                p.function_id);
  return buf;
}

// libfabric's shm names each endpoint's region after the process id alone
// ("<pid>:<domain>:<endpoint>" in /dev/shm) and unlinks it only on a clean
// close. A rank that is killed leaves its 16 MiB region behind, and the next
// process to be given that pid cannot open an endpoint at all (EBUSY). We
// name regions after the pid namespace, pid and process start time instead,
// which no later process repeats, and reap those whose owner is gone.
std::string shm_region_stem(std::uint64_t pid_ns, std::uint32_t pid, std::uint64_t start) {
  return "wia-" + std::to_string(pid_ns) + "-" + std::to_string(pid) + "-" + std::to_string(start);
}

std::uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
}

// Unlinks the regions of our own pid namespace whose owner has exited (no
// such pid, or a pid reused by a process started later). Regions of other
// namespaces are left alone: their pids mean nothing here.
void reap_stale_shm_regions(const Ctx& ctx, std::uint64_t pid_ns) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string ns_prefix = "wia-" + std::to_string(pid_ns) + "-";
  while (const dirent* d = ::readdir(dir)) {
    const std::string name = d->d_name;
    if (name.rfind(ns_prefix, 0) != 0) continue;
    unsigned long pid = 0;
    unsigned long long start = 0;
    if (std::sscanf(name.c_str() + ns_prefix.size(), "%lu-%llu:", &pid, &start) != 2) continue;
    if (process_start_time(static_cast<std::uint32_t>(pid)) == start) continue;  // alive
    if (::shm_unlink(name.c_str()) == 0)
      ctx.log(WIA_LOG_INFO, "ofi: removed /dev/shm/%s, left by pid %lu that exited uncleanly",
              name.c_str(), pid);
  }
  ::closedir(dir);
}

}  // namespace

wia_status_t load_library(Ctx& ctx) {
  Lib& lib = ctx.lib;
  lib.path = ctx.params.library;
  lib.handle = ::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib.handle == nullptr) {
    const char* why = ::dlerror();
    return ctx.fail(WIA_ERROR_UNAVAILABLE, "ofi: libfabric not found: dlopen(%s): %s",
                    lib.path.c_str(), why != nullptr ? why : "unknown error");
  }
#define WIA_OFI_RESOLVE(name, ret, args)                                                      \
  lib.name = reinterpret_cast<ret(*) args>(::dlsym(lib.handle, #name));                       \
  if (lib.name == nullptr)                                                                    \
    return ctx.fail(WIA_ERROR_UNAVAILABLE, "ofi: %s has no symbol %s (not a libfabric 1.x?)", \
                    lib.path.c_str(), #name);
  WIA_OFI_SYMBOLS(WIA_OFI_RESOLVE)
#undef WIA_OFI_RESOLVE
  const std::uint32_t v = lib.fi_version();
  if (FI_MAJOR(v) != 1 || FI_MINOR(v) < 17)
    return ctx.fail(WIA_ERROR_UNAVAILABLE, "ofi: %s is libfabric %u.%u; 1.17 or newer is needed",
                    lib.path.c_str(), FI_MAJOR(v), FI_MINOR(v));
  return WIA_SUCCESS;
}

wia_status_t discover(Ctx& ctx) {
  const Lib& lib = ctx.lib;
  const char* env = std::getenv("FI_PROVIDER");
  std::string filter = ctx.params.provider;
  if (!filter.empty())
    ctx.requested = "'" + filter + "' (ofi.provider)";
  else if (env != nullptr && *env != '\0')
    ctx.requested = "'" + std::string(env) + "' (FI_PROVIDER)";
  else
    ctx.requested = "any (neither ofi.provider nor FI_PROVIDER is set)";

  fi_info* hints = lib.fi_dupinfo(nullptr);
  if (hints == nullptr) return ctx.fail(WIA_ERROR_OUT_OF_MEMORY, "ofi: fi_allocinfo failed");
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->av_type = FI_AV_TABLE;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  // Every registration mode we honour (ofi_mr.cpp); the fabric answers with
  // the ones it demands. FI_MR_HMEM is offered only with FI_HMEM (below).
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if (!filter.empty()) hints->fabric_attr->prov_name = ::strdup(filter.c_str());
  if (!ctx.params.domain.empty()) hints->domain_attr->name = ::strdup(ctx.params.domain.c_str());

  // Device memory first: the fabrics that claim FI_HMEM when asked for it
  // (with FI_MR_HMEM among the modes we honour: device buffers always come
  // registered, ofi_mr.cpp). Asked separately, so that a fabric without it
  // (Debian's libfabric is built without CUDA, ROCr and Level Zero) is
  // still taken below, for host memory.
  fi_info* hmem_list = nullptr;
  if (ctx.params.hmem != "off") {
    hints->domain_attr->mr_mode |= FI_MR_HMEM;
    hints->caps = FI_TAGGED | FI_RMA | FI_HMEM;
    if (lib.fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &hmem_list) != 0)
      hmem_list = nullptr;
    if (hmem_list == nullptr) {
      hints->caps = FI_TAGGED | FI_HMEM;
      if (lib.fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &hmem_list) != 0)
        hmem_list = nullptr;
    }
    hints->domain_attr->mr_mode &= ~static_cast<std::uint64_t>(FI_MR_HMEM);
  }
  // With RMA first (put/get); fabrics without it are still taken for
  // messages when no fabric matching the filter offers it.
  hints->caps = FI_TAGGED | FI_RMA;
  fi_info* list = nullptr;
  int rc = lib.fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
  if (rc != 0 || list == nullptr) {
    hints->caps = FI_TAGGED;
    rc = lib.fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list);
  }
  lib.fi_freeinfo(hints);
  // The FI_HMEM answer for the same fabric, provider and domain, unless it
  // would lose RMA the plain answer has.
  auto hmem_match = [&](const fi_info* plain) -> const fi_info* {
    for (const fi_info* h = hmem_list; h != nullptr; h = h->next) {
      if ((h->caps & FI_HMEM) == 0 || h->fabric_attr->prov_name == nullptr ||
          plain->fabric_attr->prov_name == nullptr || h->domain_attr->name == nullptr ||
          plain->domain_attr->name == nullptr)
        continue;
      if (std::strcmp(h->fabric_attr->prov_name, plain->fabric_attr->prov_name) != 0 ||
          std::strcmp(h->domain_attr->name, plain->domain_attr->name) != 0)
        continue;
      if ((plain->caps & FI_RMA) != 0 && (h->caps & FI_RMA) == 0) continue;
      return h;
    }
    return nullptr;
  };
  if (rc != 0 || list == nullptr) {
    if (hmem_list != nullptr) lib.fi_freeinfo(hmem_list);
    // Name what there is, so a typo in the provider name is obvious.
    std::string offered;
    fi_info* any = nullptr;
    fi_info* h2 = lib.fi_dupinfo(nullptr);
    if (h2 != nullptr) {
      h2->ep_attr->type = FI_EP_RDM;
      h2->caps = FI_TAGGED;
      if (lib.fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, h2, &any) == 0) {
        for (fi_info* i = any; i != nullptr; i = i->next) {
          const std::string p = i->fabric_attr->prov_name;
          if (offered.find(p + ",") == std::string::npos && offered != p &&
              offered.find(", " + p) == std::string::npos)
            offered += (offered.empty() ? "" : ", ") + p;
        }
        lib.fi_freeinfo(any);
      }
      lib.fi_freeinfo(h2);
    }
    return ctx.fail(WIA_ERROR_UNAVAILABLE,
                    "ofi: no fabric provider matching %s%s%s offers FI_EP_RDM with FI_TAGGED "
                    "and FI_ORDER_SAS here (fi_getinfo: %s); fabric providers with RDM tagged "
                    "endpoints here: %s",
                    ctx.requested.c_str(), ctx.params.domain.empty() ? "" : " on domain ",
                    ctx.params.domain.c_str(), ctx.fi_error(rc).c_str(),
                    offered.empty() ? "none" : offered.c_str());
  }

  std::vector<EndpointInfo> real, loop;
  auto find = [&](const std::string& p, const std::string& d) -> int {
    int n = 0;
    for (auto* v : {&real, &loop})
      for (const EndpointInfo& e : *v) {
        if (e.prov == p && e.domain == d) return n;
        ++n;
      }
    return -1;
  };
  // shm with FI_HMEM turns off its single-copy path for host memory
  // (libfabric 1.17: no cross-memory attach, every message above 4 KiB
  // segmented through bounce buffers, and later sends to that peer refused
  // until one is through; 4.6x slower at 1 MiB here), while node-local
  // device traffic has the device provider's own IPC. So only `on` asks it.
  auto is_shm = [](const fi_info* i) {
    const char* p = i->fabric_attr->prov_name;
    return p != nullptr && std::strncmp(p, "shm", 3) == 0 && (p[3] == '\0' || p[3] == ';');
  };
  for (fi_info* plain = list; plain != nullptr; plain = plain->next) {
    const bool shm_without_hmem = ctx.params.hmem == "auto" && is_shm(plain);
    const fi_info* hmem = shm_without_hmem ? nullptr : hmem_match(plain);
    const fi_info* i = hmem != nullptr ? hmem : plain;
    EndpointInfo e;
    e.prov = i->fabric_attr->prov_name != nullptr ? i->fabric_attr->prov_name : "?";
    e.domain = i->domain_attr->name != nullptr ? i->domain_attr->name : "?";
    e.fabric = i->fabric_attr->name != nullptr ? i->fabric_attr->name : "?";
    const std::string what = e.prov + " " + e.domain + " (fabric " + e.fabric + ")";
    if (const int dup = find(e.prov, e.domain); dup >= 0) {
      ctx.verdicts.push_back(what + ": not taken, same provider and domain as an earlier result");
      continue;
    }
    if (tag_width(i->ep_attr->mem_tag_format) < static_cast<int>(kTagBitsNeeded)) {
      ctx.verdicts.push_back(what + ": not taken, its mem_tag_format leaves fewer than 64 tag " +
                             "bits (40 for the user's tag, 24 for the connection)");
      continue;
    }
    e.sockets = is_sockets_provider(e.prov);
    e.shm = is_shm(i);
    e.loopback = e.domain == "lo" || e.fabric.rfind("127.", 0) == 0 || e.fabric == "::1/128";
    e.flags = WIA_TRANSPORT_FLAG_INTRA_NODE;
    e.rma = (i->caps & FI_RMA) != 0;
    if (e.rma) e.flags |= WIA_TRANSPORT_FLAG_RMA;
    e.hmem = hmem != nullptr;
    // The core hands device buffers over with their registration (reg_mr
    // of the whole allocation by address, naming its memory interface and
    // device), which is what FI_MR_HMEM needs; no dma-buf (libfabric
    // reaches the device's memory through its own driver calls, and 1.17
    // has no FI_MR_DMABUF), so a device that cannot export one goes direct
    // too.
    if (e.hmem) e.flags |= WIA_TRANSPORT_FLAG_DEVICE_MEMORY;
    if (!e.shm && !e.loopback && (!e.sockets || ctx.params.inter_node == "all"))
      e.flags |= WIA_TRANSPORT_FLAG_INTER_NODE;
    e.max_msg = i->ep_attr->max_msg_size;
    if (ctx.params.max_message != 0) e.max_msg = std::min(e.max_msg, ctx.params.max_message);
    e.pci_bus_id = pci_text(i);
    if (i->nic != nullptr && i->nic->link_attr != nullptr)
      e.speed_mbps = i->nic->link_attr->speed / 1000000u;
    e.info = lib.fi_dupinfo(i);
    if (e.info == nullptr) return ctx.fail(WIA_ERROR_OUT_OF_MEMORY, "ofi: fi_dupinfo failed");
    std::string note =
        std::string(e.sockets ? "sockets fabric" : "RDMA fabric") + (e.rma ? ", RMA" : ", no RMA");
    if (e.hmem)
      note += ", FI_HMEM (device memory registered with its interface)";
    else if (ctx.params.hmem == "off")
      note += ", FI_HMEM not asked for (ofi.hmem: off)";
    else if (shm_without_hmem)
      note += ", FI_HMEM not asked for (it would turn off shm's single-copy path; ofi.hmem: on "
              "asks it)";
    else
      note += ", no FI_HMEM (device memory is staged through host memory)";
    if ((e.flags & WIA_TRANSPORT_FLAG_INTER_NODE) == 0)
      note += e.shm || e.loopback ? ", this node only"
                                  : ", offered for this node only (ofi.inter_node: rdma)";
    ctx.verdicts.push_back(what + ": taken (" + note + ")");
    (e.loopback ? loop : real).push_back(std::move(e));
  }
  lib.fi_freeinfo(list);
  if (hmem_list != nullptr) lib.fi_freeinfo(hmem_list);
  ctx.endpoints = std::move(real);
  for (EndpointInfo& e : loop) ctx.endpoints.push_back(std::move(e));
  std::string summary;
  for (std::size_t k = 0; k < ctx.endpoints.size(); ++k)
    summary += (k ? ", " : "") + std::to_string(k) + ": " + ctx.endpoints[k].prov + "/" +
               ctx.endpoints[k].domain;
  ctx.log(WIA_LOG_INFO, "ofi: fabric providers matching %s: %zu result(s), endpoints %s",
          ctx.requested.c_str(), ctx.verdicts.size(), summary.c_str());
  for (const std::string& v : ctx.verdicts) ctx.log(WIA_LOG_INFO, "ofi:   %s", v.c_str());
  return WIA_SUCCESS;
}

wia_status_t Ctx::endpoint(int32_t index, Endpoint** out) {
  if (index < 0 || static_cast<std::size_t>(index) >= endpoints.size())
    return fail(WIA_ERROR_INVALID_ARGUMENT, "ofi: endpoint %d does not exist (%zu endpoints)",
                index, endpoints.size());
  std::lock_guard<std::mutex> lk(open_mu);
  EndpointInfo& e = endpoints[static_cast<std::size_t>(index)];
  if (!e.open) {
    auto ep = std::make_unique<Endpoint>(this, &e);
    const wia_status_t st = ep->open();
    if (st != WIA_SUCCESS) return st;
    e.open = std::move(ep);
  }
  *out = e.open.get();
  return WIA_SUCCESS;
}

wia_status_t Endpoint::open() {
  const std::string where = info_->prov + "/" + info_->domain;
  fi_info* info = ctx_->lib.fi_dupinfo(info_->info);
  if (info == nullptr) return ctx_->fail(WIA_ERROR_OUT_OF_MEMORY, "ofi: fi_dupinfo failed");
  self_pid_ = static_cast<std::uint32_t>(::getpid());
  self_start_time_ = process_start_time(self_pid_);
  boot_id(self_boot_id_);
  if (info_->shm) {
    const std::uint64_t ns = pid_namespace();
    reap_stale_shm_regions(*ctx_, ns);
    const std::string addr = "fi_shm://" + shm_region_stem(ns, self_pid_, self_start_time_);
    std::free(info->src_addr);
    info->src_addr = ::strdup(addr.c_str());
    info->src_addrlen = addr.size() + 1;
  }
  const wia_status_t st = open_objects(info, where);
  ctx_->lib.fi_freeinfo(info);
  return st;
}

wia_status_t Endpoint::open_objects(fi_info* info, const std::string& where) {
  int rc = ctx_->lib.fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE, "ofi: fi_fabric(%s): %s", where.c_str(),
                      ctx_->fi_error(rc).c_str());
  rc = fi_domain(fabric, info, &domain, nullptr);
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE, "ofi: fi_domain(%s): %s", where.c_str(),
                      ctx_->fi_error(rc).c_str());
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  // shm's CQ descriptor is only signalled by this process's own progress
  // (no peer writes to it), so a core asleep on it would sleep through
  // every message: shm endpoints offer no wait fd.
  cq_attr.wait_obj = info_->shm ? FI_WAIT_NONE : FI_WAIT_FD;
  rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  if (rc == 0) {
    if (cq_attr.wait_obj == FI_WAIT_FD && fi_control(&cq->fid, FI_GETWAIT, &wait_fd) != 0)
      wait_fd = -1;
  } else {
    ctx_->log(WIA_LOG_DEBUG, "ofi: %s has no CQ wait fd (%s); test() polls", where.c_str(),
              ctx_->fi_error(rc).c_str());
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(domain, &cq_attr, &cq, nullptr);
  }
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE, "ofi: fi_cq_open(%s): %s", where.c_str(),
                      ctx_->fi_error(rc).c_str());
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(domain, &av_attr, &av, nullptr);
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE, "ofi: fi_av_open(%s): %s", where.c_str(),
                      ctx_->fi_error(rc).c_str());
  rc = fi_endpoint(domain, info, &ep, nullptr);
  if (rc == 0) rc = fi_ep_bind(ep, &av->fid, 0);
  if (rc == 0) rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc == 0) rc = fi_enable(ep);
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE, "ofi: endpoint on %s: %s", where.c_str(),
                      ctx_->fi_error(rc).c_str());
  namelen = sizeof(name);
  rc = fi_getname(&ep->fid, name, &namelen);
  if (rc != 0)
    return ctx_->fail(WIA_ERROR_UNAVAILABLE,
                      "ofi: fi_getname(%s): %s (an address over %zu bytes does not fit the "
                      "connection handle)",
                      where.c_str(), ctx_->fi_error(rc).c_str(), kMaxAddr);
  const std::uint64_t mode = info->domain_attr->mr_mode;
  mr_local = (mode & FI_MR_LOCAL) != 0;
  mr_endpoint = (mode & FI_MR_ENDPOINT) != 0;
  mr_prov_key = (mode & FI_MR_PROV_KEY) != 0;
  mr_virt_addr = (mode & FI_MR_VIRT_ADDR) != 0;
  const std::string& rdv = ctx_->params.rendezvous;
  rendezvous = rdv == "on" || (rdv == "auto" && info_->shm);
  if (!rendezvous && info_->shm)
    ctx_->log(WIA_LOG_WARN,
              "ofi: %s opened with ofi.rendezvous: off: libfabric %u.%u's shm stalls a message "
              "above 4 KiB that arrives before its receive is posted, and may match a header that "
              "came early to the wrong receive (docs/transport-ofi.md); expect transfers to hang "
              "until their deadline. ofi.rendezvous: auto turns it on for shm",
              where.c_str(), FI_MAJOR(ctx_->lib.fi_version()), FI_MINOR(ctx_->lib.fi_version()));
  inject_size = info->tx_attr != nullptr ? info->tx_attr->inject_size : 0;
  ctx_->log(WIA_LOG_DEBUG,
            "ofi: opened %s: address %zu bytes, wait fd %d, mr_mode 0x%" PRIx64 ", inject %" PRIu64
            " B%s",
            where.c_str(), namelen, wait_fd, mode, inject_size,
            rendezvous ? ", rendezvous (framed messages, clear-to-send above 4 KiB)" : "");
  return WIA_SUCCESS;
}

Endpoint::~Endpoint() {
  if (ep != nullptr) fi_close(&ep->fid);
  // Requests libfabric still held are released with the endpoint.
  release_all_requests();
  for (auto& [k, e] : cache_) {
    if (e->mr != nullptr) fi_close(&e->mr->fid);
    delete e;
  }
  if (av != nullptr) fi_close(&av->fid);
  if (cq != nullptr) fi_close(&cq->fid);
  if (domain != nullptr) fi_close(&domain->fid);
  if (fabric != nullptr) fi_close(&fabric->fid);
}

// --- host facts for the liveness check -----------------------------------------

std::uint64_t process_start_time(std::uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(text.substr(paren + 1));
  std::string state;
  rest >> state;
  if (state == "Z" || state == "X" || state == "x") return 0;
  // Fields after the state: ppid pgrp session tty tpgid flags minflt cminflt
  // majflt cmajflt utime stime cutime cstime priority nice threads
  // itrealvalue starttime (the 22nd field of the line).
  std::string field;
  for (int k = 0; k < 19 && rest >> field; ++k) {
  }
  return std::strtoull(field.c_str(), nullptr, 10);
}

void boot_id(std::uint8_t out[16]) {
  std::memset(out, 0, 16);
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(in, line);
  int k = 0;
  for (std::size_t i = 0; i + 1 < line.size() && k < 16; ++i) {
    if (line[i] == '-') continue;
    out[k++] = static_cast<std::uint8_t>(std::strtoul(line.substr(i, 2).c_str(), nullptr, 16));
    ++i;
  }
}

}  // namespace wia::ofi
