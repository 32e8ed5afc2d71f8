// SPDX-License-Identifier: Apache-2.0
// fuzz_bootstrap: the bootstrap wire protocol (docs/bootstrap.md) as the
// root reads it from the network: frame headers, the authentication
// handshake (challenge, auth, auth-ok), hello, and every request a rank
// sends (gather, send, put, get, abort, timeout report, bye), over up to
// four connections at once, through RootServer::feed_for_testing (the
// serving loop's own frame handling, without sockets).
//
// Input: chunks of [u8 connection][u16 length][bytes]. The root's server
// nonce on connection k is 16 bytes of k and the job secret is fixed
// (kSecret), so seeds from fuzz/make_corpus.cpp carry valid MACs and the
// fuzzer reaches the requests of joined ranks.
//
// Invariants beyond "no crash":
//  - nothing escapes the frame handling (on the root's thread an escaping
//    exception stops the bootstrap of every rank of the job);
//  - every byte the root sends is a sequence of well-formed frames;
//  - a connection that has not authenticated is sent the challenge and at
//    most the error frame of its refusal: no job data reaches a client
//    without the secret;
//  - the decoders of wire.hpp agree with the encoders: a decoded header
//    re-encodes to the same 16 bytes.
#include <vector>

#include "bootstrap/root.hpp"
#include "bootstrap/wire.hpp"
#include "fuzz_common.hpp"
#include "fuzz_secret.hpp"

namespace {

namespace bs = wia::bootstrap;
namespace wire = wia::bootstrap::wire;
using wia::fuzz::check;

// The frames in `bytes`; breaks the invariant if they are not well formed.
std::vector<wire::FrameType> frames(const std::vector<std::uint8_t>& bytes) {
  std::vector<wire::FrameType> types;
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    check(bytes.size() - pos >= wire::kHeaderBytes, "root sent a truncated frame header");
    wire::Header h;
    try {
      h = wire::decode_header(bytes.data() + pos);
    } catch (const wire::ProtocolError& e) {
      wia::fuzz::broken(std::string("root sent a bad frame header: ") + e.what());
    }
    check(bytes.size() - pos - wire::kHeaderBytes >= h.length, "root sent a truncated payload");
    types.push_back(h.type);
    pos += wire::kHeaderBytes + h.length;
  }
  return types;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wia::fuzz::quiet_logs();
  wia::fuzz::Bytes in(data, size);

  // The header codec on its own: the first 16 bytes as a header.
  if (size >= wire::kHeaderBytes) {
    try {
      const wire::Header h = wire::decode_header(data);
      std::uint8_t again[wire::kHeaderBytes];
      wire::encode_header(h.type, h.length, again);
      check(std::memcmp(again, data, wire::kHeaderBytes) == 0, "header does not re-encode");
    } catch (const wire::ProtocolError& e) {
      check(std::strlen(e.what()) > 0, "protocol error without a message");
    }
  }

  std::vector<bs::RootServer::FeedChunk> chunks;
  while (in.remaining() > 0 && chunks.size() < 64) {
    bs::RootServer::FeedChunk c;
    c.conn = in.u8() % 4;
    c.bytes = in.take(in.u16());
    chunks.push_back(c);
  }
  bs::RootServer::Settings settings;
  settings.secret = wia::fuzz::kSecret;
  std::vector<bs::RootServer::FeedResult> out;
  try {
    out = bs::RootServer::feed_for_testing(settings, chunks);
  } catch (const std::exception& e) {
    wia::fuzz::broken(std::string("an exception escaped the root's frame handling: ") + e.what());
  }
  for (const auto& conn : out) {
    const auto types = frames(conn.sent);
    check(!types.empty() && types[0] == wire::FrameType::kChallenge,
          "a connection was not challenged first");
    bool authenticated = false;
    for (std::size_t i = 1; i < types.size(); ++i) {
      if (types[i] == wire::FrameType::kAuthOk) authenticated = true;
      // A refused client is told why (one error frame) before the close.
      const bool refusal = types[i] == wire::FrameType::kError && i + 1 == types.size();
      check(authenticated || refusal, std::string("'") + wire::frame_type_name(types[i]) +
                                          "' sent to a connection that has not authenticated");
    }
  }
  return 0;
}
