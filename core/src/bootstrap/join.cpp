// SPDX-License-Identifier: Apache-2.0
// Joining a job (join.hpp): connecting to the root and authenticating, the
// hello, this rank's host identity, and from_launch_info(), which decides
// from the launcher where the root runs (rank 0 starts it) and joins it.
#include "bootstrap/join.hpp"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>
#include <thread>
#include <utility>

#include "bootstrap/hosted_roots.hpp"
#include "bootstrap/rendezvous_file.hpp"
#include "bootstrap/wire.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::string_view kTag = "bootstrap";

std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) {
    text.pop_back();
  }
  return text;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

std::string read_small_file(const char* path) {
  Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return {};
  char buf[256] = {};
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  return n > 0 ? trimmed(std::string(buf, static_cast<std::size_t>(n))) : std::string();
}

void check_rank_and_size(int rank, int size) {
  // rank >= size is left for the root to refuse, so every rank of the job
  // hears of it, not just this one.
  if (size < 1 || static_cast<std::uint32_t>(size) > wire::kMaxRanks || rank < 0 ||
      static_cast<std::uint32_t>(rank) >= wire::kMaxRanks) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: rank {} of {} is not a valid rank (valid: size 1..{}, "
                            "rank 0..size-1)",
                            rank, size, wire::kMaxRanks));
  }
}

Fd connect_any(const Target& target, Deadline deadline, std::string* problem) {
  for (const auto& address : target.addresses) {
    int error = 0;
    const Deadline attempt = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    Fd fd = connect_before(address, attempt, &error);
    if (fd.valid()) return fd;
    *problem = fmt::format("cannot connect to the root at {}: {}", address.to_string(),
                           std::strerror(error));
  }
  return Fd();
}

// How a handshake step ended.
enum class Step {
  kOk,
  kRefused,  // the root said no (an error frame): final unless retry_refusals
  kDropped,  // the connection closed or was reset (recv_all: kClosed) without a
             // word: a root under a connection flood evicts unauthenticated
             // connections, so retry
};

// Reads one handshake frame of type `want` and exactly `length` payload
// bytes into `payload`. Throws for a peer that is not a root, or a timeout.
Step read_handshake_frame(int fd, const Target& target, Deadline deadline, wire::FrameType want,
                          std::size_t length, std::span<std::uint8_t> payload) {
  int error = 0;
  std::uint8_t header[wire::kHeaderBytes];
  const IoResult got = recv_all(fd, header, deadline, -1, &error);
  if (got == IoResult::kClosed) return Step::kDropped;
  if (got != IoResult::kOk) {
    throw Error(
        got == IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_IO,
        fmt::format("bootstrap: no answer from the root at {} during authentication "
                    "({})",
                    target.name, got == IoResult::kTimeout ? "timed out" : std::strerror(error)));
  }
  wire::Header h;
  try {
    h = wire::decode_header(header);
  } catch (const wire::ProtocolError& e) {
    throw Error(WIA_ERROR_REMOTE, fmt::format("bootstrap: {} is not a libwia bootstrap root: {}",
                                              target.name, e.what()));
  }
  if (h.type == wire::FrameType::kError) return Step::kRefused;
  if (h.type != want || h.length != length) {
    throw Error(WIA_ERROR_REMOTE,
                fmt::format("bootstrap: the root at {} sent '{}' ({} bytes) "
                            "during authentication",
                            target.name, wire::frame_type_name(h.type), h.length));
  }
  const IoResult body = recv_all(fd, payload, deadline, -1, &error);
  if (body == IoResult::kClosed) return Step::kDropped;
  if (body != IoResult::kOk) {
    throw Error(WIA_ERROR_TIMEOUT, fmt::format("bootstrap: the root at {} stalled during "
                                               "authentication",
                                               target.name));
  }
  return Step::kOk;
}

