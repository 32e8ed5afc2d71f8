// SPDX-License-Identifier: Apache-2.0
// Stray and hostile clients against a live root: wrong secret, garbage,
// truncated and oversized headers, silence (slowloris). Each is dropped
// and logged, and the real job completes meanwhile.
#include <doctest/doctest.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/wire.hpp"
#include "common/log.hpp"
#include "ranks.hpp"

namespace wb = wia::bootstrap;
using std::chrono::milliseconds;
using wb::test::Bytes;
using wb::test::contains;
using wb::test::expect;
using wb::test::run_ranks;

namespace {

wb::Fd connect_to(const std::string& address) {
  std::string why;
  const auto hp = wb::parse_host_port(address, &why);
  REQUIRE(hp);
  int error = 0;
  wb::Fd fd = wb::connect_before(wb::resolve(hp->host, hp->port).at(0),
                                 wb::Clock::now() + std::chrono::seconds(10), &error);
  REQUIRE_MESSAGE(fd.valid(), std::strerror(error));
  return fd;
}

void send_raw(int fd, const void* data, std::size_t n) {
  int error = 0;
  wb::send_all(fd, {static_cast<const std::uint8_t*>(data), n},
               wb::Clock::now() + std::chrono::seconds(5), -1, &error);
}

// True once the root has closed the connection (after draining what it sent).
bool closed_by_peer(int fd, std::chrono::seconds limit) {
  const auto deadline = wb::Clock::now() + limit;
  std::uint8_t buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, wb::ms_until(deadline)) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return true;  // reset
  }
}

