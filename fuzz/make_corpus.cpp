// SPDX-License-Identifier: Apache-2.0
// Writes the binary seed inputs of the fuzz targets (fuzz/make-corpus.sh):
// bytes produced by libwia's own encoders (bootstrap frames with valid
// MACs, checkpoint manifests and blocks, compressed gradients, shm ring
// records, provider descriptors laid out as providers export them), in
// each target's input format. The YAML targets take their seeds from
// config/ and the test data instead.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bootstrap/siphash.hpp"
#include "bootstrap/wire.hpp"
#include "checkpoint/format.hpp"
#include "compress/codec.hpp"
#include "fuzz_secret.hpp"
#include "shm_wire.hpp"
#include "tcp_wire.hpp"

namespace {

namespace fs = std::filesystem;
namespace wire = wia::bootstrap::wire;
using Bytes = std::vector<std::uint8_t>;

fs::path g_out;

void write(const std::string& target, const std::string& name, const Bytes& bytes) {
  const fs::path dir = g_out / target;
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void put(Bytes& b, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void append(Bytes& b, const void* p, std::size_t n) {
  const auto* c = static_cast<const std::uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}

// --- bootstrap: chunks of [u8 connection][u16 length][bytes] --------------

void chunk(Bytes& b, std::uint8_t conn, const Bytes& bytes) {
  b.push_back(conn);
  put<std::uint16_t>(b, static_cast<std::uint16_t>(bytes.size()));
  b.insert(b.end(), bytes.begin(), bytes.end());
}

Bytes auth(std::uint8_t conn, bool right_key) {
  std::array<std::uint8_t, wire::kNonceBytes> server{}, client{};
  server.fill(conn);
  for (std::size_t i = 0; i < client.size(); ++i) client[i] = static_cast<std::uint8_t>(i * 7 + 1);
  Bytes message(wire::kClientRole.begin(), wire::kClientRole.end());
  message.insert(message.end(), server.begin(), server.end());
  message.insert(message.end(), client.begin(), client.end());
  wia::bootstrap::Secret key = wia::fuzz::kSecret;
  if (!right_key) key.bytes[0] ^= 1;
  std::uint8_t mac[8];
  wire::store_le(mac, wia::bootstrap::siphash24(key, message), 8);
  return wire::Writer(wire::FrameType::kAuth).bytes(client).bytes(mac).finish();
}

Bytes hello(std::uint32_t rank, std::uint32_t size) {
  return wire::Writer(wire::FrameType::kHello)
      .u32(rank)
      .u32(size)
      .u32(4242 + rank)
      .text("host-" + std::to_string(rank % 2))
      .text("node" + std::to_string(rank % 2))
      .finish();
}

Bytes gather(std::uint64_t seq, wire::GatherKind kind, const std::string& blob) {
  return wire::Writer(wire::FrameType::kGather)
      .u64(seq)
      .u8(static_cast<std::uint8_t>(kind))
      .blob({reinterpret_cast<const std::uint8_t*>(blob.data()), blob.size()})
      .finish();
}

void bootstrap_seeds() {
  const Bytes v = {1, 2, 3};
  Bytes job;  // two ranks: rendezvous, all-gather, barrier, store, send, bye
  for (std::uint8_t r = 0; r < 2; ++r) chunk(job, r, auth(r, true));
  for (std::uint8_t r = 0; r < 2; ++r) chunk(job, r, hello(r, 2));
  for (std::uint8_t r = 0; r < 2; ++r) chunk(job, r, gather(0, wire::GatherKind::kAllGather, "ab"));
  for (std::uint8_t r = 0; r < 2; ++r) chunk(job, r, gather(1, wire::GatherKind::kBarrier, ""));
  chunk(job, 1, wire::Writer(wire::FrameType::kGet).u64(7).text("k").finish());
  chunk(job, 0, wire::Writer(wire::FrameType::kPut).text("k").blob(v).finish());
  chunk(job, 0, wire::Writer(wire::FrameType::kSend).u32(1).u64(99).blob(v).finish());
  chunk(job, 1, wire::Writer(wire::FrameType::kTimeoutReport).u8(2).u64(2).u32(1000).finish());
  for (std::uint8_t r = 0; r < 2; ++r) chunk(job, r, wire::Writer(wire::FrameType::kBye).finish());
  write("bootstrap", "two-rank-job", job);

  Bytes abort;  // one rank aborts the job
  chunk(abort, 0, auth(0, true));
  chunk(abort, 0, hello(0, 3));
  chunk(abort, 0, wire::Writer(wire::FrameType::kAbort).text("out of memory").finish());
  write("bootstrap", "abort", abort);

  Bytes wrong;  // wrong secret, then a hello without authentication
  chunk(wrong, 0, auth(0, false));
  chunk(wrong, 1, hello(0, 1));
  write("bootstrap", "wrong-key", wrong);

  Bytes huge;  // a valid header announcing a huge payload
  std::uint8_t h[wire::kHeaderBytes];
  wire::encode_header(wire::FrameType::kHello, 0xfffffff0u, h);
  chunk(huge, 0, auth(0, true));
  chunk(huge, 0, Bytes(h, h + sizeof h));
  write("bootstrap", "huge-length", huge);

  Bytes garbage;  // an HTTP client on the bootstrap port
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  chunk(garbage, 2, Bytes(get.begin(), get.end()));
  write("bootstrap", "http-garbage", garbage);

  Bytes mismatch;  // ranks disagree on the job size, then on a collective
  for (std::uint8_t r = 0; r < 3; ++r) chunk(mismatch, r, auth(r, true));
  chunk(mismatch, 0, hello(0, 2));
  chunk(mismatch, 1, hello(1, 2));
  chunk(mismatch, 0, gather(0, wire::GatherKind::kAllGather, "abc"));
  chunk(mismatch, 1, gather(0, wire::GatherKind::kBarrier, ""));
  chunk(mismatch, 2, hello(1, 5));
  write("bootstrap", "mismatch", mismatch);
}

// --- checkpoint: [mode] then the input of that mode ------------------------

Bytes text_seed(std::uint8_t mode, const std::string& text) {
  Bytes b{mode};
  append(b, text.data(), text.size());
  return b;
}

void checkpoint_seeds() {
  namespace ck = wia::checkpoint;
  ck::ShardManifest m;
  m.seq = 7;
  m.rank = 1;
  m.nranks = 4;
  m.compression = WIA_CKPT_COMPRESS_ZSTD;
  m.data_bytes = 4096;
  m.tensors.push_back({ck::Kind::kModel, "layer0.weight", WIA_FLOAT32, 1024, 16, 2000, 0x1234});
  m.tensors.push_back({ck::Kind::kOptimizer, "adam.m", WIA_BFLOAT16, 512, 2016, 900, 0xfeed});
  m.tensors.push_back({ck::Kind::kResidual, "residual", WIA_FLOAT32, 3, 2916, 20, 1});
  m.metadata["step"] = {ck::MetaValue::Type::kInt, 1200, 0, ""};
  m.metadata["lr"] = {ck::MetaValue::Type::kDouble, 0, 3e-4, ""};
  m.metadata["run"] = {ck::MetaValue::Type::kString, 0, 0, "exp-42"};
  m.metadata["rng"] = {ck::MetaValue::Type::kBytes, 0, 0, std::string("\x00\x01\xff", 3)};
  write("checkpoint", "shard-manifest", text_seed(0, ck::to_text(m)));
  write("checkpoint", "shard-manifest-resign", text_seed(0x80, ck::to_text(m)));
  ck::CommitRecord r;
  r.seq = 7;
  r.nranks = 2;
  r.shard_checksums = {0x0123456789abcdefull, 42};
  write("checkpoint", "commit-record", text_seed(1, ck::to_text(r)));
  write("checkpoint", "commit-record-resign", text_seed(0x81, ck::to_text(r)));
  r.shard_mode = WIA_CKPT_REPLICATED;
  r.shard_checksums = {5};
  write("checkpoint", "commit-record-replicated", text_seed(1, ck::to_text(r)));

  std::vector<std::byte> raw(3000);
  for (std::size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<std::byte>((i / 7) % 13);
  for (int codec = 0; codec < 3; ++codec) {
    std::vector<std::byte> stored;
    ck::encode_blocks(raw, static_cast<wia_checkpoint_compression_t>(codec), 0, stored);
    Bytes b{2, static_cast<std::uint8_t>(codec)};
    put<std::uint32_t>(b, static_cast<std::uint32_t>(raw.size()));
    append(b, stored.data(), stored.size());
    write("checkpoint", "blocks-codec" + std::to_string(codec), b);
    Bytes e{3, static_cast<std::uint8_t>(codec), 1};
    append(e, raw.data(), 600);
    write("checkpoint", "encode-codec" + std::to_string(codec), e);
  }
  Bytes header{4};
  put<std::uint64_t>(header, 7);
  const auto h = ck::data_header(7);
  append(header, h.data(), h.size());
  write("checkpoint", "data-header", header);
}

// --- compress: [mode][u16 n - 1] then the mode's fields --------------------

std::vector<float> gradient(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.1f * static_cast<float>(i)) * 0.01f;
  return x;
}

void compress_seeds() {
  namespace cz = wia::compress;
  const std::size_t n = 300;
  const auto x = gradient(n);
  const int bits[] = {1, 4, 8, 16};
  for (int bi = 0; bi < 4; ++bi) {
    for (int per_chunk = 0; per_chunk < 2; ++per_chunk) {
      const std::size_t chunk = per_chunk ? cz::kChunk : n;
      std::vector<std::byte> msg(cz::quantize_bytes(n, bits[bi], chunk));
      Bytes b{0};
      put<std::uint16_t>(b, n - 1);
      b.push_back(static_cast<std::uint8_t>(bi));
      b.push_back(static_cast<std::uint8_t>(per_chunk));
      for (std::uint64_t seed : {1u, 2u}) {
        cz::quantize_encode(x, bits[bi], chunk, seed, msg);
        append(b, msg.data(), msg.size());
      }
      write("compress",
            "quantize-" + std::to_string(bits[bi]) + (per_chunk ? "-chunked" : "-one-range"), b);
    }
  }
  const wia_datatype_t scales[] = {WIA_FLOAT32, WIA_FLOAT16, WIA_BFLOAT16};
  for (int si = 0; si < 3; ++si) {
    std::vector<std::byte> msg(cz::onebit_bytes(n, scales[si]));
    cz::onebit_encode(x, scales[si], msg);
    Bytes b{1};
    put<std::uint16_t>(b, n - 1);
    b.push_back(static_cast<std::uint8_t>(si));
    append(b, msg.data(), msg.size());
    append(b, msg.data(), msg.size());
    write("compress", "onebit-scale" + std::to_string(si), b);
  }
  std::vector<cz::Pair> pairs(cz::k_of(n, 0.05));
  cz::topk_select(x, pairs.size(), true, pairs);
  Bytes sparse{2};
  put<std::uint16_t>(sparse, n - 1);
  for (const auto& p : pairs) {
    put<std::uint32_t>(sparse, p.index);
    std::uint32_t v;
    std::memcpy(&v, &p.value, 4);
    put<std::uint32_t>(sparse, v);
  }
  write("compress", "topk-pairs", sparse);
  for (std::uint8_t mode : {3, 4}) {
    Bytes g{mode};
    put<std::uint16_t>(g, n - 1);
    if (mode == 3) {
      g.push_back(2);  // 8 bits
      g.push_back(1);  // per chunk
      put<std::uint64_t>(g, 12345);
    }
    for (float f : x) {
      std::uint32_t v;
      std::memcpy(&v, &f, 4);
      put<std::uint32_t>(g, v);
    }
    if (mode == 4) put<std::uint16_t>(g, 14);
    write("compress", mode == 3 ? "encode-decode" : "topk-select", g);
  }
}

// --- shm ring: [u8 size / 64 - 4][u32 tail / 64][u32 head - tail][u32 seq][ring]

void shm_seeds() {
  namespace sw = wia::shm::wire;
  const std::uint64_t size = 1024;
  Bytes ring(size);
  std::uint64_t pos = 0;
  std::uint32_t seq = 5;
  auto record = [&](sw::RecordHeader h, std::size_t payload) {
    h.seq = seq++;
    h.len = payload;
    std::memcpy(ring.data() + pos, &h, sizeof h);
    for (std::size_t i = 0; i < payload; ++i)
      ring[pos + sizeof h + i] = static_cast<std::uint8_t>(i);
    pos += sw::record_span(payload);
  };
  record({sw::kEager, 0, 0, 11, 0, 100, 0, 0}, 100);
  record({sw::kRts, sw::kRtsCmaOk, 0, 12, 0, 1 << 20, 3, 0x7f0000001000}, 0);
  record({sw::kCts, 0, 0, 12, 0, 1 << 20, 3, 9}, 0);
  record({sw::kData, 0, 0, 12, 0, 1 << 20, 9, 0}, 200);
  record({sw::kFin, 0, 0, 12, 0, 0, 3, 0}, 0);
  const std::uint64_t used = pos;
  // The same records just before the end of the ring, with a pad record
  // that wraps the reader to the start.
  Bytes b{static_cast<std::uint8_t>(size / 64 - 4)};
  put<std::uint32_t>(b, 0);
  put<std::uint32_t>(b, static_cast<std::uint32_t>(used));
  put<std::uint32_t>(b, 5);
  b.insert(b.end(), ring.begin(), ring.end());
  write("shm_ring", "records", b);

  Bytes wrap(size);
  const std::uint64_t start = size - 128;  // pad record at the end, one eager at the start
  sw::RecordHeader pad{sw::kPad, 0, 5, 0, 128 - sizeof(sw::RecordHeader), 0, 0, 0};
  std::memcpy(wrap.data() + start, &pad, sizeof pad);
  sw::RecordHeader eager{sw::kEager, 0, 6, 1, 8, 8, 0, 0};
  std::memcpy(wrap.data(), &eager, sizeof eager);
  Bytes w{static_cast<std::uint8_t>(size / 64 - 4)};
  put<std::uint32_t>(w, static_cast<std::uint32_t>((3 * size + start) / 64));
  put<std::uint32_t>(w, static_cast<std::uint32_t>(128 + sw::record_span(8)));
  put<std::uint32_t>(w, 5);
  w.insert(w.end(), wrap.begin(), wrap.end());
  write("shm_ring", "pad-wrap", w);
}

// --- descriptor: the field-by-field layout fuzz_descriptor.cpp reads --------

void text(Bytes& b, const std::string& s) {
  b.push_back(static_cast<std::uint8_t>(s.size()));
  append(b, s.data(), s.size());
}

void table_bytes(Bytes& b, std::size_t struct_size, std::uint64_t caps) {
  put<std::uint16_t>(b, static_cast<std::uint16_t>(struct_size));
  b.push_back(1);  // abi_version
  b.push_back(1);  // fill: function pointers
  b.push_back(2);  // caps: raw
  put<std::uint64_t>(b, caps);
  b.push_back(0);  // must_understand: 0
  for (std::size_t off = 24; off + 8 <= struct_size; off += 8) b.push_back(1);
}

void descriptor_seeds() {
  // Like the host provider: a device table, one int parameter.
  Bytes host;
  host.push_back(1);  // struct_size: sizeof
  host.push_back(1);  // abi_version 1
  host.push_back(16 | 64 | 128);
  text(host, "host");
  text(host, "0.1.0");
  host.push_back(WIA_PROVIDER_CAP_DEVICE);
  host.push_back(1);  // host services v1
  table_bytes(host, sizeof(wia_device_ops_v1_t), 0);
  host.push_back(2);  // two parameters
  host.push_back(1);  // stride sizeof
  for (const auto& [key, def] : {std::pair{"devices", "4"}, std::pair{"memory", "1G"}}) {
    host.push_back(1);  // struct_size = stride
    host.push_back(key[0] == 'd' ? WIA_PARAM_INT : WIA_PARAM_SIZE);
    host.push_back(1);
    text(host, key);
    host.push_back(1);
    text(host, def);
    host.push_back(1);
    text(host, "a parameter");
    put<std::uint64_t>(host, 1);
    put<std::uint64_t>(host, 1ull << 40);
  }
  write("descriptor", "device-provider", host);

  // Like the tcp provider: a transport table with RMA, a string parameter.
  Bytes tcp;
  tcp.push_back(1);
  tcp.push_back(1);
  tcp.push_back(32 | 64 | 128);
  text(tcp, "tcp");
  text(tcp, "0.1.0");
  tcp.push_back(WIA_PROVIDER_CAP_TRANSPORT);
  tcp.push_back(1);
  table_bytes(tcp, sizeof(wia_transport_ops_v1_t), WIA_TRANSPORT_CAP_RMA);
  tcp.push_back(1);
  tcp.push_back(1);
  tcp.push_back(1);
  tcp.push_back(WIA_PARAM_STRING);
  tcp.push_back(1);
  text(tcp, "ifname");
  tcp.push_back(1);
  text(tcp, "");
  tcp.push_back(1);
  text(tcp, "interfaces");
  put<std::uint64_t>(tcp, 0);
  put<std::uint64_t>(tcp, 0);
  write("descriptor", "transport-provider", tcp);

  // Broken: a struct_size beyond the exported object, a bad name.
  Bytes broken = {0, 0x00, 0x10, 1, 0, 1};
  text(broken, "Bad-Name");
  text(broken, "1");
  broken.push_back(0);
  write("descriptor", "broken", broken);
}

// --- tcp frames: [u8 receives][u8 sends], per request [u8 tag][u24 bytes],
//     then [u16 control length][control bytes][data-socket bytes]

void tcp_request(Bytes& b, std::uint8_t tag, std::uint32_t bytes) {
  b.push_back(tag);
  put<std::uint16_t>(b, static_cast<std::uint16_t>(bytes));
  b.push_back(static_cast<std::uint8_t>(bytes >> 16));
}

void tcp_msg(Bytes& control, const wia::tcp::WireMsg& m, std::size_t payload = 0) {
  append(control, &m, sizeof m);
  for (std::size_t i = 0; i < payload; ++i) control.push_back(static_cast<std::uint8_t>(i));
}

Bytes tcp_seed(std::uint8_t receives, std::uint8_t sends,
               const std::vector<std::pair<std::uint8_t, std::uint32_t>>& requests,
               const Bytes& control, std::size_t data_bytes) {
  Bytes b{receives, sends};
  for (const auto& [tag, bytes] : requests) tcp_request(b, tag, bytes);
  put<std::uint16_t>(b, static_cast<std::uint16_t>(control.size()));
  b.insert(b.end(), control.begin(), control.end());
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<std::uint8_t>(i * 31));
  return b;
}

void tcp_seeds() {
  using wia::tcp::make_msg;
  using wia::tcp::MsgType;
  Bytes eager_rts;  // an eager message and an RTS for posted receives, the RTS's payload
  tcp_msg(eager_rts, make_msg(MsgType::eager, 0, 1, 10), 10);
  tcp_msg(eager_rts, make_msg(MsgType::rts, 1, 2, 40000));
  tcp_msg(eager_rts, make_msg(MsgType::eager, 2, 3, 5), 5);  // unexpected: nothing posted
  write("tcp_frames", "eager-rts", tcp_seed(2, 0, {{1, 100}, {2, 50000}}, eager_rts, 40000));
  Bytes cts;  // the peer clears our large send
  tcp_msg(cts, make_msg(MsgType::cts, 0, 3, 100000, 1));
  write("tcp_frames", "cts", tcp_seed(0, 1, {{3, 100000}}, cts, 0));
  Bytes nak;  // the peer refuses it
  tcp_msg(nak, make_msg(MsgType::nak, 0, 3, 100000));
  write("tcp_frames", "nak", tcp_seed(0, 1, {{3, 100000}}, nak, 0));
  Bytes bad;  // a broken checksum after a good message
  tcp_msg(bad, make_msg(MsgType::eager, 0, 1, 4), 4);
  auto broken = make_msg(MsgType::eager, 1, 1, 4);
  broken.check ^= 1;
  tcp_msg(bad, broken, 4);
  write("tcp_frames", "bad-checksum", tcp_seed(1, 0, {{1, 8}}, bad, 0));
  Bytes swapped;  // a peer of the other byte order
  auto other = make_msg(MsgType::eager, 0, 1, 4);
  other.magic = __builtin_bswap32(other.magic);
  tcp_msg(swapped, other, 4);
  write("tcp_frames", "other-byte-order", tcp_seed(1, 0, {{1, 8}}, swapped, 0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  g_out = argv[1];
  bootstrap_seeds();
  checkpoint_seeds();
  compress_seeds();
  shm_seeds();
  descriptor_seeds();
  tcp_seeds();
  return 0;
}