// Challenge-response; on anything but kOk, *why says what happened.
// Throws for a peer that is not a root.
Step handshake(int fd, const Target& target, Deadline deadline, std::string* why) {
  std::array<std::uint8_t, wire::kNonceBytes> server_nonce{};
  Step step = read_handshake_frame(fd, target, deadline, wire::FrameType::kChallenge,
                                   wire::kNonceBytes, server_nonce);
  if (step != Step::kOk) {
    *why = fmt::format("the root at {} closed the connection before authentication", target.name);
    return step;
  }
  std::array<std::uint8_t, wire::kNonceBytes> client_nonce{};
  random_bytes(client_nonce);
  std::vector<std::uint8_t> message(wire::kClientRole.begin(), wire::kClientRole.end());
  message.insert(message.end(), server_nonce.begin(), server_nonce.end());
  message.insert(message.end(), client_nonce.begin(), client_nonce.end());
  const auto auth = wire::Writer(wire::FrameType::kAuth)
                        .bytes(client_nonce)
                        .u64(siphash24(target.secret, message))
                        .finish();
  int error = 0;
  if (send_all(fd, auth, deadline, -1, &error) != IoResult::kOk) {
    *why = fmt::format("the root at {} closed the connection during authentication", target.name);
    return Step::kDropped;
  }
  std::array<std::uint8_t, wire::kMacBytes> proof{};
  step =
      read_handshake_frame(fd, target, deadline, wire::FrameType::kAuthOk, wire::kMacBytes, proof);
  if (step == Step::kDropped) {
    *why = fmt::format("the root at {} closed the connection during authentication", target.name);
    return step;
  }
  if (step == Step::kRefused) {
    *why = fmt::format(
        "the root at {} refused this rank's authentication: the secrets differ (a different "
        "WIA_AUTH_KEY, a stale unique id, or another job's root on that port)",
        target.name);
    return step;
  }
  std::vector<std::uint8_t> answer(wire::kServerRole.begin(), wire::kServerRole.end());
  answer.insert(answer.end(), client_nonce.begin(), client_nonce.end());
  answer.insert(answer.end(), server_nonce.begin(), server_nonce.end());
  std::array<std::uint8_t, wire::kMacBytes> expected{};
  wire::store_le(expected.data(), siphash24(target.secret, answer), 8);
  if (!constant_time_equal(expected, proof)) {
    *why = fmt::format(
        "the root at {} did not prove knowledge of the job's secret (another "
        "job's root on that port?)",
        target.name);
    return Step::kRefused;
  }
  return Step::kOk;
}