// A client that runs the handshake correctly but with the wrong key.
void wrong_key_handshake(int fd) {
  std::uint8_t header[wb::wire::kHeaderBytes];
  std::uint8_t nonce[wb::wire::kNonceBytes];
  int error = 0;
  const auto deadline = wb::Clock::now() + std::chrono::seconds(10);
  REQUIRE(wb::recv_all(fd, header, deadline, -1, &error) == wb::IoResult::kOk);
  REQUIRE(wb::wire::decode_header(header).type == wb::wire::FrameType::kChallenge);
  REQUIRE(wb::recv_all(fd, nonce, deadline, -1, &error) == wb::IoResult::kOk);
  std::vector<std::uint8_t> message(wb::wire::kClientRole.begin(), wb::wire::kClientRole.end());
  message.insert(message.end(), nonce, nonce + sizeof nonce);
  message.insert(message.end(), nonce, nonce + sizeof nonce);  // client nonce = server's
  const auto frame = wb::wire::Writer(wb::wire::FrameType::kAuth)
                         .bytes(std::span<const std::uint8_t>(nonce, sizeof nonce))
                         .u64(wb::siphash24(wb::random_secret(), message))
                         .finish();
  send_raw(fd, frame.data(), frame.size());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("bootstrap: hostile clients are rejected and logged; the real job completes") {
  const std::string log_path = fmt::format("/tmp/wia-boot-security-{}.log", ::getpid());
  ::unlink(log_path.c_str());
  wia::log::configure(wia::log::Level::warn, log_path);

  wb::Options options;
  options.ifname = "=lo";
  options.family = AF_INET;
  options.timeout = milliseconds(60000);
  options.handshake_timeout = milliseconds(1500);

  std::vector<std::pair<std::string, wb::Fd>> attackers;
  const auto run = run_ranks(
      3,
      [options](int rank, const Bytes& input) -> std::string {
        wb::UniqueId id;
        std::memcpy(id.bytes.data(), input.data(), id.bytes.size());
        auto b = wb::Bootstrap::from_unique_id(id, rank, 3, options);
        const Bytes mine(200, static_cast<std::uint8_t>(rank));
        const Bytes all = b->all_gather(mine);
        for (int r = 0; r < 3; ++r) expect(all[static_cast<std::size_t>(r) * 200] == r, "gather");
        // Keep the root alive past the handshake deadline of the silent
        // clients, so it is that deadline (not the root's exit) that ends them.
        if (rank == 0) std::this_thread::sleep_for(milliseconds(2500));
        b->barrier();
        return "ok";
      },
      [&] {
        const wb::UniqueId id = wb::create_unique_id(options);
        const std::string address = wb::describe_unique_id(id);
        // Each attack runs before the ranks are even told the id.
        auto garbage = connect_to(address);
        const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        send_raw(garbage.get(), http, sizeof http - 1);
        attackers.emplace_back("garbage", std::move(garbage));

        auto truncated = connect_to(address);  // half a header, then nothing
        std::uint8_t header[wb::wire::kHeaderBytes];
        wb::wire::encode_header(wb::wire::FrameType::kAuth, 24, header);
        send_raw(truncated.get(), header, 7);
        attackers.emplace_back("truncated", std::move(truncated));

        attackers.emplace_back("silent", connect_to(address));

        auto oversized = connect_to(address);
        wb::wire::encode_header(wb::wire::FrameType::kAuth, 0x7ffffff0, header);
        send_raw(oversized.get(), header, sizeof header);
        attackers.emplace_back("oversized", std::move(oversized));

        auto early_hello = connect_to(address);  // skips authentication
        const auto hello = wb::wire::Writer(wb::wire::FrameType::kHello).u32(0).u32(3).finish();
        send_raw(early_hello.get(), hello.data(), hello.size());
        attackers.emplace_back("hello-before-auth", std::move(early_hello));

        auto wrong_key = connect_to(address);
        wrong_key_handshake(wrong_key.get());
        attackers.emplace_back("wrong-key", std::move(wrong_key));
        return Bytes(id.bytes.begin(), id.bytes.end());
      });
  for (std::size_t r = 0; r < run.outputs.size(); ++r) {
    CHECK_MESSAGE(run.outputs[r] == "ok", "rank " << r << ": " << run.outputs[r]);
  }
  for (auto& [name, fd] : attackers) {
    CHECK_MESSAGE(closed_by_peer(fd.get(), std::chrono::seconds(30)),
                  "the root kept the '" << name << "' connection open");
  }
  wia::log::configure(wia::log::Level::warn, "");
  const std::string log = read_file(log_path);
  ::unlink(log_path.c_str());
  CHECK_MESSAGE(contains(log, "bad magic"), log);
  CHECK_MESSAGE(contains(log, "exceeds the bound"), log);
  CHECK_MESSAGE(contains(log, "wrong authentication"), log);
  CHECK_MESSAGE(contains(log, "no complete handshake within 1500 ms"), log);
  CHECK_MESSAGE(contains(log, "unexpected 'hello' frame before authentication"), log);
}

TEST_CASE("bootstrap: a process with the wrong WIA_AUTH_KEY is refused; the job completes") {
  const std::uint16_t port = wb::test::free_port();
  const std::string marker = fmt::format("/tmp/wia-boot-impostor-{}", ::getpid());
  ::unlink(marker.c_str());
  // Processes 0..2 are the job; process 3 claims rank 1 with another key.
  const auto run = run_ranks(4, [port, marker](int process, const Bytes&) -> std::string {
    const int rank = process == 3 ? 1 : process;
    const wb::EnvMap env = {{"WIA_RANK", std::to_string(rank)},
                            {"WIA_WORLD_SIZE", "3"},
                            {"WIA_ROOT_ADDR", fmt::format("127.0.0.1:{}", port)},
                            {"WIA_AUTH_KEY", process == 3 ? "not-the-key" : "the-real-key"}};
    wb::Options o;
    o.timeout = milliseconds(60000);
    if (process == 3) {
      std::string out;
      try {
        wb::Bootstrap::from_launch_info(wb::detect_launcher(env), o);
        out = "joined with the wrong key";
      } catch (const wia::Error& e) {
        out = wb::test::error_text(e);
      }
      std::ofstream(marker) << "done";
      return out;
    }
    auto b = wb::Bootstrap::from_launch_info(wb::detect_launcher(env), o);
    // The root (in rank 0) stays up until the impostor has been refused.
    for (int i = 0; i < 3000 && ::access(marker.c_str(), F_OK) != 0; ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    b->barrier();
    return "ok";
  });
  ::unlink(marker.c_str());
  for (int r = 0; r < 3; ++r) {
    CHECK_MESSAGE(run.outputs[static_cast<std::size_t>(r)] == "ok",
                  run.outputs[static_cast<std::size_t>(r)]);
  }
  CHECK_MESSAGE(contains(run.outputs[3], "WIA_ERROR_REMOTE"), run.outputs[3]);
  CHECK_MESSAGE(contains(run.outputs[3], "secrets differ"), run.outputs[3]);
}
