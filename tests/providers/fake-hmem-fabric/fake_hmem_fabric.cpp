// SPDX-License-Identifier: Apache-2.0
// A libfabric test double that claims FI_HMEM on top of the real library
// (README.md in this folder). It exports the six functions the ofi
// provider resolves, forwards them to the real libfabric.so.1, and:
//  - fi_getinfo: strips FI_HMEM and FI_MR_HMEM from the hints it passes on
//    and adds them to the answers when the caller asked for them;
//  - fi_domain / fi_endpoint (through the fabric's and domain's ops
//    tables): strip them again from the info given to the real fabric;
//  - fi_mr_regattr: an FI_HMEM_CUDA registration of memory of the CUDA
//    double (a memfd mapping) is registered as FI_HMEM_SYSTEM, which it
//    is; FI_HMEM_ROCR and FI_HMEM_ZE are refused with -FI_ENOSYS, as a
//    library built without them does;
//  - tagged sends and receives: a transfer touching memory registered as
//    FI_HMEM_CUDA is counted as a device transfer when it carries that
//    registration's descriptor, and as a violation otherwise (no
//    descriptor, another one, or fi_tinject, which takes none): the CPU of
//    a real fabric would then read or write device memory.
// Counters are read by tests through the fake_hmem_fabric_* functions.
#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// --- the real library --------------------------------------------------------

struct Real {
  void* handle = nullptr;
  decltype(&fi_getinfo) getinfo = nullptr;
  decltype(&fi_freeinfo) freeinfo = nullptr;
  decltype(&fi_dupinfo) dupinfo = nullptr;
  decltype(&fi_fabric) fabric = nullptr;
  decltype(&fi_strerror) strerror = nullptr;
  decltype(&fi_version) version = nullptr;
};

// Loaded at the first call; a library that cannot be loaded ends the
// process with the reason (a test double has no better answer).
const Real& real() {
  static Real r;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("WIA_FAKE_HMEM_FABRIC_REAL");
    if (path == nullptr || *path == '\0') path = "libfabric.so.1";
    r.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (r.handle == nullptr) {
      std::fprintf(stderr, "fake-hmem-fabric: dlopen(%s): %s\n", path, dlerror());
      std::abort();
    }
#define FAKE_RESOLVE(field, name)                                          \
  r.field = reinterpret_cast<decltype(r.field)>(dlsym(r.handle, #name));   \
  if (r.field == nullptr) {                                                \
    std::fprintf(stderr, "fake-hmem-fabric: %s has no %s\n", path, #name); \
    std::abort();                                                          \
  }
    FAKE_RESOLVE(getinfo, fi_getinfo)
    FAKE_RESOLVE(freeinfo, fi_freeinfo)
    FAKE_RESOLVE(dupinfo, fi_dupinfo)
    FAKE_RESOLVE(fabric, fi_fabric)
    FAKE_RESOLVE(strerror, fi_strerror)
    FAKE_RESOLVE(version, fi_version)
#undef FAKE_RESOLVE
  });
  return r;
}

// --- state: original ops tables per object, CUDA registrations, counters ------

struct CudaRegion {
  std::uintptr_t base = 0;
  std::size_t len = 0;
  void* desc = nullptr;
};

struct State {
  std::mutex mu;
  std::unordered_map<const void*, const fi_ops_fabric*> fabric_ops;
  std::unordered_map<const void*, const fi_ops_domain*> domain_ops;
  std::unordered_map<const void*, const fi_ops_mr*> mr_ops;
  std::unordered_map<const void*, const fi_ops_tagged*> tagged_ops;
  std::unordered_map<const void*, const fi_ops*> mr_fid_ops;  // per registration
  // The wrapper tables installed in objects: a registration's goes with
  // its close, the others (a few per process) live as long as the process
  // and stay reachable from here.
  std::unordered_map<const void*, std::unique_ptr<fi_ops>> mr_tables;
  std::vector<std::shared_ptr<void>> tables;
  std::map<const void*, CudaRegion> cuda;  // live FI_HMEM_CUDA registrations
  std::uint64_t regs[8] = {};              // by requested iface
  std::int64_t live[8] = {};
  std::uint64_t device_sends = 0, device_recvs = 0, device_bytes = 0;
  std::uint64_t violations = 0;
  std::string last_violation;
};

State& state() {
  static State s;
  return s;
}

template <typename T>
const T* original(std::unordered_map<const void*, const T*>& map, const void* obj) {
  std::lock_guard<std::mutex> lk(state().mu);
  const auto it = map.find(obj);
  return it != map.end() ? it->second : nullptr;
}

// A copy of `orig` to install in an object.
template <typename T>
std::unique_ptr<T> copy_ops(const T* orig) {
  auto t = std::make_unique<T>();
  std::memcpy(t.get(), orig, std::min(sizeof(T), orig->size != 0 ? orig->size : sizeof(T)));
  return t;
}

// The same, kept for the life of the process (fabric, domain and endpoint
// tables: a handful per run).
template <typename T>
T* kept_copy_ops(const T* orig) {
  std::shared_ptr<T> t = copy_ops(orig);
  std::lock_guard<std::mutex> lk(state().mu);
  state().tables.push_back(t);
  return t.get();
}

void strip_hmem(fi_info* info) {
  info->caps &= ~FI_HMEM;
  if (info->tx_attr != nullptr) info->tx_attr->caps &= ~FI_HMEM;
  if (info->rx_attr != nullptr) info->rx_attr->caps &= ~FI_HMEM;
  if (info->domain_attr != nullptr)
    info->domain_attr->mr_mode &= ~static_cast<std::uint64_t>(FI_MR_HMEM);
}

// The CUDA double's device N when [base, +len) lies in one mapping of a
// memfd it names for its device allocations ("/memfd:fake-cuda-dev<N>"),
// else -1.
int cuda_double_device(std::uintptr_t base, std::size_t len) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  constexpr const char* kName = "/memfd:fake-cuda-dev";
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    if (base >= lo && base + len <= hi) {
      const std::size_t at = line.find(kName);
      return at == std::string::npos ? -1 : std::atoi(line.c_str() + at + std::strlen(kName));
    }
  }
  return -1;
}