// Connects to the root `source` leads to and authenticates, trying again
// with a growing pause until options.timeout. Returns the authenticated
// socket; *root_name is the name of the last target tried.
Fd reach_root(const TargetSource& source, int rank, const Options& options, bool retry_refusals,
              std::string* root_name) {
  const Deadline deadline = Clock::now() + options.timeout;
  std::string last_problem = "no attempt finished";
  auto backoff = std::chrono::milliseconds(20);
  for (;;) {
    if (Clock::now() >= deadline) {
      throw Error(WIA_ERROR_TIMEOUT,
                  fmt::format("bootstrap: rank {} could not join within {} ms: {}", rank,
                              options.timeout.count(), last_problem));
    }
    std::string waiting;
    std::optional<Target> target = source(&waiting);
    if (target) {
      *root_name = target->name;
      Fd fd = connect_any(*target, deadline, &last_problem);
      if (fd.valid()) {
        std::string refusal;
        const Step step = handshake(fd.get(), *target, deadline, &refusal);
        if (step == Step::kOk) return fd;
        // A refusal is final (unless a stale rendezvous file may be the
        // cause); a dropped connection is a busy root: try again.
        if (step == Step::kRefused && !retry_refusals) {
          throw Error(WIA_ERROR_REMOTE, fmt::format("bootstrap: rank {}: {}", rank, refusal));
        }
        if (step == Step::kDropped) {
          log::debug(kTag, "rank {}: {} (a busy root?); trying again", rank, refusal);
        }
        last_problem = refusal;
      }
    } else {
      last_problem = waiting;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
}

// Rank 0 with a root address: listens on exactly that address when it is
// numeric (so "127.0.0.1:p" stays on loopback), else on every interface, as
// a name may resolve to any of ours. *self gets the addresses this process
// reaches the root at.
Fd listen_at_root_address(const LaunchInfo& launch, const HostPort& hp,
                          std::vector<SocketAddress>* self) {
  const auto numeric = numeric_address(hp.host, hp.port);
  try {
    if (numeric) {
      *self = {*numeric};
      return listen_on(*numeric, 1024);
    }
    try {
      Fd listener = listen_on(wildcard_address(AF_INET6, hp.port), 1024);
      *self = {loopback_address(AF_INET, hp.port), loopback_address(AF_INET6, hp.port)};
      return listener;
    } catch (const Error&) {
      Fd listener = listen_on(wildcard_address(AF_INET, hp.port), 1024);
      *self = {loopback_address(AF_INET, hp.port)};
      return listener;
    }
  } catch (const Error& e) {
    throw Error(e.status(),
                fmt::format("{} (rank 0 runs the bootstrap root on {}{}; is the port free, "
                            "and is rank 0 on that host?)",
                            e.what(), launch.root_address,
                            launch.launcher == Launcher::kTorchrun
                                ? ", MASTER_PORT + 1 unless WIA_BOOTSTRAP_PORT is set"
                                : ""));
  }
}

// The launcher names the root's address: rank 0 starts the root there, the
// other ranks resolve the address and join.
std::unique_ptr<Bootstrap> join_at_root_address(const LaunchInfo& launch, const Options& options) {
  std::string why;
  const auto hp = parse_host_port(launch.root_address, &why);
  if (!hp || !launch.secret) {
    throw Error(WIA_ERROR_CONFIG, fmt::format("bootstrap: root address '{}' is invalid: {}",
                                              launch.root_address, why));
  }
  const Secret secret = *launch.secret;
  if (launch.rank == 0) {
    std::vector<SocketAddress> self;
    Fd listener = listen_at_root_address(launch, *hp, &self);
    auto root = start_hosted_root(std::move(listener), secret, options,
                                  static_cast<std::uint32_t>(launch.size));
    Target target{self, secret, launch.root_address};
    return Joiner::join([&](std::string*) { return target; }, 0, launch.size, options,
                        std::move(root), false);
  }
  return Joiner::join(
      [&](std::string*) {
        return std::optional<Target>(
            Target{resolve(hp->host, hp->port), secret, launch.root_address});
      },
      launch.rank, launch.size, options, nullptr, false);
}

// One node, no address: rank 0 starts a loopback root and publishes it in
// the rendezvous file, which the other ranks read.
std::unique_ptr<Bootstrap> join_through_rendezvous_file(const LaunchInfo& launch,
                                                        const Options& options) {
  const std::string& path = launch.rendezvous_file;
  if (launch.rank == 0) {
    Fd listener;
    try {
      listener = listen_on(loopback_address(AF_INET, 0), 1024);
    } catch (const Error&) {
      listener = listen_on(loopback_address(AF_INET6, 0), 1024);
    }
    const SocketAddress address = local_address(listener.get());
    const Secret secret = launch.secret ? *launch.secret : random_secret();
    auto root = start_hosted_root(std::move(listener), secret, options,
                                  static_cast<std::uint32_t>(launch.size));
    write_rendezvous_file(path, address, secret, launch.size);
    struct Unlink {
      const std::string& path;
      ~Unlink() { ::unlink(path.c_str()); }
    } unlink_when_done{path};
    Target target{{address}, secret, address.to_string()};
    return Joiner::join([&](std::string*) { return target; }, 0, launch.size, options,
                        std::move(root), false);
  }
  // A stale file from an earlier job with the same id may name a dead port
  // or another root: keep re-reading it until rank 0 replaces it.
  return Joiner::join(
      [&](std::string* waiting) -> std::optional<Target> {
        auto published = read_rendezvous_file(path, launch.size, waiting);
        if (!published) return std::nullopt;
        Target target{{published->address}, published->secret, published->address.to_string()};
        if (launch.secret) target.secret = *launch.secret;
        return target;
      },
      launch.rank, launch.size, options, nullptr, true);
}

}  // namespace

std::string default_host_id() {
  if (const char* fake = std::getenv("WIA_HOSTID"); fake != nullptr && *fake != '\0') return fake;
  return host_name() + ":" + read_small_file("/proc/sys/kernel/random/boot_id");
}

std::unique_ptr<Bootstrap> Joiner::join(const TargetSource& source, int rank, int size,
                                        const Options& options, std::shared_ptr<RootServer> root,
                                        bool retry_refusals) {
  check_rank_and_size(rank, size);
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->rank_ = rank;
  b->size_ = size;
  b->timeout_ = options.timeout;
  b->root_ = std::move(root);
  b->wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!b->wake_.valid()) {
    throw Error(WIA_ERROR_IO,
                fmt::format("bootstrap: cannot create an eventfd: {}", std::strerror(errno)));
  }
  b->socket_ = reach_root(source, rank, options, retry_refusals, &b->root_address_);
  // Authenticated: say who we are and wait for everyone else.
  const std::string host_id = options.host_id.empty() ? default_host_id() : options.host_id;
  b->send_frame(wire::Writer(wire::FrameType::kHello)
                    .u32(static_cast<std::uint32_t>(rank))
                    .u32(static_cast<std::uint32_t>(size))
                    .u32(static_cast<std::uint32_t>(getpid()))
                    .text(host_id.substr(0, wire::kMaxTextBytes))
                    .text(host_name())
                    .finish());
  b->await_welcome();
  log::debug(kTag, "rank {} of {} joined via {} (node {} of {}, local rank {} of {})", rank, size,
             b->root_address_, b->node(), b->nnodes(), b->local_rank(), b->local_size());
  return b;
}

std::unique_ptr<Bootstrap> Bootstrap::from_environment(const Options& options) {
  const LaunchInfo launch = detect_launcher(process_environment(), options.port, geteuid());
  return from_launch_info(launch, options);
}

std::unique_ptr<Bootstrap> Bootstrap::from_launch_info(const LaunchInfo& launch,
                                                       const Options& options) {
  if (launch.launcher == Launcher::kNone) {
    throw Error(WIA_ERROR_CONFIG,
                "bootstrap: no launcher found: set WIA_RANK, WIA_WORLD_SIZE and WIA_ROOT_ADDR, "
                "run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun "
                "(OMPI_COMM_WORLD_*, PMI_*) or srun (SLURM_PROCID, SLURM_NTASKS), or join with a "
                "unique id");
  }
  log::debug(kTag, "launch: {}", launch.summary);
  if (launch.secret_derived && launch.rank == 0) {
    log::info(kTag,
              "no WIA_AUTH_KEY: the bootstrap secret is derived from the job's variables "
              "(keeps stray clients out; set WIA_AUTH_KEY to keep out anyone who can read "
              "the job's environment)");
  }
  if (!launch.root_address.empty()) return join_at_root_address(launch, options);
  return join_through_rendezvous_file(launch, options);
}

}  // namespace wia::bootstrap
