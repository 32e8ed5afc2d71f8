// SPDX-License-Identifier: Apache-2.0
// The bootstrap between real processes over real sockets: rendezvous from
// a unique id and from launcher variables, all-gather, barrier, point to
// point, key-value, node identity, timeouts, abort, rank errors, IPv6.
#include "bootstrap/bootstrap.hpp"

#include <doctest/doctest.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cstring>
#include <thread>

#include "ranks.hpp"

namespace wb = wia::bootstrap;
using wb::test::Bytes;
using wb::test::contains;
using wb::test::expect;
using wb::test::run_ranks;

namespace {

using std::chrono::milliseconds;

wb::Options loopback_options(milliseconds timeout = milliseconds(60000)) {
  wb::Options o;
  o.ifname = "=lo";
  o.family = AF_INET;
  o.timeout = timeout;
  return o;
}

Bytes id_bytes(const wb::UniqueId& id) { return Bytes(id.bytes.begin(), id.bytes.end()); }
wb::UniqueId id_from(const Bytes& input) {
  wb::UniqueId id;
  expect(input.size() == id.bytes.size(), "the unique id reached the child");
  std::memcpy(id.bytes.data(), input.data(), id.bytes.size());
  return id;
}

// A 160-byte blob unique to (rank, round): like a transport handle.
Bytes blob_of(int rank, int round) {
  Bytes b(160);
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = static_cast<std::uint8_t>(rank * 31 + round * 7 + static_cast<int>(i));
  }
  return b;
}

Bytes text_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
std::string as_text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Everything a communicator's setup would use, checked from one rank.
std::string exercise(wb::Bootstrap& b) {
  const int n = b.size();
  const int r = b.rank();
  for (int round = 0; round < 2; ++round) {
    const Bytes all = b.all_gather(blob_of(r, round));
    expect(all.size() == 160u * static_cast<std::size_t>(n), "all_gather size");
    for (int peer = 0; peer < n; ++peer) {
      const Bytes want = blob_of(peer, round);
      expect(std::equal(want.begin(), want.end(), all.begin() + peer * 160),
             fmt::format("all_gather round {} holds rank {}'s blob", round, peer));
    }
  }
  b.barrier();
  // Ring exchange plus a message to self, two tags interleaved.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  b.send(next, 7, text_bytes(fmt::format("from {} tag 7", r)));
  b.send(next, 8, text_bytes(fmt::format("from {} tag 8", r)));
  b.send(r, 9, text_bytes("self"));
  expect(as_text(b.recv(prev, 8)) == fmt::format("from {} tag 8", prev), "p2p tag 8");
  expect(as_text(b.recv(prev, 7)) == fmt::format("from {} tag 7", prev), "p2p tag 7");
  expect(as_text(b.recv(r, 9)) == "self", "p2p to self");
  // Key-value: everyone puts, barrier, everyone reads everything.
  b.put(fmt::format("addr/{}", r), text_bytes(fmt::format("value of {}", r)));
  b.barrier();
  for (int peer = 0; peer < n; ++peer) {
    expect(as_text(b.get(fmt::format("addr/{}", peer))) == fmt::format("value of {}", peer),
           fmt::format("kv value of rank {}", peer));
  }
  // get() waits for a put that comes later.
  if (r == n - 1) {
    std::this_thread::sleep_for(milliseconds(100));
    b.put("late", text_bytes("finally"));
  }
  expect(as_text(b.get("late")) == "finally", "get waits for a later put");
  b.barrier();
  return "ok";
}

void check_all_ok(const wb::test::RankRun& run) {
  for (std::size_t r = 0; r < run.outputs.size(); ++r) {
    CHECK_MESSAGE(run.outputs[r] == "ok", "rank " << r << ": " << run.outputs[r]);
  }
}

}  // namespace

TEST_CASE("bootstrap: N processes rendezvous through a unique id and exchange everything") {
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    const auto run = run_ranks(
        n,
        [n](int rank, const Bytes& input) {
          auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, n, loopback_options());
          expect(b->rank() == rank && b->size() == n, "rank and size");
          expect(b->nnodes() == 1 && b->local_rank() == rank && b->local_size() == n,
                 "one node: local rank = rank");
          return exercise(*b);
        },
        [] { return id_bytes(wb::create_unique_id(loopback_options())); });
    check_all_ok(run);
  }
}

