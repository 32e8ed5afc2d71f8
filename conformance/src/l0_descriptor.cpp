// SPDX-License-Identifier: Apache-2.0
// Level 0: the descriptor, the tables and discovery. Nothing here touches
// device memory, so a provider that fails L0 is not worth testing further.
#include <cstddef>
#include <cstring>
#include <cstdio>
#include <string>

#include "harness.hpp"

namespace wia::conformance {
namespace {

constexpr int kTimeout = 10000;

bool valid_name(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* p = name; *p != '\0'; ++p)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) return false;
  return true;
}

std::string basename_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Every error a provider returns should be explained (provider.h, Errors).
void expect_error_with_text(Context& c, wia_status_t st, const std::string& call) {
  const std::string text = c.take_error();
  c.expect(st < 0 && st >= -15, call + " to return a negative WIA_ERROR_* code", status_text(st));
  c.expect(!text.empty(), call + " to explain its error through host->set_error",
           status_text(st) + " with no set_error message");
}

void symbol(Context& c) {
  // The parent refused files without the symbol; reaching here means the
  // symbol resolved. Check it points at readable, sane memory.
  c.expect(c.desc().struct_size > 0, "a non-empty descriptor", "struct_size 0");
}

void abi_version(Context& c) {
  c.expect(c.desc().abi_version >= 1 && c.desc().abi_version <= WIA_PROVIDER_ABI_VERSION,
           "abi_version in [1, " + std::to_string(WIA_PROVIDER_ABI_VERSION) + "]",
           std::to_string(c.desc().abi_version));
  c.expect(c.desc().host_services_version >= 1 &&
               c.desc().host_services_version <= WIA_HOST_SERVICES_VERSION,
           "host_services_version in [1, " + std::to_string(WIA_HOST_SERVICES_VERSION) + "]",
           std::to_string(c.desc().host_services_version));
}

void struct_sizes(Context& c) {
  const auto& d = c.desc();
  c.expect(WIA_ABI_HAS_FIELD(wia_provider_v1_t, d.struct_size, transport),
           "descriptor struct_size >= " + std::to_string(sizeof(wia_provider_v1_t)) +
               " (every v1 field present)",
           std::to_string(d.struct_size));
  if ((d.caps & WIA_PROVIDER_CAP_DEVICE) && d.device != nullptr) {
    c.expect(WIA_ABI_HAS_FIELD(wia_device_ops_v1_t, d.device->struct_size, reduce_async),
             "device table struct_size >= " + std::to_string(sizeof(wia_device_ops_v1_t)),
             std::to_string(d.device->struct_size));
    c.expect(d.device->abi_version == d.abi_version,
             "device table abi_version == descriptor abi_version (" +
                 std::to_string(d.abi_version) + ")",
             std::to_string(d.device->abi_version));
  }
  if ((d.caps & WIA_PROVIDER_CAP_TRANSPORT) && d.transport != nullptr) {
    c.expect(WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, d.transport->struct_size, get),
             "transport table struct_size >= " + std::to_string(sizeof(wia_transport_ops_v1_t)),
             std::to_string(d.transport->struct_size));
    c.expect(d.transport->abi_version == d.abi_version,
             "transport table abi_version == descriptor abi_version",
             std::to_string(d.transport->abi_version));
  }
  if (d.num_params > 0 && d.params != nullptr)
    c.expect(d.params[0].struct_size >= sizeof(wia_param_decl_v1_t),
             "params[0].struct_size >= " + std::to_string(sizeof(wia_param_decl_v1_t)),
             std::to_string(d.params[0].struct_size));
}

void name(Context& c) {
  const auto& d = c.desc();
  c.expect(valid_name(d.name), "name matching [a-z0-9_]+",
           d.name == nullptr ? "NULL" : "'" + std::string(d.name) + "'");
  c.expect(d.version != nullptr && *d.version != '\0', "a non-empty version string",
           d.version == nullptr ? "NULL" : "\"\"");
  // The core finds providers by file name; a mismatch makes the provider
  // unreachable by the name users configure.
  const std::string file = basename_of(c.options().provider_path);
  const std::string prefix = "libwia-provider-", suffix = ".so";
  if (file.size() > prefix.size() + suffix.size() && file.compare(0, prefix.size(), prefix) == 0 &&
      file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string from_file =
        file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
    c.expect(from_file == d.name, "name equal to the file name's NAME ('" + from_file + "')",
             "'" + std::string(d.name) + "'");
  }
}

