// SPDX-License-Identifier: Apache-2.0
// Inputs the fuzz targets (fuzz/) found to break libwia, each checked here
// in the ordinary suites: the failure it caused and the error it must give
// instead. The fuzz input of each is fuzz/corpus/<target>/regress-<name>.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "bootstrap/root.hpp"
#include "bootstrap/siphash.hpp"
#include "bootstrap/wire.hpp"
#include "checkpoint/format.hpp"
#include "common/error.hpp"
#include "config/config.hpp"
#include "fuzz/fuzz_secret.hpp"
#include "provider/abi.hpp"
#include "topology/topology.hpp"

namespace {

std::string corpus_file(const std::string& target, const std::string& name) {
  std::ifstream f(std::string(WIA_TEST_SOURCE_DIR) + "/fuzz/corpus/" + target + "/" + name,
                  std::ios::binary);
  REQUIRE(f.good());
  return {std::istreambuf_iterator<char>(f), {}};
}

wia::EnvLookup no_env() {
  return [](const char*) -> const char* { return nullptr; };
}

wia_status_t fake_init(const wia_host_services_v1_t*, void**) { return WIA_SUCCESS; }
wia_status_t fake_fini(void*) { return WIA_SUCCESS; }
void never_called() {}

}  // namespace

TEST_CASE(
    "config: a file yaml-cpp reads as endless empty documents is refused, not loaded forever") {
  // yaml-cpp 0.7's LoadAll never returned on this text and allocated until
  // the process died; the loader now stops at the second document.
  const std::string text = corpus_file("config", "regress-endless-documents.yaml");
  try {
    (void)wia::Config::parse(text, "f.yaml", no_env());
    FAIL("accepted");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_CONFIG);
    CHECK_MESSAGE(std::string(e.what()).find("f.yaml holds more than one YAML document") == 0,
                  e.what());
  }
  // One document, and an empty file, still load.
  CHECK_NOTHROW((void)wia::Config::parse("log: {level: warn}\n", "f.yaml", no_env()));
  CHECK_NOTHROW((void)wia::Config::parse("# nothing\n", "f.yaml", no_env()));
  CHECK_NOTHROW((void)wia::Config::parse("", "f.yaml", no_env()));
}

TEST_CASE(
    "checkpoint: a manifest of the wrong shape with a valid checksum is WIA_ERROR_CORRUPT naming "
    "the file") {
  // yaml-cpp's BadSubscript escaped parse_shard_manifest as an unknown
  // exception instead of the corruption error a restore reports.
  namespace ck = wia::checkpoint;
  auto signed_text = [](const std::string& body) {
    return body + fmt::format("# xxh3 {:016x}\n", ck::checksum(body));
  };
  const std::string path = "ckpt-00000001/rank-00000.yaml";
  for (const std::string& body :
       {std::string("just a scalar\n"), std::string("- a\n- list\n"),
        std::string("format_version: 1\nseq: 1\nrank: 0\nnranks: 1\nshard_mode: sharded\n"
                    "compression: none\ndata_bytes: 0\ntensors: [5]\n")}) {
    try {
      (void)ck::parse_shard_manifest(signed_text(body), path);
      FAIL("accepted: " << body);
    } catch (const wia::Error& e) {
      CHECK(e.status() == WIA_ERROR_CORRUPT);
      CHECK_MESSAGE(std::string(e.what()).find(path) == 0, e.what());
    }
    try {
      (void)ck::parse_commit_record(signed_text(body), path);
      FAIL("accepted: " << body);
    } catch (const wia::Error& e) {
      CHECK(e.status() == WIA_ERROR_CORRUPT);
      CHECK_MESSAGE(std::string(e.what()).find(path) == 0, e.what());
    }
  }
}

TEST_CASE("provider ABI: a parameter array whose stride misaligns its elements is refused") {
  // A 58-byte stride made the adapter read wia_param_decl_v1_t at
  // misaligned addresses (undefined behaviour, flagged by UBSan).
  wia_device_ops_v1_t device;
  std::memset(&device, 0, sizeof(device));
  void (*fn)() = never_called;
  auto* bytes = reinterpret_cast<unsigned char*>(&device);
  for (std::size_t offset = offsetof(wia_device_ops_v1_t, must_understand) + 8;
       offset + sizeof(fn) <= sizeof(device); offset += sizeof(fn))
    std::memcpy(bytes + offset, &fn, sizeof(fn));
  device.struct_size = sizeof(device);
  device.abi_version = 1;

  constexpr std::uint32_t kStride = sizeof(wia_param_decl_v1_t) + 2;
  alignas(8) std::array<unsigned char, 2 * kStride> params{};
  for (int i = 0; i < 2; ++i) std::memcpy(params.data() + i * kStride, &kStride, 4);

  wia_provider_v1_t d{};
  d.struct_size = sizeof(d);
  d.abi_version = WIA_PROVIDER_ABI_VERSION;
  d.name = "fake";
  d.version = "1";
  d.caps = WIA_PROVIDER_CAP_DEVICE;
  d.host_services_version = WIA_HOST_SERVICES_VERSION;
  d.init = fake_init;
  d.fini = fake_fini;
  d.device = &device;
  d.num_params = 2;
  d.params = reinterpret_cast<const wia_param_decl_v1_t*>(params.data());
  wia::provider_abi::Descriptor out;
  const std::string why = wia::provider_abi::adapt_v1({&d, sizeof(d)}, &out);
  CHECK_MESSAGE(why.find("params[0]: struct_size " + std::to_string(kStride) +
                         " is not a multiple of 8") == 0,
                why);
}

