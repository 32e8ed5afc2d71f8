// SPDX-License-Identifier: Apache-2.0
// The simulated-network executor on deliberately broken schedules: it is
// the oracle of every other test, so each class of schedule bug must be
// reported, with the rank and step named.
#include "support/sim_executor.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <initializer_list>
#include <string>

#include "coll/registry.hpp"

namespace wia::coll {
namespace {

// A hand-written schedule of int32 elements; every buffer is `elems` long.
struct Hand {
  Schedule s;
  explicit Hand(std::int32_t p, std::uint64_t elems = 16) {
    s.collective = Collective::kSendRecv;
    s.algorithm = Algorithm::kDirect;
    s.dtype = WIA_INT32;
    s.op = WIA_REDUCE_SUM;
    s.nranks = p;
    s.count = elems;
    s.programs.resize(static_cast<std::size_t>(p));
    for (auto& prog : s.programs) {
      prog.built = true;
      prog.sizes.send = prog.sizes.recv = prog.sizes.scratch = elems;
    }
  }
  std::uint32_t add(std::int32_t rank, StepKind kind, std::int32_t peer, std::uint32_t tag,
                    Region src, Region dst, std::uint64_t count,
                    std::initializer_list<std::uint32_t> deps = {}) {
    RankProgram& prog = s.programs[static_cast<std::size_t>(rank)];
    Step st;
    st.kind = kind;
    st.peer = peer;
    st.tag = tag;
    st.src = src;
    st.dst = dst;
    st.count = count;
    st.dep_begin = static_cast<std::uint32_t>(prog.deps.size());
    st.dep_count = static_cast<std::uint32_t>(deps.size());
    prog.deps.insert(prog.deps.end(), deps.begin(), deps.end());
    prog.steps.push_back(st);
    return static_cast<std::uint32_t>(prog.steps.size() - 1);
  }
  std::uint32_t send(std::int32_t r, std::int32_t peer, std::uint32_t tag, Region src,
                     std::uint64_t n, std::initializer_list<std::uint32_t> deps = {}) {
    return add(r, StepKind::kSend, peer, tag, src, {}, n, deps);
  }
  std::uint32_t recv(std::int32_t r, std::int32_t peer, std::uint32_t tag, Region dst,
                     std::uint64_t n, std::initializer_list<std::uint32_t> deps = {}) {
    return add(r, StepKind::kRecv, peer, tag, {}, dst, n, deps);
  }
  SimResult run(const SimOptions& opt = {}) {
    SimMemory mem(s);
    return simulate(s, mem, opt);
  }
};

bool mentions(const SimResult& r, const std::string& what) {
  return r.message.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("sim: a correct exchange runs in both send modes") {
  Hand h(2);
  h.send(0, 1, 0, send_buf(0), 16);
  h.recv(0, 1, 0, recv_buf(0), 16);
  h.send(1, 0, 0, send_buf(0), 16);
  h.recv(1, 0, 0, recv_buf(0), 16);
  for (bool rdv : {false, true}) {
    SimMemory mem(h.s);
    for (std::int32_t r = 0; r < 2; ++r) {
      auto b = mem.buffer(r, BufferKind::kUserSend);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(r * 100 + i);
    }
    SimOptions opt;
    opt.rendezvous = rdv;
    const SimResult res = simulate(h.s, mem, opt);
    REQUIRE_MESSAGE(res.ok(), res.message);
    CHECK(res.messages == 2);
    CHECK(res.bytes_moved == 2 * 16 * 4);
    CHECK(std::memcmp(mem.buffer(0, BufferKind::kUserRecv).data(),
                      mem.buffer(1, BufferKind::kUserSend).data(), 64) == 0);
  }
}

TEST_CASE("sim: a receive-before-send cycle is a deadlock, blocked steps named") {
  // Each rank first waits for the other's message, and sends only after.
  Hand h(2);
  const std::uint32_t r0 = h.recv(0, 1, 0, recv_buf(0), 4);
  h.send(0, 1, 1, send_buf(0), 4, {r0});
  const std::uint32_t r1 = h.recv(1, 0, 1, recv_buf(0), 4);
  h.send(1, 0, 0, send_buf(0), 4, {r1});
  CHECK(validate_schedule(h.s).ok());  // statically every message matches
  for (bool rdv : {false, true}) {
    SimOptions opt;
    opt.rendezvous = rdv;
    const SimResult res = h.run(opt);
    CHECK(res.error == SimError::kDeadlock);
    CHECK(res.status == WIA_ERROR_INTERNAL);
    CHECK(mentions(res, "rank 0 step 0 recv peer=1 tag=0"));
    CHECK(mentions(res, "waits for the message from rank 1"));
  }
}

TEST_CASE("sim: an exchange that needs transport buffering deadlocks only with rendezvous") {
  // In-place swap without staging: each receive must wait for the rank's
  // own send to leave (it overwrites the data being sent).
  Hand h(2);
  for (std::int32_t r = 0; r < 2; ++r) {
    const std::uint32_t s = h.send(r, 1 - r, 0, recv_buf(0), 8);
    h.recv(r, 1 - r, 0, recv_buf(0), 8, {s});
  }
  CHECK(h.run().ok());
  SimOptions rdv;
  rdv.rendezvous = true;
  const SimResult res = h.run(rdv);
  CHECK(res.error == SimError::kDeadlock);
  CHECK(mentions(res, "waits for rank"));
}

TEST_CASE("sim: unmatched sends and receives are reported") {
  {
    Hand h(2);
    h.send(0, 1, 7, send_buf(0), 4);
    const SimResult res = h.run();
    CHECK(res.error == SimError::kUnmatched);
    CHECK(mentions(res, "rank 0 step 0 send peer=1 tag=7"));
    CHECK(mentions(res, "no matching receive on rank 1"));
  }
  {
    Hand h(3);
    h.recv(2, 0, 3, recv_buf(0), 4);
    h.send(0, 2, 4, send_buf(0), 4);  // wrong tag
    const SimResult res = h.run();
    CHECK(res.error == SimError::kUnmatched);
  }
  {
    Hand h(2);
    h.send(0, 1, 0, send_buf(0), 4);
    h.recv(1, 0, 0, recv_buf(0), 5);
    const SimResult res = h.run();
    CHECK(res.error == SimError::kUnmatched);
    CHECK(mentions(res, "sends 4 elements"));
  }
}

TEST_CASE("sim: n-th send matches n-th receive of the same (peer, tag) in list order") {
  Hand h(2, 4);
  h.send(0, 1, 5, send_buf(0), 2);
  h.send(0, 1, 5, send_buf(2), 2);
  h.recv(1, 0, 5, recv_buf(2), 2);
  h.recv(1, 0, 5, recv_buf(0), 2);
  for (std::uint64_t seed : {0ull, 1ull, 2ull, 3ull}) {
    SimMemory mem(h.s);
    auto src = mem.buffer(0, BufferKind::kUserSend);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i);
    SimOptions opt;
    opt.seed = seed;
    REQUIRE(simulate(h.s, mem, opt).ok());
    auto dst = mem.buffer(1, BufferKind::kUserRecv);
    CHECK(std::memcmp(dst.data() + 8, src.data(), 8) == 0);
    CHECK(std::memcmp(dst.data(), src.data() + 8, 8) == 0);
  }
}

TEST_CASE("sim: buffer overruns are reported against the declared size") {
  Hand h(2, 16);
  h.s.programs[1].sizes.recv = 10;
  h.send(0, 1, 0, send_buf(4), 12);
  h.recv(1, 0, 0, recv_buf(0), 12);
  const SimResult res = h.run();
  CHECK(res.error == SimError::kOutOfBounds);
  CHECK(mentions(res, "rank 1 step 0 recv"));
  CHECK(mentions(res, "overruns recv of 10 elements"));

  Hand g(1, 8);
  g.add(0, StepKind::kCopy, -1, 0, scratch_buf(0), recv_buf(7), 2);
  CHECK(g.run().error == SimError::kOutOfBounds);
  Hand shards(2, 8);
  shards.add(0, StepKind::kCopy, -1, 0, send_shard(0, 0), recv_shard(0, 0), 1);
  const SimResult sr = shards.run();  // shard buffers declared with size 0
  CHECK(sr.error == SimError::kOutOfBounds);
}

TEST_CASE("sim: malformed steps are rejected") {
  {
    Hand h(2);
    h.send(0, 0, 0, send_buf(0), 1);  // to itself
    CHECK(h.run().error == SimError::kInvalidSchedule);
  }
  {
    Hand h(2);
    h.send(0, 2, 0, send_buf(0), 1);  // no such rank
    CHECK(h.run().error == SimError::kInvalidSchedule);
  }
  {
    Hand h(1);
    h.add(0, StepKind::kCopy, -1, 0, send_buf(0), recv_buf(0), 1, {0});  // depends on itself
    const SimResult res = h.run();
    CHECK(res.error == SimError::kInvalidSchedule);
    CHECK(mentions(res, "not earlier"));
  }
  {
    Hand h(1);
    h.add(0, StepKind::kCopy, -1, 0, recv_buf(0), recv_buf(2), 4);  // overlapping copy
    CHECK(h.run().error == SimError::kInvalidSchedule);
  }
  {
    Hand h(2);
    h.send(0, 1, 0, send_buf(0), 4);
    h.add(1, StepKind::kRecvReduce, 0, 0, recv_buf(0), recv_buf(1), 4);  // partial alias
    CHECK(h.run().error == SimError::kInvalidSchedule);
  }
  {
    Hand h(2);
    h.s.programs[1].built = false;
    CHECK(h.run().error == SimError::kInvalidSchedule);
  }
}

TEST_CASE("sim: unordered conflicting accesses on one rank are a race") {
  Hand h(2);
  h.send(0, 1, 0, recv_buf(0), 8);
  // Overwrites what the send reads, without waiting for it.
  h.add(0, StepKind::kCopy, -1, 0, send_buf(0), recv_buf(4), 8);
  h.recv(1, 0, 0, recv_buf(0), 8);
  CHECK(validate_schedule(h.s, false).ok());
  const SimResult res = validate_schedule(h.s, true);
  CHECK(res.error == SimError::kRace);
  CHECK(mentions(res, "rank 0 step 0 send"));
  CHECK(mentions(res, "rank 0 step 1 copy"));
  // With the dependency it is fine.
  h.s.programs[0].steps[1].dep_begin = static_cast<std::uint32_t>(h.s.programs[0].deps.size());
  h.s.programs[0].steps[1].dep_count = 1;
  h.s.programs[0].deps.push_back(0);
  CHECK(validate_schedule(h.s, true).ok());
}

TEST_CASE("sim: a missing write-after-read dependency corrupts data under rendezvous") {
  // Rank 0 sends recv[0..8) then overwrites it. Without the dependency, a
  // rendezvous send that has not been matched yet reads the new data in
  // some orders; the race check flags it statically.
  Hand h(2);
  h.send(0, 1, 0, recv_buf(0), 8);
  h.add(0, StepKind::kCopy, -1, 0, send_buf(0), recv_buf(0), 8);
  h.recv(1, 0, 0, recv_buf(0), 8);
  int corrupted = 0;
  for (std::uint64_t seed = 1; seed <= 16; ++seed) {
    SimMemory mem(h.s);
    auto a = mem.buffer(0, BufferKind::kUserRecv);
    auto b = mem.buffer(0, BufferKind::kUserSend);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = std::byte{1};
      b[i] = std::byte{2};
    }
    SimOptions opt;
    opt.rendezvous = true;
    opt.seed = seed;
    REQUIRE(simulate(h.s, mem, opt).ok());
    if (mem.buffer(1, BufferKind::kUserRecv)[0] == std::byte{2}) ++corrupted;
  }
  CHECK(corrupted > 0);
  CHECK(validate_schedule(h.s, true).error == SimError::kRace);
}

TEST_CASE("sim: reduce steps use the kernels, AVG divides only where told") {
  // Step 0 sums (no divisor), step 1 averages (divisor 2).
  Hand h(2, 4);
  h.s.op = WIA_REDUCE_AVG;
  h.send(1, 0, 0, send_buf(0), 2);
  h.send(1, 0, 1, send_buf(2), 2);
  h.add(0, StepKind::kRecvReduce, 1, 0, send_buf(0), recv_buf(0), 2);
  const std::uint32_t last = h.add(0, StepKind::kRecvReduce, 1, 1, send_buf(2), recv_buf(2), 2);
  h.s.programs[0].steps[last].divisor = 2;
  SimMemory mem(h.s);
  const std::int32_t x[4] = {10, 20, 30, 41};
  const std::int32_t y[4] = {1, 2, 3, 4};
  std::memcpy(mem.buffer(0, BufferKind::kUserSend).data(), x, 16);
  std::memcpy(mem.buffer(1, BufferKind::kUserSend).data(), y, 16);
  REQUIRE(simulate(h.s, mem).ok());
  std::int32_t out[4];
  std::memcpy(out, mem.buffer(0, BufferKind::kUserRecv).data(), 16);
  CHECK(out[0] == 11);
  CHECK(out[1] == 22);
  CHECK(out[2] == 16);  // (30 + 3) / 2 truncates
  CHECK(out[3] == 22);
}

TEST_CASE("sim: builder schedules pass the race check and rendezvous at larger p") {
  // The matrix covers p <= 8; a few bigger, odd shapes here.
  for (const AlgorithmInfo& info : algorithms()) {
    for (std::int32_t p : {11, 16, 17}) {
      CollArgs a;
      a.collective = info.collective;
      a.algorithm = info.algorithm;
      a.dtype = WIA_INT32;
      a.count = 37;
      a.nranks = p;
      a.root = p / 3;
      a.options.num_chunks = 2;
      const Schedule s = build_schedule(a);
      SimMemory mem(s);
      SimOptions opt;
      opt.rendezvous = true;
      opt.seed = 99;
      opt.check_races = true;
      const SimResult res = simulate(s, mem, opt);
      CHECK_MESSAGE(res.ok(), s.describe() << ": " << res.message);
    }
  }
}

}  // namespace wia::coll