void required_entries(Context& c) {
  const auto& d = c.desc();
  c.expect(d.init != nullptr && d.fini != nullptr, "init and fini set", "a NULL init or fini");
  c.expect(((d.caps & WIA_PROVIDER_CAP_DEVICE) != 0) == (d.device != nullptr),
           "device table non-NULL iff WIA_PROVIDER_CAP_DEVICE",
           d.device != nullptr ? "a table without the cap" : "the cap without a table");
  c.expect(((d.caps & WIA_PROVIDER_CAP_TRANSPORT) != 0) == (d.transport != nullptr),
           "transport table non-NULL iff WIA_PROVIDER_CAP_TRANSPORT",
           d.transport != nullptr ? "a table without the cap" : "the cap without a table");
  c.expect(d.caps & (WIA_PROVIDER_CAP_DEVICE | WIA_PROVIDER_CAP_TRANSPORT),
           "at least one of CAP_DEVICE, CAP_TRANSPORT", "caps without either interface");
  std::string missing;
  auto need = [&](const void* fn, const char* entry) {
    if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + entry;
  };
  if (const auto* o = d.device) {
#define WIA_NEED(e) need(reinterpret_cast<const void*>(o->e), #e)
    WIA_NEED(device_count);
    WIA_NEED(device_props);
    WIA_NEED(mem_alloc);
    WIA_NEED(mem_free);
    WIA_NEED(memset);
    WIA_NEED(memcpy);
    WIA_NEED(stream_create);
    WIA_NEED(stream_destroy);
    WIA_NEED(stream_synchronize);
    WIA_NEED(stream_query);
    WIA_NEED(memset_async);
    WIA_NEED(memcpy_async);
    WIA_NEED(event_create);
    WIA_NEED(event_destroy);
    WIA_NEED(event_record);
    WIA_NEED(event_query);
    WIA_NEED(event_synchronize);
    WIA_NEED(stream_wait_event);
    WIA_NEED(can_access_peer);
#undef WIA_NEED
  }
  if (const auto* o = d.transport) {
#define WIA_NEED(e) need(reinterpret_cast<const void*>(o->e), "transport." #e)
    WIA_NEED(endpoint_count);
    WIA_NEED(endpoint_props);
    WIA_NEED(listen);
    WIA_NEED(connect);
    WIA_NEED(accept);
    WIA_NEED(close_listener);
    WIA_NEED(reg_mr);
    WIA_NEED(dereg_mr);
    WIA_NEED(isend);
    WIA_NEED(irecv);
    WIA_NEED(test);
    WIA_NEED(close);
#undef WIA_NEED
  }
  c.expect(missing.empty(), "every required entry point set", "NULL: " + missing);
}