TEST_CASE("bootstrap: WIA_* variables, rank 0 hosts the root, faked hosts give the node layout") {
  const std::uint16_t port = wb::test::free_port();
  // Ranks 0 and 2 on host A, 1 and 3 on host B: local ranks follow rank
  // order within a host.
  const auto run = run_ranks(4, [port](int rank, const Bytes&) {
    ::setenv("WIA_HOSTID", rank % 2 == 0 ? "host-a" : "host-b", 1);
    const wb::EnvMap env = {{"WIA_RANK", std::to_string(rank)},
                            {"WIA_WORLD_SIZE", "4"},
                            {"WIA_ROOT_ADDR", fmt::format("127.0.0.1:{}", port)}};
    auto b = wb::Bootstrap::from_launch_info(wb::detect_launcher(env), loopback_options());
    expect(b->nnodes() == 2, fmt::format("nnodes {}", b->nnodes()));
    expect(b->node() == rank % 2, "node index follows the lowest rank of each host");
    expect(b->local_rank() == rank / 2, fmt::format("local rank {}", b->local_rank()));
    expect(b->local_size() == 2, "local size");
    expect(b->node_of(3) == 1 && b->host_id(2) == "host-a", "layout of other ranks");
    return exercise(*b);
  });
  check_all_ok(run);
}

TEST_CASE("bootstrap: two fake hosts of two ranks each through Options::host_id") {
  const auto run = run_ranks(
      4,
      [](int rank, const Bytes& input) {
        wb::Options o = loopback_options();
        o.host_id = rank < 2 ? "node-0" : "node-1";
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 4, o);
        expect(b->nnodes() == 2 && b->node() == rank / 2, "two nodes");
        expect(b->local_rank() == rank % 2 && b->local_size() == 2, "local ranks 0/1");
        b->barrier();
        return std::string("ok");
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options())); });
  check_all_ok(run);
}

TEST_CASE("bootstrap: torchrun-style variables put the root on MASTER_PORT + 1") {
  const std::uint16_t master_port = wb::test::free_port_pair();
  const auto run = run_ranks(3, [master_port](int rank, const Bytes&) {
    // torchrun's own store holds MASTER_PORT: occupy it to prove we do not need it.
    wb::Fd store;
    if (rank == 0) store = wb::listen_on(wb::wildcard_address(AF_INET, master_port), 16);
    const wb::EnvMap env = {{"RANK", std::to_string(rank)},
                            {"WORLD_SIZE", "3"},
                            {"LOCAL_RANK", std::to_string(rank)},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", std::to_string(master_port)},
                            {"TORCHELASTIC_RUN_ID", "test-job"}};
    const auto launch = wb::detect_launcher(env);
    expect(launch.secret_derived, "derived secret without WIA_AUTH_KEY");
    auto b = wb::Bootstrap::from_launch_info(launch, loopback_options());
    expect(b->root_address() == fmt::format("127.0.0.1:{}", master_port + 1), b->root_address());
    return exercise(*b);
  });
  check_all_ok(run);
}

TEST_CASE("bootstrap: one-node file rendezvous as under mpirun, and the file is removed") {
  char dir_template[] = "/tmp/wia-boot-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string job = fmt::format("ompi-test-{}", ::getpid());
  const auto run = run_ranks(3, [&](int rank, const Bytes&) {
    const wb::EnvMap env = {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                            {"OMPI_COMM_WORLD_SIZE", "3"},
                            {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
                            {"OMPI_MCA_ess_base_jobid", job},
                            {"TMPDIR", dir}};
    const auto launch = wb::detect_launcher(env, 0, ::geteuid());
    // Rank 2 starts late: the others poll for the file, rank 0 writes it.
    if (rank == 2) std::this_thread::sleep_for(milliseconds(200));
    auto b = wb::Bootstrap::from_launch_info(launch, loopback_options());
    if (rank == 0) {
      struct stat st {};
      expect(::stat(launch.rendezvous_file.c_str(), &st) != 0,
             "rank 0 removed the rendezvous file after the rendezvous");
    }
    return exercise(*b);
  });
  check_all_ok(run);
  ::rmdir(dir.c_str());  // fails (and the test notices below) if a file was left
  struct stat st {};
  CHECK(::stat(dir.c_str(), &st) != 0);
}

TEST_CASE("bootstrap: a rank that never arrives is named by every other rank") {
  SUBCASE("rank 0 hosts the root (launcher variables)") {
    const std::uint16_t port = wb::test::free_port();
    const auto run = run_ranks(4, [port](int rank, const Bytes&) -> std::string {
      if (rank == 3) return "absent";
      const wb::EnvMap env = {{"WIA_RANK", std::to_string(rank)},
                              {"WIA_WORLD_SIZE", "4"},
                              {"WIA_ROOT_ADDR", fmt::format("127.0.0.1:{}", port)}};
      auto b = wb::Bootstrap::from_launch_info(wb::detect_launcher(env),
                                               loopback_options(milliseconds(3000)));
      return "joined without rank 3";
    });
    for (int r = 0; r < 3; ++r) {
      const std::string& out = run.outputs[static_cast<std::size_t>(r)];
      CHECK_MESSAGE(contains(out, "WIA_ERROR_TIMEOUT"), out);
      CHECK_MESSAGE(contains(out, "did not arrive within 3000 ms"), out);
      CHECK_MESSAGE((contains(out, ": rank 3") || contains(out, ", 3")), out);
    }
  }
  SUBCASE("a unique id, two ranks missing") {
    const auto run = run_ranks(
        4,
        [](int rank, const Bytes& input) -> std::string {
          if (rank == 1 || rank == 3) return "absent";
          auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 4,
                                                 loopback_options(milliseconds(3000)));
          return "joined without ranks 1 and 3";
        },
        [] { return id_bytes(wb::create_unique_id(loopback_options(milliseconds(3000)))); });
    for (int r : {0, 2}) {
      const std::string& out = run.outputs[static_cast<std::size_t>(r)];
      CHECK_MESSAGE(contains(out, "WIA_ERROR_TIMEOUT"), out);
      CHECK_MESSAGE(contains(out, "2 of 4 ranks did not arrive within 3000 ms: ranks 1, 3"), out);
    }
  }
}