// The CUDA registration overlapping [buf, +len), if any; *desc_ok: `desc`
// is the descriptor of one that holds the whole range.
bool touches_cuda(const void* buf, std::size_t len, void* desc, bool* desc_ok) {
  const auto lo = reinterpret_cast<std::uintptr_t>(buf);
  const std::uintptr_t hi = lo + len;
  bool touches = false;
  *desc_ok = false;
  for (const auto& [mr, r] : state().cuda) {
    if (hi <= r.base || lo >= r.base + r.len) continue;
    touches = true;
    if (desc != nullptr && desc == r.desc && lo >= r.base && hi <= r.base + r.len) *desc_ok = true;
  }
  return touches;
}

void check_transfer(const char* op, bool send, const void* buf, std::size_t len, void* desc,
                    bool inject) {
  if (len == 0) return;  // touches no memory
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (s.cuda.empty()) return;
  bool desc_ok = false;
  if (!touches_cuda(buf, len, desc, &desc_ok)) return;
  if (desc_ok && !inject) {
    ++(send ? s.device_sends : s.device_recvs);
    s.device_bytes += len;
    return;
  }
  ++s.violations;
  char text[256];
  std::snprintf(text, sizeof(text), "%s of %zu B at %p touches FI_HMEM_CUDA memory %s", op, len,
                buf,
                inject            ? "(fi_tinject takes no descriptor)"
                : desc == nullptr ? "without a descriptor"
                                  : "with a descriptor of another registration");
  s.last_violation = text;
  std::fprintf(stderr, "fake-hmem-fabric: VIOLATION: %s\n", text);
}

// --- tagged operations ---------------------------------------------------------

ssize_t t_recv(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src, uint64_t tag,
               uint64_t ignore, void* context) {
  check_transfer("fi_trecv", false, buf, len, desc, false);
  return original(state().tagged_ops, ep)->recv(ep, buf, len, desc, src, tag, ignore, context);
}

ssize_t t_send(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t tag,
               void* context) {
  check_transfer("fi_tsend", true, buf, len, desc, false);
  return original(state().tagged_ops, ep)->send(ep, buf, len, desc, dest, tag, context);
}

ssize_t t_inject(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest, uint64_t tag) {
  check_transfer("fi_tinject", true, buf, len, nullptr, true);
  return original(state().tagged_ops, ep)->inject(ep, buf, len, dest, tag);
}

ssize_t t_senddata(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data,
                   fi_addr_t dest, uint64_t tag, void* context) {
  check_transfer("fi_tsenddata", true, buf, len, desc, false);
  return original(state().tagged_ops, ep)->senddata(ep, buf, len, desc, data, dest, tag, context);
}

ssize_t t_injectdata(fid_ep* ep, const void* buf, size_t len, uint64_t data, fi_addr_t dest,
                     uint64_t tag) {
  check_transfer("fi_tinjectdata", true, buf, len, nullptr, true);
  return original(state().tagged_ops, ep)->injectdata(ep, buf, len, data, dest, tag);
}

// --- registrations ---------------------------------------------------------------

int mr_close(fid* f) {
  State& s = state();
  const fi_ops* orig = nullptr;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    orig = s.mr_fid_ops.at(f);
    s.mr_fid_ops.erase(f);
    f->ops = const_cast<fi_ops*>(orig);  // before its wrapper table goes
    s.mr_tables.erase(f);
    if (s.cuda.erase(f) != 0)
      --s.live[FI_HMEM_CUDA];
    else
      --s.live[FI_HMEM_SYSTEM];
  }
  return orig->close(f);
}