void optional_entries(Context& c) {
  const auto& d = c.desc();
  std::string wrong;
  auto check = [&](std::uint64_t caps, std::uint64_t bit, const char* cap, const void* fn,
                   const char* entry) {
    const bool claimed = (caps & bit) != 0;
    if (claimed != (fn != nullptr))
      wrong += std::string(wrong.empty() ? "" : "; ") + entry +
               (claimed ? " is NULL although " : " is set without ") + cap;
  };
  if (const auto* o = d.device) {
#define WIA_OPT(bit, e) \
  check(o->caps, WIA_DEVICE_CAP_##bit, "CAP_" #bit, reinterpret_cast<const void*>(o->e), #e)
    WIA_OPT(EVENT_TIMING, event_elapsed_ms);
    WIA_OPT(HOST_FUNC, launch_host_func);
    WIA_OPT(PEER, enable_peer_access);
    WIA_OPT(PEER, memcpy_peer_async);
    WIA_OPT(IPC, ipc_get_handle);
    WIA_OPT(IPC, ipc_open_handle);
    WIA_OPT(IPC, ipc_close_handle);
    WIA_OPT(REDUCE, reduce_async);
#undef WIA_OPT
    // Appended entries exist only in tables long enough to hold them; a
    // shorter (older) table cannot claim their bits.
    const bool has_scale = WIA_ABI_HAS_FIELD(wia_device_ops_v1_t, o->struct_size, scale_async);
    check(o->caps, WIA_DEVICE_CAP_SCALE, "CAP_SCALE",
          has_scale ? reinterpret_cast<const void*>(o->scale_async) : nullptr, "scale_async");
    const bool has_kernel = WIA_ABI_HAS_FIELD(wia_device_ops_v1_t, o->struct_size, launch_kernel);
#define WIA_OPT_APPENDED(e)                                                               \
  check(o->caps, WIA_DEVICE_CAP_KERNEL, "CAP_KERNEL",                                     \
        has_kernel ? reinterpret_cast<const void*>(o->e) : nullptr, #e)
    WIA_OPT_APPENDED(module_load);
    WIA_OPT_APPENDED(module_unload);
    WIA_OPT_APPENDED(module_function);
    WIA_OPT_APPENDED(launch_kernel);
#undef WIA_OPT_APPENDED
    const bool has_dmabuf =
        WIA_ABI_HAS_FIELD(wia_device_ops_v1_t, o->struct_size, mem_export_dmabuf);
    check(o->caps, WIA_DEVICE_CAP_DMABUF, "CAP_DMABUF",
          has_dmabuf ? reinterpret_cast<const void*>(o->mem_export_dmabuf) : nullptr,
          "mem_export_dmabuf");
    char caps_hex[32];
    std::snprintf(caps_hex, sizeof(caps_hex), "caps 0x%llx",
                  static_cast<unsigned long long>(o->caps));
    c.expect(o->caps < (1ull << 9), "only device caps defined in ABI v1 (bits 0..8)", caps_hex);
  }
  if (const auto* o = d.transport) {
    check(o->caps, WIA_TRANSPORT_CAP_RMA, "CAP_RMA", reinterpret_cast<const void*>(o->put), "put");
    check(o->caps, WIA_TRANSPORT_CAP_RMA, "CAP_RMA", reinterpret_cast<const void*>(o->get), "get");
    check(o->caps, WIA_TRANSPORT_CAP_RMA, "CAP_RMA", reinterpret_cast<const void*>(o->mr_rkey),
          "mr_rkey");
    // Appended after the first v1 release: a table built against an older
    // header ends before them, and they count as NULL.
    const bool has_inline =
        WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o->struct_size, recv_inline);
    check(o->caps, WIA_TRANSPORT_CAP_INLINE, "CAP_INLINE",
          has_inline ? reinterpret_cast<const void*>(o->send_inline) : nullptr, "send_inline");
    check(o->caps, WIA_TRANSPORT_CAP_INLINE, "CAP_INLINE",
          has_inline ? reinterpret_cast<const void*>(o->recv_inline) : nullptr, "recv_inline");
    const bool has_wait_fds =
        WIA_ABI_HAS_FIELD(wia_transport_ops_v1_t, o->struct_size, wait_fds);
    check(o->caps, WIA_TRANSPORT_CAP_WAIT_FD, "CAP_WAIT_FD",
          has_wait_fds ? reinterpret_cast<const void*>(o->wait_fds) : nullptr, "wait_fds");
  }
  c.expect(wrong.empty(), "optional entries non-NULL exactly when their capability is claimed",
           wrong);
}

void must_understand(Context& c) {
  // No device bit is defined in v1: a set bit makes every v1 core refuse
  // the provider, which is never what a v1 provider means.
  if (const auto* o = c.desc().device)
    c.expect(o->must_understand == 0, "device must_understand == 0 (no bit defined in v1)",
             std::to_string(o->must_understand));
  if (const auto* o = c.desc().transport)
    c.expect((o->must_understand & ~WIA_TRANSPORT_REQ_ORDERED_RECV) == 0,
             "transport must_understand within WIA_TRANSPORT_REQ_*",
             std::to_string(o->must_understand));
}

void params(Context& c) {
  const auto& d = c.desc();
  if (d.num_params == 0) {
    c.expect(true, "", "");
    return;
  }
  c.expect(d.params != nullptr, "params set when num_params > 0", "NULL");
  const auto* base = reinterpret_cast<const unsigned char*>(d.params);
  const std::size_t stride = d.params[0].struct_size;
  for (std::uint32_t i = 0; i < d.num_params; ++i) {
    const auto* p = reinterpret_cast<const wia_param_decl_v1_t*>(base + i * stride);
    const std::string which = "params[" + std::to_string(i) + "]";
    c.expect(valid_name(p->key), which + ".key matching [a-z0-9_]+",
             p->key == nullptr ? "NULL" : "'" + std::string(p->key) + "'");
    c.expect(p->default_value != nullptr, which + " (" + p->key + ") with a default value", "NULL");
    c.expect(p->type >= WIA_PARAM_INT && p->type <= WIA_PARAM_SIZE,
             which + " with a WIA_PARAM_* type", std::to_string(p->type));
    c.expect(p->description != nullptr && *p->description != '\0',
             which + " (" + p->key + ") with a description", "none");
    if (p->type == WIA_PARAM_INT || p->type == WIA_PARAM_SIZE)
      c.expect(p->min_value <= p->max_value, which + " with min_value <= max_value",
               std::to_string(p->min_value) + " > " + std::to_string(p->max_value));
    if (p->type == WIA_PARAM_BOOL)
      c.expect(
          std::strcmp(p->default_value, "true") == 0 || std::strcmp(p->default_value, "false") == 0,
          which + " (" + p->key + ") default 'true' or 'false'", p->default_value);
  }
}

void init_fini(Context& c) {
  c.init();
  c.fini();
}

void init_again(Context& c) {
  // A core may unload and reload a provider (tests, elastic jobs): init
  // after fini must start from a clean state.
  c.init();
  c.fini();
  c.init();
  if (c.desc().device != nullptr) {
    std::int32_t n = -1;
    c.ok(c.dev_ops().device_count(c.ctx(), &n), "device_count after re-init");
  }
  c.fini();
}

void unknown_param(Context& c) {
  // get_param answers NULL for every key, as for keys the core does not
  // know: the provider must fall back to its defaults or fail cleanly.
  c.set_params_visible(false);
  void* ctx = nullptr;
  c.step("init with get_param answering NULL for every key");
  const wia_status_t st = c.desc().init(c.host(), &ctx);
  if (st == WIA_SUCCESS) {
    c.step("fini");
    c.ok(c.desc().fini(ctx), "fini");
  } else if (st != WIA_ERROR_UNAVAILABLE) {
    expect_error_with_text(c, st, "init without parameters");
  }
}

void device_count(Context& c) {
  (void)c.dev_ops();
  const int n = c.device_count();
  c.expect(n >= 0 && n <= 4096, "device_count in [0, 4096]", std::to_string(n));
}

void device_props(Context& c) {
  const auto& o = c.dev_ops();
  const int n = c.device_count();
  for (int dev = 0; dev < n; ++dev) {
    wia_device_props_v1_t p;
    std::memset(&p, 0xEE, sizeof(p));
    p.struct_size = sizeof(p);
    const std::string which = "device_props(" + std::to_string(dev) + ")";
    c.step(which);
    c.ok(o.device_props(c.ctx(), dev, &p), which);
    c.expect(std::memchr(p.name, '\0', sizeof(p.name)) != nullptr && p.name[0] != '\0',
             which + ".name non-empty and NUL-terminated", "empty or unterminated");
    c.expect(std::memchr(p.pci_bus_id, '\0', sizeof(p.pci_bus_id)) != nullptr,
             which + ".pci_bus_id NUL-terminated", "unterminated");
    c.expect(p.type >= WIA_DEVICE_CPU && p.type <= WIA_DEVICE_ACCELERATOR,
             which + ".type a WIA_DEVICE_* value", std::to_string(p.type));
    c.expect(p.alignment >= 1 && (p.alignment & (p.alignment - 1)) == 0,
             which + ".alignment a power of two", std::to_string(p.alignment));
    c.expect(p.free_memory <= p.total_memory || p.total_memory == 0,
             which + ".free_memory <= total_memory",
             std::to_string(p.free_memory) + " > " + std::to_string(p.total_memory));
    c.expect(p.numa_node >= -1, which + ".numa_node >= -1", std::to_string(p.numa_node));
    c.expect((p.flags & ~15u) == 0, which + ".flags within WIA_DEVICE_FLAG_*",
             std::to_string(p.flags));
    c.expect(p.mem_iface <= WIA_MEM_IFACE_ZE, which + ".mem_iface a WIA_MEM_IFACE_* value",
             std::to_string(p.mem_iface));
    if (p.flags & WIA_DEVICE_FLAG_MEM_DEVICE)
      c.expect(p.mem_device >= 0, which + ".mem_device a vendor ordinal (>= 0) with "
               "WIA_DEVICE_FLAG_MEM_DEVICE", std::to_string(p.mem_device));
  }
  for (const int bad : {n, n + 7, -1}) {
    wia_device_props_v1_t p{};
    p.struct_size = sizeof(p);
    const std::string which = "device_props(" + std::to_string(bad) + ") (out of range)";
    c.step(which);
    const wia_status_t st = o.device_props(c.ctx(), bad, &p);
    c.expect(st < 0, which + " to fail, preferably with WIA_ERROR_INVALID_DEVICE", status_text(st));
    expect_error_with_text(c, st, which);
  }
}

void props_short_struct(Context& c) {
  // An older caller passes a shorter struct: the provider must fill only
  // struct_size bytes (provider.h, device_props).
  const auto& o = c.dev_ops();
  const int dev = c.device();
  constexpr std::size_t kShort = offsetof(wia_device_props_v1_t, pci_bus_id);
  unsigned char buf[sizeof(wia_device_props_v1_t) + 64];
  std::memset(buf, 0xA5, sizeof(buf));
  wia_device_props_v1_t head{};
  head.struct_size = kShort;
  std::memcpy(buf, &head, sizeof(head.struct_size));
  c.step("device_props with struct_size " + std::to_string(kShort));
  c.ok(o.device_props(c.ctx(), dev, reinterpret_cast<wia_device_props_v1_t*>(buf)),
       "device_props(struct_size " + std::to_string(kShort) + ")");
  for (std::size_t i = kShort; i < sizeof(buf); ++i)
    c.expect(buf[i] == 0xA5, "no byte written past struct_size " + std::to_string(kShort),
             "byte " + std::to_string(i) + " written");
}

void errors(Context& c) {
  const auto& o = c.dev_ops();
  const int n = c.device_count();
  void* p = nullptr;
  c.step("mem_alloc on device " + std::to_string(n) + " (out of range)");
  wia_status_t st = o.mem_alloc(c.ctx(), n, 64, WIA_MEM_DEVICE, &p);
  c.expect(st < 0, "mem_alloc on a device out of range to fail", status_text(st));
  expect_error_with_text(c, st, "mem_alloc(device " + std::to_string(n) + ")");
  wia_provider_stream_t s = nullptr;
  c.step("stream_create on device " + std::to_string(n) + " (out of range)");
  st = o.stream_create(c.ctx(), n, &s);
  c.expect(st < 0, "stream_create on a device out of range to fail", status_text(st));
  expect_error_with_text(c, st, "stream_create(device " + std::to_string(n) + ")");
  wia_provider_event_t e = nullptr;
  c.step("event_create on device -1");
  st = o.event_create(c.ctx(), -1, &e);
  c.expect(st < 0, "event_create on device -1 to fail", status_text(st));
  expect_error_with_text(c, st, "event_create(device -1)");
}

}  // namespace