TEST_CASE("bootstrap root: a refused hello followed by a malformed frame drops the connection") {
  // The refused connection (rank -1) was treated as a member: the root
  // read and wrote members[-1].
  namespace wire = wia::bootstrap::wire;
  wia::bootstrap::Secret secret;
  secret.bytes.fill(7);
  std::array<std::uint8_t, wire::kNonceBytes> server{}, client{};
  client.fill(3);
  std::vector<std::uint8_t> message(wire::kClientRole.begin(), wire::kClientRole.end());
  message.insert(message.end(), server.begin(), server.end());
  message.insert(message.end(), client.begin(), client.end());
  std::uint8_t mac[8];
  wire::store_le(mac, wia::bootstrap::siphash24(secret, message), 8);
  std::vector<std::uint8_t> bytes =
      wire::Writer(wire::FrameType::kAuth).bytes(client).bytes(mac).finish();
  // Rank 5 of a 2-rank job: refused at hello.
  const auto hello =
      wire::Writer(wire::FrameType::kHello).u32(5).u32(2).u32(1).text("h").text("n").finish();
  bytes.insert(bytes.end(), hello.begin(), hello.end());
  const std::string junk = "GET / HTTP/1.1\r\n\r\n";
  bytes.insert(bytes.end(), junk.begin(), junk.end());

  wia::bootstrap::RootServer::Settings settings;
  settings.secret = secret;
  const wia::bootstrap::RootServer::FeedChunk chunk{0, bytes};
  const auto out = wia::bootstrap::RootServer::feed_for_testing(settings, {&chunk, 1});
  REQUIRE(out.size() == 1);
  CHECK(out[0].dropped);

  // And the fuzz input that found it.
  const std::string found = corpus_file("bootstrap", "regress-refused-hello-then-garbage");
  std::vector<wia::bootstrap::RootServer::FeedChunk> chunks;
  const auto* p = reinterpret_cast<const std::uint8_t*>(found.data());
  std::size_t pos = 0;
  settings.secret = wia::fuzz::kSecret;  // the job the fuzz input was made for
  while (pos + 3 <= found.size()) {
    const std::size_t n =
        std::min<std::size_t>(p[pos + 1] | (p[pos + 2] << 8), found.size() - pos - 3);
    chunks.push_back({static_cast<std::uint8_t>(p[pos] % 4), {p + pos + 3, n}});
    pos += 3 + n;
  }
  CHECK_NOTHROW((void)wia::bootstrap::RootServer::feed_for_testing(settings, chunks));
}

TEST_CASE("checkpoint: names that are not UTF-8 are refused, not merged into one by the writer") {
  // Metadata keys "\xffr" and "\xfer" parsed as two entries, but yaml-cpp's
  // emitter writes both as "\ufffdr": the written manifest had a duplicate
  // key and read back as one entry (fuzz_checkpoint's canonical check).
  namespace ck = wia::checkpoint;
  std::string text = corpus_file("checkpoint", "regress-manifest-not-utf8").substr(1);
  text.resize(text.rfind("# xxh3 "));  // re-sign it, as the fuzz input's 0x80 asks
  text += fmt::format("# xxh3 {:016x}\n", ck::checksum(text));
  const std::string path = "ckpt-00000001/rank-00000.yaml";
  try {
    (void)ck::parse_shard_manifest(text, path);
    FAIL("accepted");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_CORRUPT);
    CHECK_MESSAGE(std::string(e.what()) == path + ": a metadata name is not valid UTF-8 (byte 0)",
                  e.what());
  }
  // Valid UTF-8 beyond ASCII goes through unchanged.
  ck::ShardManifest m;
  m.format_version = 1;
  m.nranks = 1;
  m.metadata["\xc3\xa9t\xc3\xa9"].type = ck::MetaValue::Type::kString;
  m.metadata["\xc3\xa9t\xc3\xa9"].bytes = "\xf0\x9f\x9a\x80";
  const ck::ShardManifest back = ck::parse_shard_manifest(ck::to_text(m), path);
  REQUIRE(back.metadata.size() == 1);
  CHECK(back.metadata.begin()->first == "\xc3\xa9t\xc3\xa9");
  CHECK(back.metadata.begin()->second.bytes == "\xf0\x9f\x9a\x80");
}