// Wraps a new registration's close, so the live counts and the CUDA
// regions follow it.
void track(fid_mr* mr, fi_hmem_iface iface, const fi_mr_attr* attr) {
  State& s = state();
  std::unique_ptr<fi_ops> ops = copy_ops(mr->fid.ops);
  ops->close = mr_close;
  std::lock_guard<std::mutex> lk(s.mu);
  s.mr_fid_ops[&mr->fid] = mr->fid.ops;
  mr->fid.ops = ops.get();
  s.mr_tables[&mr->fid] = std::move(ops);
  ++s.live[iface];
  if (iface == FI_HMEM_CUDA && attr->iov_count == 1)
    s.cuda[&mr->fid] = CudaRegion{reinterpret_cast<std::uintptr_t>(attr->mr_iov[0].iov_base),
                                  attr->mr_iov[0].iov_len, mr->mem_desc};
}

int mr_regattr(fid* domain, const fi_mr_attr* attr, uint64_t flags, fid_mr** mr) {
  const fi_ops_mr* orig = original(state().mr_ops, domain);
  const fi_hmem_iface iface = attr->iface;
  {
    std::lock_guard<std::mutex> lk(state().mu);
    if (static_cast<unsigned>(iface) < 8) ++state().regs[iface];
  }
  if (iface == FI_HMEM_SYSTEM) {
    const int rc = orig->regattr(domain, attr, flags, mr);
    if (rc == 0) track(*mr, FI_HMEM_SYSTEM, attr);
    return rc;
  }
  if (iface != FI_HMEM_CUDA) return -FI_ENOSYS;  // built without ROCr / Level Zero
  for (std::size_t i = 0; i < attr->iov_count; ++i) {
    // A real fabric hands the device to the CUDA driver: a wrong one fails
    // there or, worse, names another GPU's context.
    const int device = cuda_double_device(
        reinterpret_cast<std::uintptr_t>(attr->mr_iov[i].iov_base), attr->mr_iov[i].iov_len);
    if (device < 0 || device != attr->device.cuda) {
      std::lock_guard<std::mutex> lk(state().mu);
      ++state().violations;
      char text[160];
      if (device < 0)
        std::snprintf(text, sizeof(text),
                      "an FI_HMEM_CUDA registration of memory that is not the CUDA double's");
      else
        std::snprintf(text, sizeof(text),
                      "an FI_HMEM_CUDA registration naming device.cuda %d for memory of CUDA "
                      "device %d",
                      attr->device.cuda, device);
      state().last_violation = text;
      std::fprintf(stderr, "fake-hmem-fabric: VIOLATION: %s (%p, %zu B)\n", text,
                   attr->mr_iov[i].iov_base, attr->mr_iov[i].iov_len);
      return -FI_EINVAL;
    }
  }
  // The CUDA double's device memory is host memory: the real fabric
  // registers it as such.
  fi_mr_attr host = *attr;
  host.iface = FI_HMEM_SYSTEM;
  host.device.reserved = 0;
  const int rc = orig->regattr(domain, &host, flags, mr);
  if (rc == 0) track(*mr, FI_HMEM_CUDA, attr);
  return rc;
}

int mr_reg(fid* domain, const void* buf, size_t len, uint64_t access, uint64_t offset,
           uint64_t requested_key, uint64_t flags, fid_mr** mr, void* context) {
  const iovec iov{const_cast<void*>(buf), len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.offset = offset;
  attr.requested_key = requested_key;
  attr.context = context;
  return mr_regattr(domain, &attr, flags, mr);
}

// --- endpoints, domains, fabrics ---------------------------------------------------

int d_endpoint(fid_domain* domain, fi_info* info, fid_ep** ep, void* context) {
  const fi_ops_domain* orig = original(state().domain_ops, domain);
  fi_info* plain = real().dupinfo(info);
  if (plain == nullptr) return -FI_ENOMEM;
  strip_hmem(plain);
  const int rc = orig->endpoint(domain, plain, ep, context);
  real().freeinfo(plain);
  if (rc != 0 || (*ep)->tagged == nullptr) return rc;
  auto* ops = kept_copy_ops((*ep)->tagged);
  ops->recv = t_recv;
  ops->send = t_send;
  ops->inject = t_inject;
  ops->senddata = t_senddata;
  ops->injectdata = t_injectdata;
  std::lock_guard<std::mutex> lk(state().mu);
  state().tagged_ops[*ep] = (*ep)->tagged;
  (*ep)->tagged = ops;
  return 0;
}

int f_domain(fid_fabric* fabric, fi_info* info, fid_domain** domain, void* context) {
  const fi_ops_fabric* orig = original(state().fabric_ops, fabric);
  fi_info* plain = real().dupinfo(info);
  if (plain == nullptr) return -FI_ENOMEM;
  strip_hmem(plain);
  const int rc = orig->domain(fabric, plain, domain, context);
  real().freeinfo(plain);
  if (rc != 0) return rc;
  auto* dops = kept_copy_ops((*domain)->ops);
  dops->endpoint = d_endpoint;
  auto* mops = kept_copy_ops((*domain)->mr);
  mops->reg = mr_reg;
  // regv passes through unchecked: the provider registers with fi_mr_regattr.
  mops->regattr = mr_regattr;
  std::lock_guard<std::mutex> lk(state().mu);
  // Keyed by the fid too: fi_mr_regattr passes &domain->fid.
  state().domain_ops[*domain] = (*domain)->ops;
  state().mr_ops[&(*domain)->fid] = (*domain)->mr;
  (*domain)->ops = dops;
  (*domain)->mr = mops;
  return 0;
}

}  // namespace

