// SPDX-License-Identifier: Apache-2.0
// The v1 descriptor adapter on descriptors built in memory: the layout
// rules that no well-behaved test provider can exercise (structs longer
// than ours, parameter arrays with a foreign stride, symbols smaller than
// they claim).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "common/log.hpp"
#include "provider/abi.hpp"
#include "provider/host_services.hpp"

using wia::provider_abi::adapt_v1;
using wia::provider_abi::Descriptor;
using wia::provider_abi::SymbolInfo;

namespace {

wia_status_t fake_init(const wia_host_services_v1_t*, void**) { return WIA_SUCCESS; }
wia_status_t fake_fini(void*) { return WIA_SUCCESS; }
void never_called() {}

// A table whose every entry is set (to a function never called): each test
// then clears what it needs to. Every field after must_understand is an
// entry, in both tables.
template <typename Table>
Table full_table() {
  Table table;
  std::memset(&table, 0, sizeof(table));
  void (*fn)() = never_called;
  auto* bytes = reinterpret_cast<unsigned char*>(&table);
  for (std::size_t offset = offsetof(Table, must_understand) + sizeof(table.must_understand);
       offset + sizeof(fn) <= sizeof(table); offset += sizeof(fn))
    std::memcpy(bytes + offset, &fn, sizeof(fn));
  table.struct_size = sizeof(table);
  table.abi_version = 1;
  return table;
}

wia_provider_v1_t descriptor() {
  wia_provider_v1_t d{};
  d.struct_size = sizeof(d);
  d.abi_version = WIA_PROVIDER_ABI_VERSION;
  d.name = "fake";
  d.version = "1.2.3";
  d.host_services_version = WIA_HOST_SERVICES_VERSION;
  d.init = fake_init;
  d.fini = fake_fini;
  return d;
}

template <typename T>
std::string adapt(const T& object, Descriptor* out, std::size_t symbol_size = sizeof(T)) {
  return adapt_v1(SymbolInfo{&object, symbol_size}, out);
}

}  // namespace

// Function pointers are compared inside extra parentheses: doctest cannot
// print them.
TEST_CASE("a valid device descriptor is adapted with its tables copied") {
  auto device = full_table<wia_device_ops_v1_t>();
  device.caps = WIA_DEVICE_CAP_HOST_FUNC;
  device.event_elapsed_ms = nullptr;  // optional and not announced: fine
  auto d = descriptor();
  d.caps = WIA_PROVIDER_CAP_DEVICE;
  d.device = &device;
  Descriptor out;
  CHECK(adapt(d, &out) == "");
  CHECK(out.name == "fake");
  CHECK(out.version == "1.2.3");
  CHECK(out.abi_version == 1);
  CHECK(out.caps == WIA_PROVIDER_CAP_DEVICE);
  CHECK((out.init == fake_init));
  CHECK((out.fini == fake_fini));
  REQUIRE(out.device.has_value());
  CHECK(!out.transport.has_value());
  CHECK(out.device->caps == WIA_DEVICE_CAP_HOST_FUNC);
  CHECK((out.device->launch_host_func != nullptr));
  CHECK((out.device->event_elapsed_ms == nullptr));
}

TEST_CASE("a table longer than ours (a later v1 header) is accepted and read up to our size") {
  struct Longer {
    wia_transport_ops_v1_t ops;
    void (*appended_entry)();
  } longer;
  longer.ops = full_table<wia_transport_ops_v1_t>();
  longer.ops.struct_size = sizeof(longer);
  longer.appended_entry = never_called;
  auto d = descriptor();
  d.caps = WIA_PROVIDER_CAP_TRANSPORT;
  d.transport = &longer.ops;
  Descriptor out;
  CHECK(adapt(d, &out) == "");
  REQUIRE(out.transport.has_value());
  CHECK((out.transport->get != nullptr));
}

TEST_CASE("known must-understand bits are accepted, unknown ones refused") {
  auto transport = full_table<wia_transport_ops_v1_t>();
  auto d = descriptor();
  d.caps = WIA_PROVIDER_CAP_TRANSPORT;
  d.transport = &transport;
  Descriptor out;
  transport.must_understand = WIA_TRANSPORT_REQ_ORDERED_RECV;
  CHECK(adapt(d, &out) == "");
  transport.must_understand = WIA_TRANSPORT_REQ_ORDERED_RECV | (1ull << 5);
  CHECK(adapt(d, &out) ==
        "transport table: must_understand has bit(s) 0x20 this libwia does not know");
}

TEST_CASE("parameter declarations are read with the provider's stride") {
  struct LongerDecl {
    wia_param_decl_v1_t decl;
    std::uint64_t appended;
  };
  LongerDecl params[2] = {};
  const char* keys[2] = {"alpha", "beta"};
  for (int i = 0; i < 2; ++i) {
    params[i].decl.struct_size = sizeof(LongerDecl);
    params[i].decl.type = WIA_PARAM_INT;
    params[i].decl.key = keys[i];
    params[i].decl.default_value = "1";
    params[i].appended = 0xdeadbeef;
  }
  auto device = full_table<wia_device_ops_v1_t>();
  auto d = descriptor();
  d.caps = WIA_PROVIDER_CAP_DEVICE;
  d.device = &device;
  d.num_params = 2;
  d.params = &params[0].decl;
  Descriptor out;
  CHECK(adapt(d, &out) == "");
  REQUIRE(out.params.size() == 2);
  CHECK(std::string(out.params[0].key) == "alpha");
  CHECK(std::string(out.params[1].key) == "beta");
  CHECK(out.params[1].struct_size == sizeof(wia_param_decl_v1_t));

  params[1].decl.struct_size = sizeof(wia_param_decl_v1_t);
  CHECK(adapt(d, &out).find("params[1]: struct_size") == 0);
  d.params = nullptr;
  CHECK(adapt(d, &out) == "num_params is 2 but params is NULL");
}