void register_l0_tests() {
  auto add = [](const char* id, const char* what, void (*fn)(Context&)) {
    registry().push_back({id, 0, kTimeout, what, fn, {}});
  };
  add("L0.symbol", "wia_provider_v1 resolves to a descriptor", symbol);
  add("L0.abi_version", "abi_version and host_services_version known to this ABI", abi_version);
  add("L0.struct_sizes", "descriptor, tables and params hold every v1 field", struct_sizes);
  add("L0.name", "name is [a-z0-9_]+ and matches the file name; version set", name);
  add("L0.required_entries", "required entry points non-NULL; tables match caps", required_entries);
  add("L0.optional_entries", "optional entries non-NULL exactly when their cap is claimed",
      optional_entries);
  add("L0.must_understand", "no must-understand bit unknown to ABI v1", must_understand);
  add("L0.params", "declared parameters are well formed", params);
  add("L0.init_fini", "init then fini succeed", init_fini);
  add("L0.init_again", "init, fini, init again, fini (re-initialisation)", init_again);
  add("L0.unknown_param", "init survives get_param answering NULL", unknown_param);
  add("L0.device_count", "device_count >= 0", device_count);
  add("L0.device_props", "props of every device valid; out-of-range index is an error",
      device_props);
  add("L0.device_props.short_struct", "device_props writes no more than struct_size bytes",
      props_short_struct);
  add("L0.errors", "errors are negative codes explained through set_error", errors);
}

}  // namespace wia::conformance