// --- the exported libfabric entry points -------------------------------------------

FAKE_EXPORT int fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags,
                           const struct fi_info* hints, struct fi_info** info) {
  const Real& r = real();
  if (hints == nullptr) return r.getinfo(version, node, service, flags, hints, info);
  const bool want_hmem = (hints->caps & FI_HMEM) != 0;
  const bool offers_mr_hmem =
      hints->domain_attr != nullptr && (hints->domain_attr->mr_mode & FI_MR_HMEM) != 0;
  fi_info* plain = r.dupinfo(hints);
  if (plain == nullptr) return -FI_ENOMEM;
  strip_hmem(plain);
  const int rc = r.getinfo(version, node, service, flags, plain, info);
  r.freeinfo(plain);
  if (rc != 0 || !want_hmem) return rc;
  for (fi_info* i = *info; i != nullptr; i = i->next) {
    i->caps |= FI_HMEM;
    if (i->tx_attr != nullptr) i->tx_attr->caps |= FI_HMEM;
    if (i->rx_attr != nullptr) i->rx_attr->caps |= FI_HMEM;
    // Device buffers must come registered, with their descriptor: the mode
    // a caller that offers it is held to.
    if (offers_mr_hmem && i->domain_attr != nullptr) i->domain_attr->mr_mode |= FI_MR_HMEM;
  }
  return 0;
}

FAKE_EXPORT void fi_freeinfo(struct fi_info* info) { real().freeinfo(info); }

FAKE_EXPORT struct fi_info* fi_dupinfo(const struct fi_info* info) { return real().dupinfo(info); }

FAKE_EXPORT int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context) {
  const int rc = real().fabric(attr, fabric, context);
  if (rc != 0) return rc;
  auto* ops = kept_copy_ops((*fabric)->ops);
  ops->domain = f_domain;
  ops->domain2 = nullptr;  // 1.17's fi_domain uses domain; a newer caller gets -FI_ENOSYS
  std::lock_guard<std::mutex> lk(state().mu);
  state().fabric_ops[*fabric] = (*fabric)->ops;
  (*fabric)->ops = ops;
  return 0;
}

FAKE_EXPORT const char* fi_strerror(int errnum) { return real().strerror(errnum); }

FAKE_EXPORT uint32_t fi_version(void) { return real().version(); }

// --- counters for tests ------------------------------------------------------------

// fi_mr_regattr calls asking for memory interface `iface` (FI_HMEM_SYSTEM 0,
// FI_HMEM_CUDA 1, ...), refused ones included; and those registrations
// still open.
FAKE_EXPORT uint64_t fake_hmem_fabric_regs(int iface) {
  std::lock_guard<std::mutex> lk(state().mu);
  return iface >= 0 && iface < 8 ? state().regs[iface] : 0;
}
FAKE_EXPORT int64_t fake_hmem_fabric_live(int iface) {
  std::lock_guard<std::mutex> lk(state().mu);
  return iface >= 0 && iface < 8 ? state().live[iface] : 0;
}
// Tagged sends (send != 0) or receives posted on FI_HMEM_CUDA memory with
// its registration's descriptor, and the bytes they named.
FAKE_EXPORT uint64_t fake_hmem_fabric_device_transfers(int send) {
  std::lock_guard<std::mutex> lk(state().mu);
  return send != 0 ? state().device_sends : state().device_recvs;
}
FAKE_EXPORT uint64_t fake_hmem_fabric_device_bytes(void) {
  std::lock_guard<std::mutex> lk(state().mu);
  return state().device_bytes;
}
// Transfers that touched FI_HMEM_CUDA memory without its descriptor (or by
// fi_tinject), and CUDA registrations of memory that is not the double's.
FAKE_EXPORT uint64_t fake_hmem_fabric_violations(void) {
  std::lock_guard<std::mutex> lk(state().mu);
  return state().violations;
}