TEST_CASE("descriptor defects are refused with a message naming them") {
  auto device = full_table<wia_device_ops_v1_t>();
  auto transport = full_table<wia_transport_ops_v1_t>();
  auto d = descriptor();
  d.caps = WIA_PROVIDER_CAP_DEVICE;
  d.device = &device;
  Descriptor out;

  SUBCASE("a symbol too small to hold the header") {
    CHECK(adapt(d, &out, 4) ==
          "wia_provider_v1 is a 4-byte object, too small to be a provider descriptor");
  }
  SUBCASE("a struct_size larger than the exported object") {
    CHECK(adapt(d, &out, sizeof(d) - 8).find("exceeds the") != std::string::npos);
  }
  SUBCASE("abi_version 0") {
    d.abi_version = 0;
    CHECK(adapt(d, &out) == "wia_provider_v1 announces abi_version 0, expected 1");
  }
  SUBCASE("fini missing") {
    d.fini = nullptr;
    CHECK(adapt(d, &out) == "descriptor: required entry 'fini' is NULL");
  }
  SUBCASE("a NULL name") {
    d.name = nullptr;
    CHECK(adapt(d, &out) == "descriptor name is NULL");
  }
  SUBCASE("a name with control bytes is quoted safely") {
    d.name = "bad\nname";
    CHECK(adapt(d, &out).find("'bad\\x0aname'") != std::string::npos);
  }
  SUBCASE("neither interface") {
    d.caps = 0;
    d.device = nullptr;
    CHECK(adapt(d, &out).find("offers neither a device nor a transport") == 0);
  }
  SUBCASE("a table without its cap bit") {
    d.transport = &transport;
    CHECK(adapt(d, &out) == "the transport table is set but caps lacks WIA_PROVIDER_CAP_TRANSPORT");
  }
  SUBCASE("an implausible table size") {
    device.struct_size = 1u << 30;
    CHECK(adapt(d, &out).find("device table: struct_size 1073741824 is not plausible") == 0);
  }
  SUBCASE("a table shorter than v1") {
    device.struct_size = 16;
    CHECK(adapt(d, &out).find("device table: struct_size is 16 bytes, smaller than the") == 0);
  }
  SUBCASE("a transport optional entry missing under its cap") {
    d.caps = WIA_PROVIDER_CAP_TRANSPORT;
    d.device = nullptr;
    d.transport = &transport;
    transport.caps = WIA_TRANSPORT_CAP_RMA;
    transport.mr_rkey = nullptr;
    CHECK(adapt(d, &out) ==
          "transport table: optional entry 'mr_rkey' is NULL but WIA_TRANSPORT_CAP_RMA is set in "
          "caps");
  }
  SUBCASE("the inline cap claimed by a table that ends before its entries") {
    // A provider built against the first v1 header cannot have them: the
    // padded copy reads them as NULL, and the claim is refused.
    d.caps = WIA_PROVIDER_CAP_TRANSPORT;
    d.device = nullptr;
    d.transport = &transport;
    transport.caps = WIA_TRANSPORT_CAP_INLINE;
    transport.struct_size = offsetof(wia_transport_ops_v1_t, send_inline);
    CHECK(adapt(d, &out) ==
          "transport table: optional entry 'send_inline' is NULL but WIA_TRANSPORT_CAP_INLINE is "
          "set in caps");
  }
  SUBCASE("can_access_peer is required even without the peer cap") {
    device.can_access_peer = nullptr;
    CHECK(adapt(d, &out) == "device table: required entry 'can_access_peer' is NULL");
  }
}

TEST_CASE("host services: log_enabled follows the core's log threshold") {
  wia::provider_host::HostContext context{"test", nullptr};
  const wia_host_services_v1_t host = wia::provider_host::make_host_services(&context);
  REQUIRE(WIA_ABI_HAS_FIELD(wia_host_services_v1_t, host.struct_size, log_enabled));
  REQUIRE((host.log_enabled != nullptr));
  wia::log::configure(wia::log::Level::info, "");
  CHECK(host.log_enabled(host.host_ctx, WIA_LOG_TRACE) == 0);
  CHECK(host.log_enabled(host.host_ctx, WIA_LOG_DEBUG) == 0);
  CHECK(host.log_enabled(host.host_ctx, WIA_LOG_INFO) != 0);
  CHECK(host.log_enabled(host.host_ctx, WIA_LOG_ERROR) != 0);
  wia::log::configure(wia::log::Level::trace, "");
  CHECK(host.log_enabled(host.host_ctx, WIA_LOG_TRACE) != 0);
  wia::log::configure(wia::log::Level::warn, "");
}