TEST_CASE("bootstrap: a rank missing from a barrier is named; the failure is sticky") {
  const auto run = run_ranks(
      3,
      [](int rank, const Bytes& input) -> std::string {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 3,
                                               loopback_options(milliseconds(3000)));
        b->barrier();  // everyone
        if (rank == 2) {
          // Skips the second barrier until the others have failed it.
          std::this_thread::sleep_for(milliseconds(6000));
        }
        std::string first;
        try {
          b->barrier();
          return "barrier passed without rank 2";
        } catch (const wia::Error& e) {
          first = wb::test::error_text(e);
        }
        try {
          b->all_gather(blob_of(rank, 0));
        } catch (const wia::Error& e) {
          expect(wb::test::error_text(e) == first, "the same error again: " + first);
        }
        return first;
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options(milliseconds(3000)))); });
  for (int r = 0; r < 3; ++r) {
    const std::string& out = run.outputs[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(contains(out, "WIA_ERROR_TIMEOUT"), out);
    CHECK_MESSAGE(contains(out, "1 of 3 ranks did not arrive at barrier #1 within 3000 ms: rank 2"),
                  out);
  }
}

TEST_CASE("bootstrap: rank errors reach every rank") {
  auto run_with = [](std::vector<std::pair<int, int>> rank_and_size) {
    const int n = static_cast<int>(rank_and_size.size());
    return run_ranks(
        n,
        [rank_and_size](int process, const Bytes& input) -> std::string {
          const auto [rank, size] = rank_and_size[static_cast<std::size_t>(process)];
          auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, size,
                                                 loopback_options(milliseconds(20000)));
          return "joined";
        },
        [] { return id_bytes(wb::create_unique_id(loopback_options(milliseconds(20000)))); });
  };
  auto check_every = [](const wb::test::RankRun& run, std::string_view part) {
    for (const auto& out : run.outputs) {
      CHECK_MESSAGE(contains(out, "WIA_ERROR_INVALID_ARGUMENT"), out);
      CHECK_MESSAGE(contains(out, part), out);
    }
  };
  SUBCASE("duplicate rank") {
    check_every(run_with({{0, 3}, {1, 3}, {1, 3}}), "rank 1 joined twice");
  }
  SUBCASE("rank >= size") {
    // Sizes agree, so whoever arrives first, rank 5 is out of range.
    check_every(run_with({{0, 3}, {1, 3}, {5, 3}}), "rank 5");
  }
  SUBCASE("sizes disagree") {
    check_every(run_with({{0, 3}, {1, 3}, {2, 4}}), "disagree on the job size");
  }
  SUBCASE("rank 3 of 3 alone is refused by the root") {
    try {
      wb::Bootstrap::from_unique_id(wb::create_unique_id(loopback_options(milliseconds(1000))), 3,
                                    3, loopback_options(milliseconds(1000)));
      FAIL("rank 3 of 3 accepted");
    } catch (const wia::Error& e) {
      CHECK(e.status() == WIA_ERROR_INVALID_ARGUMENT);
    }
  }
}

TEST_CASE("bootstrap: different collectives on different ranks are a mismatch everywhere") {
  const auto run = run_ranks(
      2,
      [](int rank, const Bytes& input) -> std::string {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 2, loopback_options());
        if (rank == 0) {
          b->barrier();
        } else {
          b->all_gather(blob_of(rank, 0));
        }
        return "no mismatch";
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options())); });
  for (const auto& out : run.outputs) {
    CHECK_MESSAGE(contains(out, "WIA_ERROR_MISMATCH"), out);
    CHECK_MESSAGE(contains(out, "barrier"), out);
    CHECK_MESSAGE(contains(out, "all_gather with 160 bytes"), out);
  }
}