TEST_CASE("config: a value that is not UTF-8 is refused, naming the key, not rewritten") {
  // log.file with bytes no UTF-8 text has: yaml-cpp wrote the effective
  // configuration back with U+FFFD in their place (fuzz_config's round trip).
  const std::string text = corpus_file("config", "regress-not-utf8.yaml");
  try {
    (void)wia::Config::parse(text, "f.yaml", no_env());
    FAIL("accepted");
  } catch (const wia::Error& e) {
    CHECK(e.status() == WIA_ERROR_CONFIG);
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("f.yaml:10:9") != std::string::npos, what);
    CHECK_MESSAGE(what.find("log.file") != std::string::npos, what);
    CHECK_MESSAGE(what.find("is not valid UTF-8") != std::string::npos, what);
  }
  // UTF-8 beyond ASCII is a value like any other.
  const wia::Config ok =
      wia::Config::parse("log:\n  file: \"/tmp/journal-\xc3\xa9t\xc3\xa9.log\"\n", "f.yaml", no_env());
  CHECK(ok.get_string("log.file") == "/tmp/journal-\xc3\xa9t\xc3\xa9.log");
}

TEST_CASE("config: a list item or list text that is not UTF-8 is refused, naming the key") {
  // providers.enable: [host...\xfa...]: the sequence's items bypassed the
  // scalar check and came back with U+FFFD (fuzz_config's round trip).
  const std::string text = corpus_file("config", "regress-list-item-not-utf8.yaml");
  for (const std::string& yaml :
       {text, std::string("providers:\n  enable: \"host,sh\xfam\"\n")}) {
    try {
      (void)wia::Config::parse(yaml, "f.yaml", no_env());
      FAIL("accepted");
    } catch (const wia::Error& e) {
      CHECK(e.status() == WIA_ERROR_CONFIG);
      const std::string what = e.what();
      CHECK_MESSAGE(what.find("providers.enable") != std::string::npos, what);
      CHECK_MESSAGE(what.find("f.yaml:") != std::string::npos, what);
      CHECK_MESSAGE(what.find("is not valid UTF-8") != std::string::npos, what);
    }
  }
}

TEST_CASE("topology: a one-device topology exported to YAML loads again") {
  // export_yaml wrote "links:" with no entry (a null, not a list) when no
  // pair of devices exists; load_yaml refused its own output.
  const std::string in =
      std::string(WIA_TEST_SOURCE_DIR) + "/fuzz/corpus/topology/regress-one-device-export.yaml";
  const wia::topo::Topology t = wia::topo::load_yaml(in);
  REQUIRE(t.n == 1);
  char path[] = "/tmp/wia-regress-topology-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  wia::topo::export_yaml(t, path);
  std::ifstream f(path);
  const std::string text{std::istreambuf_iterator<char>(f), {}};
  CHECK_MESSAGE(text.find("links: []") != std::string::npos, text);
  wia::topo::Topology again;
  CHECK_NOTHROW(again = wia::topo::load_yaml(path));
  CHECK(again.n == 1);
  CHECK(again.device_names == t.device_names);
  CHECK(again.node_names == t.node_names);
  std::remove(path);
}

TEST_CASE("topology: a control character in a name survives export and load") {
  // export_yaml wrote a NUL in a link type raw inside the quotes; the file
  // loaded again with another type. Now it writes \x00.
  const std::string in =
      std::string(WIA_TEST_SOURCE_DIR) + "/fuzz/corpus/topology/regress-control-char-in-name.yaml";
  const wia::topo::Topology t = wia::topo::load_yaml(in);
  REQUIRE(t.n == 2);
  REQUIRE(t.type_name(0, 1) == std::string("i\0nfiniband_hdr", 15));
  char path[] = "/tmp/wia-regress-topology-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  wia::topo::export_yaml(t, path);
  std::ifstream f(path);
  const std::string text{std::istreambuf_iterator<char>(f), {}};
  CHECK(text.find('\0') == std::string::npos);
  CHECK_MESSAGE(text.find("i\\x00nfiniband_hdr") != std::string::npos, text);
  wia::topo::Topology again;
  CHECK_NOTHROW(again = wia::topo::load_yaml(path));
  CHECK(again.type_name(0, 1) == t.type_name(0, 1));
  std::remove(path);
}