TEST_CASE("bootstrap: abort wakes every waiter, on every rank and in this process") {
  const auto run = run_ranks(
      3,
      [](int rank, const Bytes& input) -> std::string {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 3, loopback_options());
        b->barrier();
        if (rank == 2) {
          // Another thread of rank 2 aborts while its main thread waits on a
          // message nobody sends (the 60 s timeout would say TIMEOUT).
          std::thread killer([&b] {
            std::this_thread::sleep_for(milliseconds(200));
            b->abort("testing abort");
          });
          std::string out;
          try {
            b->recv(0, 1);
            out = "recv returned";
          } catch (const wia::Error& e) {
            out = wb::test::error_text(e);
          }
          killer.join();
          return out;
        }
        b->recv(2, 1);  // never sent: only the abort ends this
        return "recv returned";
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options())); });
  CHECK_MESSAGE(contains(run.outputs[2], "WIA_ERROR_ABORTED"), run.outputs[2]);
  CHECK_MESSAGE(contains(run.outputs[2], "aborted on rank 2: testing abort"), run.outputs[2]);
  for (int r : {0, 1}) {
    const std::string& out = run.outputs[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(contains(out, "WIA_ERROR_ABORTED"), out);
    CHECK_MESSAGE(contains(out, "rank 2"), out);
    CHECK_MESSAGE(contains(out, "aborted the job: testing abort"), out);
  }
}

TEST_CASE("bootstrap: a rank that dies after the rendezvous fails the others") {
  const auto run = run_ranks(
      3,
      [](int rank, const Bytes& input) -> std::string {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 3, loopback_options());
        b->barrier();
        if (rank == 1) ::_exit(0);  // dies without closing its bootstrap
        b->barrier();
        return "barrier passed without rank 1";
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options())); });
  for (int r : {0, 2}) {
    const std::string& out = run.outputs[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(contains(out, "WIA_ERROR_REMOTE"), out);
    CHECK_MESSAGE(contains(out, "rank 1 (pid"), out);
    CHECK_MESSAGE(contains(out, "without closing"), out);
  }
}

TEST_CASE("bootstrap: recv and get timeouts are local and leave the bootstrap usable") {
  const auto run = run_ranks(
      2,
      [](int rank, const Bytes& input) -> std::string {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 2,
                                               loopback_options(milliseconds(1500)));
        try {
          b->get("never-put");
          return "get returned";
        } catch (const wia::Error& e) {
          expect(e.status() == WIA_ERROR_TIMEOUT && contains(e.what(), "never-put"),
                 wb::test::error_text(e));
        }
        try {
          b->recv(1 - rank, 99);
          return "recv returned";
        } catch (const wia::Error& e) {
          expect(e.status() == WIA_ERROR_TIMEOUT && contains(e.what(), "tag 99"),
                 wb::test::error_text(e));
        }
        b->put("never-put", text_bytes("now"));  // answers nobody's stale get
        b->barrier();
        expect(as_text(b->get("never-put")) == "now", "get after a timed-out get");
        b->barrier();
        return "ok";
      },
      [] { return id_bytes(wb::create_unique_id(loopback_options(milliseconds(1500)))); });
  check_all_ok(run);
}

TEST_CASE("bootstrap: IPv6 loopback, from a unique id and from WIA_ROOT_ADDR=[::1]:port") {
  std::uint16_t port = 0;
  try {
    port = wb::test::free_port(AF_INET6);
    wb::SocketAddress probe = wb::resolve("::1", port).at(0);
    wb::Fd fd = wb::listen_on(probe, 1);
  } catch (const std::exception& e) {
    MESSAGE("skipped: IPv6 loopback unavailable here (" << e.what() << ")");
    return;
  }
  wb::Options v6 = loopback_options();
  v6.family = AF_INET6;
  const auto from_id = run_ranks(
      2,
      [v6](int rank, const Bytes& input) {
        auto b = wb::Bootstrap::from_unique_id(id_from(input), rank, 2, v6);
        expect(contains(b->root_address(), "[::1]:"), b->root_address());
        return exercise(*b);
      },
      [v6] { return id_bytes(wb::create_unique_id(v6)); });
  check_all_ok(from_id);
  const auto from_env = run_ranks(2, [port](int rank, const Bytes&) {
    const wb::EnvMap env = {{"WIA_RANK", std::to_string(rank)},
                            {"WIA_WORLD_SIZE", "2"},
                            {"WIA_ROOT_ADDR", fmt::format("[::1]:{}", port)},
                            {"WIA_AUTH_KEY", "v6-test-key"}};
    auto b = wb::Bootstrap::from_launch_info(wb::detect_launcher(env), loopback_options());
    return exercise(*b);
  });
  check_all_ok(from_env);
}
