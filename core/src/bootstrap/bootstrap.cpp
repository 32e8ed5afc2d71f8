// SPDX-License-Identifier: Apache-2.0
#include "bootstrap/bootstrap.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>
#include <unordered_map>

#include "bootstrap/root.hpp"
#include "bootstrap/wire.hpp"
#include "common/error.hpp"
#include "common/log.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::string_view kTag = "bootstrap";
// How long a rank waits, after its own timeout, for the root to name the
// missing ranks.
constexpr auto kReportGrace = std::chrono::seconds(5);
constexpr char kIdMagic[4] = {'W', 'I', 'A', 'U'};
constexpr std::uint8_t kIdVersion = 1;
constexpr std::size_t kIdCheckedBytes = 44;  // bytes covered by the check field

// Roots started by this process. A root outlives the call that started it
// (create_unique_id returns at once), so something must own it; at exit the
// roots are stopped. A forked child inherits the table but not the
// threads: it must neither use nor join them.
class RootRegistry {
 public:
  void add(std::shared_ptr<RootServer> root) {
    std::lock_guard lock(mu_);
    forget_inherited();
    std::erase_if(roots_, [](const auto& r) { return r->finished(); });
    roots_.push_back(std::move(root));
  }
  std::shared_ptr<RootServer> find(const Secret& secret) {
    std::lock_guard lock(mu_);
    forget_inherited();
    for (const auto& r : roots_) {
      if (!r->finished() && r->secret() == secret) return r;
    }
    return nullptr;
  }
  ~RootRegistry() {
    forget_inherited();
    for (const auto& r : roots_) r->stop();
  }

 private:
  // Roots inherited through fork() have no thread here: destroying one
  // would join a thread that does not exist. They are leaked on purpose.
  void forget_inherited() {
    if (getpid() == owner_) return;
    new std::vector<std::shared_ptr<RootServer>>(std::move(roots_));
    roots_.clear();
    owner_ = getpid();
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<RootServer>> roots_;
  pid_t owner_ = getpid();
};

RootRegistry& registry() {
  static RootRegistry instance;
  return instance;
}

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

std::uint64_t load_le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void store_le(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

struct Ticket {
  SocketAddress address;
  Secret secret;
};

UniqueId encode_id(const SocketAddress& address, const Secret& secret) {
  UniqueId id;
  auto& b = id.bytes;
  std::memcpy(b.data(), kIdMagic, 4);
  b[4] = kIdVersion;
  b[5] = address.family() == AF_INET6 ? 6 : 4;
  b[6] = static_cast<std::uint8_t>(address.port() >> 8);
  b[7] = static_cast<std::uint8_t>(address.port() & 0xff);
  if (address.family() == AF_INET6) {
    const auto& sin6 = reinterpret_cast<const sockaddr_in6&>(address.storage);
    std::memcpy(b.data() + 8, &sin6.sin6_addr, 16);
    store_le(b.data() + 24, sin6.sin6_scope_id, 4);
  } else {
    const auto& sin = reinterpret_cast<const sockaddr_in&>(address.storage);
    std::memcpy(b.data() + 8, &sin.sin_addr, 4);
  }
  std::memcpy(b.data() + 28, secret.bytes.data(), 16);
  // A check over the rest catches ids mangled in transit (not forgery: the
  // key is public).
  store_le(b.data() + kIdCheckedBytes,
           siphash24(Secret{}, std::span<const std::uint8_t>(b.data(), kIdCheckedBytes)), 8);
  return id;
}

Ticket decode_id(const UniqueId& id) {
  const auto& b = id.bytes;
  const bool intact =
      std::memcmp(b.data(), kIdMagic, 4) == 0 && b[4] == kIdVersion && (b[5] == 4 || b[5] == 6) &&
      load_le(b.data() + kIdCheckedBytes, 8) ==
          siphash24(Secret{}, std::span<const std::uint8_t>(b.data(), kIdCheckedBytes));
  if (!intact) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                "bootstrap: the unique id is corrupt or was not made by create_unique_id() (bad "
                "magic, version or check)");
  }
  Ticket t;
  const std::uint16_t port = static_cast<std::uint16_t>((b[6] << 8) | b[7]);
  if (b[5] == 6) {
    auto& sin6 = reinterpret_cast<sockaddr_in6&>(t.address.storage);
    sin6.sin6_family = AF_INET6;
    std::memcpy(&sin6.sin6_addr, b.data() + 8, 16);
    sin6.sin6_scope_id = static_cast<std::uint32_t>(load_le(b.data() + 24, 4));
    t.address.length = sizeof(sockaddr_in6);
  } else {
    auto& sin = reinterpret_cast<sockaddr_in&>(t.address.storage);
    sin.sin_family = AF_INET;
    std::memcpy(&sin.sin_addr, b.data() + 8, 4);
    t.address.length = sizeof(sockaddr_in);
  }
  t.address.set_port(port);
  std::memcpy(t.secret.bytes.data(), b.data() + 28, 16);
  return t;
}

std::optional<SocketAddress> numeric_address(const std::string& host, std::uint16_t port) {
  SocketAddress out;
  auto& sin = reinterpret_cast<sockaddr_in&>(out.storage);
  auto& sin6 = reinterpret_cast<sockaddr_in6&>(out.storage);
  if (inet_pton(AF_INET, host.c_str(), &sin.sin_addr) == 1) {
    sin.sin_family = AF_INET;
    out.length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &sin6.sin6_addr) == 1) {
    sin6.sin6_family = AF_INET6;
    out.length = sizeof(sockaddr_in6);
  } else {
    return std::nullopt;
  }
  out.set_port(port);
  return out;
}

SocketAddress loopback(int family, std::uint16_t port) {
  return *numeric_address(family == AF_INET6 ? "::1" : "127.0.0.1", port);
}

std::shared_ptr<RootServer> start_root(Fd listener, const Secret& secret, const Options& options,
                                       std::uint32_t expected_size) {
  RootServer::Settings settings;
  settings.secret = secret;
  settings.timeout = options.timeout;
  settings.handshake_timeout = options.handshake_timeout;
  settings.expected_size = expected_size;
  auto root = std::make_shared<RootServer>(std::move(listener), settings);
  registry().add(root);
  log::debug(kTag, "root listening on {}", root->address().to_string());
  return root;
}

// Where a joining rank goes: from a unique id, a root address, or a file.
struct Target {
  std::vector<SocketAddress> addresses;
  Secret secret;
  std::string name;  // for messages: "10.0.0.2:29500"
};
// Returns the target, or nullopt with *waiting set to what is still missing
// (try again later). Throws for errors that waiting cannot fix.
using TargetSource = std::function<std::optional<Target>(std::string* waiting)>;

// The one-node rendezvous file: "wia-bootstrap 1 <addr:port> <secret> <size>".
void write_rendezvous_file(const std::string& path, const SocketAddress& address,
                           const Secret& secret, int size) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, getpid());
  ::unlink(tmp.c_str());
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) {
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: rank 0 cannot create the rendezvous file {}: "
                                          "{}",
                                          tmp, std::strerror(errno)));
  }
  const std::string text =
      fmt::format("wia-bootstrap 1 {} {} {}\n", address.to_string(), to_hex(secret.bytes), size);
  const bool written =
      ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fd.reset();
  if (!written || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(WIA_ERROR_IO, fmt::format("bootstrap: rank 0 cannot write the rendezvous file {}: "
                                          "{}",
                                          path, std::strerror(err)));
  }
}

std::optional<Target> read_rendezvous_file(const std::string& path, int size,
                                           std::string* waiting) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    *waiting = fmt::format(
        "found no rendezvous file {} (rank 0 did not start, or runs on another "
        "node: multi-node jobs need WIA_ROOT_ADDR)",
        path);
    return std::nullopt;
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0) {
    throw Error(WIA_ERROR_IO,
                fmt::format("bootstrap: refusing rendezvous file {}: it must be a regular file "
                            "owned by uid {} with mode 0600 (it has uid {}, mode {:o})",
                            path, geteuid(), st.st_uid, st.st_mode & 07777));
  }
  char buf[512] = {};
  const ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  std::string_view text(buf, static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
  // Fields: magic, version, address, secret, size.
  std::vector<std::string_view> fields;
  while (!text.empty()) {
    const auto space = text.find_first_of(" \n");
    if (space != 0) fields.push_back(text.substr(0, space));
    if (space == std::string_view::npos) break;
    text.remove_prefix(space + 1);
  }
  Target t;
  std::string why;
  const auto hp = fields.size() == 5 ? parse_host_port(fields[2], &why) : std::nullopt;
  if (fields.size() != 5 || fields[0] != "wia-bootstrap" || fields[1] != "1" || !hp ||
      !from_hex(fields[3], t.secret.bytes)) {
    *waiting = fmt::format("rendezvous file {} is malformed", path);
    return std::nullopt;  // maybe a different libwia version; wait for the right one
  }
  if (fields[4] != std::to_string(size)) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: rank 0 runs a job of {} ranks (rendezvous file {}), this "
                            "rank was told {}",
                            fields[4], path, size));
  }
  const auto address = numeric_address(hp->host, hp->port);
  if (!address) {
    *waiting = fmt::format("rendezvous file {} names no numeric address", path);
    return std::nullopt;
  }
  t.addresses.push_back(*address);
  t.name = address->to_string();
  return t;
}

}  // namespace

std::string default_host_id() {
  if (const char* fake = std::getenv("WIA_HOSTID"); fake != nullptr && *fake != '\0') return fake;
  return host_name() + ":" + read_small_file("/proc/sys/kernel/random/boot_id");
}

NodeLayout compute_node_layout(std::span<const std::string> host_ids) {
  NodeLayout layout;
  std::unordered_map<std::string_view, int> node_of_host;
  for (std::size_t r = 0; r < host_ids.size(); ++r) {
    auto [it, fresh] = node_of_host.try_emplace(host_ids[r], layout.nnodes);
    if (fresh) {
      ++layout.nnodes;
      layout.ranks_of_node.emplace_back();
    }
    auto& ranks = layout.ranks_of_node[static_cast<std::size_t>(it->second)];
    layout.node_of_rank.push_back(it->second);
    layout.local_rank_of_rank.push_back(static_cast<int>(ranks.size()));
    ranks.push_back(static_cast<int>(r));
  }
  return layout;
}

Options Options::from_config(const Config& config, const EnvLookup& env) {
  Options options;
  options.timeout = std::chrono::milliseconds(config.get_int("bootstrap.timeout_ms"));
  options.port = static_cast<int>(config.get_int("bootstrap.port"));
  options.ifname = config.get_string("bootstrap.ifname");
  if (const char* ifname = env("WIA_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0') {
    options.ifname = ifname;
  }
  if (const char* family = env("WIA_SOCKET_FAMILY"); family != nullptr && *family != '\0') {
    const std::string_view f(family);
    if (f == "AF_INET" || f == "4" || f == "ipv4") {
      options.family = AF_INET;
    } else if (f == "AF_INET6" || f == "6" || f == "ipv6") {
      options.family = AF_INET6;
    } else {
      throw Error(WIA_ERROR_CONFIG,
                  fmt::format("bootstrap: WIA_SOCKET_FAMILY='{}' is not AF_INET or AF_INET6", f));
    }
  }
  if (const char* host = env("WIA_HOSTID"); host != nullptr && *host != '\0') {
    options.host_id = host;
  }
  return options;
}

UniqueId create_unique_id(const Options& options) {
  const auto interfaces = list_interfaces();
  const auto chosen = choose_interface(interfaces, options.ifname, options.family);
  if (!chosen) {
    throw Error(
        WIA_ERROR_CONFIG,
        fmt::format(
            "bootstrap: no usable interface address{}{}; interfaces: {}",
            options.ifname.empty() ? "" : " matches WIA_SOCKET_IFNAME='" + options.ifname + "'",
            options.family == AF_INET    ? " (IPv4 only)"
            : options.family == AF_INET6 ? " (IPv6 only)"
                                         : "",
            describe_interfaces(interfaces)));
  }
  Fd listener = listen_on(chosen->address, 1024);
  SocketAddress advertised = chosen->address;
  advertised.set_port(local_address(listener.get()).port());
  const Secret secret = random_secret();
  start_root(std::move(listener), secret, options, 0);
  log::debug(kTag, "unique id leads to {} (interface {})", advertised.to_string(), chosen->ifname);
  return encode_id(advertised, secret);
}

std::string describe_unique_id(const UniqueId& id) { return decode_id(id).address.to_string(); }

// Builds a Bootstrap by connecting, authenticating and saying hello.
struct Joiner {
  static std::unique_ptr<Bootstrap> join(const TargetSource& source, int rank, int size,
                                         const Options& options, std::shared_ptr<RootServer> root,
                                         bool retry_refusals) {
    // rank >= size is left for the root to refuse, so every rank of the
    // job hears of it, not just this one.
    if (size < 1 || static_cast<std::uint32_t>(size) > wire::kMaxRanks || rank < 0 ||
        static_cast<std::uint32_t>(rank) >= wire::kMaxRanks) {
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("bootstrap: rank {} of {} is not a valid rank (valid: size 1..{}, "
                              "rank 0..size-1)",
                              rank, size, wire::kMaxRanks));
    }
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
        b->root_address_ = target->name;
        Fd fd = connect_any(*target, deadline, &last_problem);
        if (fd.valid()) {
          std::string refusal;
          if (handshake(fd.get(), *target, deadline, &refusal)) {
            b->socket_ = std::move(fd);
            break;
          }
          if (!retry_refusals) {
            throw Error(WIA_ERROR_REMOTE, fmt::format("bootstrap: rank {}: {}", rank, refusal));
          }
          last_problem = refusal;
        }
      } else {
        last_problem = waiting;
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
    // Authenticated: say who we are and wait for everyone else.
    const std::string host_id = options.host_id.empty() ? default_host_id() : options.host_id;
    b->send_frame(wire::Writer(wire::FrameType::kHello)
                      .u32(static_cast<std::uint32_t>(rank))
                      .u32(static_cast<std::uint32_t>(size))
                      .u32(static_cast<std::uint32_t>(getpid()))
                      .text(host_id.substr(0, wire::kMaxTextBytes))
                      .text(host_name())
                      .finish());
    b->wait_or_report([&] { return b->welcomed_; },
                      static_cast<std::uint8_t>(wire::WaitKind::kRendezvous), 0,
                      "the other ranks to join");
    log::debug(kTag, "rank {} of {} joined via {} (node {} of {}, local rank {} of {})", rank, size,
               b->root_address_, b->node(), b->nnodes(), b->local_rank(), b->local_size());
    return b;
  }

  static Fd connect_any(const Target& target, Deadline deadline, std::string* problem) {
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

  // Challenge-response; false (with *refusal) when the root refused us or
  // failed to prove the secret; throws for a peer that is not a root.
  static bool handshake(int fd, const Target& target, Deadline deadline, std::string* refusal) {
    int error = 0;
    auto read_frame = [&](wire::FrameType want, std::size_t length,
                          std::span<std::uint8_t> payload) -> bool {
      std::uint8_t header[wire::kHeaderBytes];
      const IoResult got = recv_all(fd, header, deadline, -1, &error);
      if (got == IoResult::kClosed) return false;
      if (got != IoResult::kOk) {
        throw Error(got == IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_IO,
                    fmt::format("bootstrap: no answer from the root at {} during authentication "
                                "({})",
                                target.name,
                                got == IoResult::kTimeout ? "timed out" : std::strerror(error)));
      }
      wire::Header h;
      try {
        h = wire::decode_header(header);
      } catch (const wire::ProtocolError& e) {
        throw Error(
            WIA_ERROR_REMOTE,
            fmt::format("bootstrap: {} is not a libwia bootstrap root: {}", target.name, e.what()));
      }
      if (h.type == wire::FrameType::kError) return false;
      if (h.type != want || h.length != length) {
        throw Error(WIA_ERROR_REMOTE,
                    fmt::format("bootstrap: the root at {} sent '{}' ({} bytes) during "
                                "authentication",
                                target.name, wire::frame_type_name(h.type), h.length));
      }
      const IoResult body = recv_all(fd, payload, deadline, -1, &error);
      if (body == IoResult::kClosed) return false;
      if (body != IoResult::kOk) {
        throw Error(WIA_ERROR_TIMEOUT, fmt::format("bootstrap: the root at {} stalled during "
                                                   "authentication",
                                                   target.name));
      }
      return true;
    };
    std::array<std::uint8_t, wire::kNonceBytes> server_nonce{};
    if (!read_frame(wire::FrameType::kChallenge, wire::kNonceBytes, server_nonce)) {
      *refusal =
          fmt::format("the root at {} closed the connection before authentication", target.name);
      return false;
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
    if (send_all(fd, auth, deadline, -1, &error) != IoResult::kOk) {
      *refusal =
          fmt::format("the root at {} closed the connection during authentication", target.name);
      return false;
    }
    std::array<std::uint8_t, wire::kMacBytes> proof{};
    if (!read_frame(wire::FrameType::kAuthOk, wire::kMacBytes, proof)) {
      *refusal = fmt::format(
          "the root at {} refused this rank's authentication: the secrets differ (a different "
          "WIA_AUTH_KEY, a stale unique id, or another job's root on that port)",
          target.name);
      return false;
    }
    std::vector<std::uint8_t> answer(wire::kServerRole.begin(), wire::kServerRole.end());
    answer.insert(answer.end(), client_nonce.begin(), client_nonce.end());
    answer.insert(answer.end(), server_nonce.begin(), server_nonce.end());
    std::array<std::uint8_t, wire::kMacBytes> expected{};
    store_le(expected.data(), siphash24(target.secret, answer), 8);
    if (!constant_time_equal(expected, proof)) {
      *refusal = fmt::format(
          "the root at {} did not prove knowledge of the job's secret (another "
          "job's root on that port?)",
          target.name);
      return false;
    }
    return true;
  }
};

std::unique_ptr<Bootstrap> Bootstrap::from_unique_id(const UniqueId& id, int rank, int size,
                                                     const Options& options) {
  const Ticket ticket = decode_id(id);
  Target target{{ticket.address}, ticket.secret, ticket.address.to_string()};
  return Joiner::join([&](std::string*) { return target; }, rank, size, options,
                      registry().find(ticket.secret), false);
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
  const auto size = static_cast<std::uint32_t>(launch.size);
  if (!launch.root_address.empty()) {
    std::string why;
    const auto hp = parse_host_port(launch.root_address, &why);
    if (!hp || !launch.secret) {
      throw Error(WIA_ERROR_CONFIG, fmt::format("bootstrap: root address '{}' is invalid: {}",
                                                launch.root_address, why));
    }
    const Secret secret = *launch.secret;
    if (launch.rank == 0) {
      // Bind exactly the address when it is numeric (so "127.0.0.1:p" stays
      // on loopback), else every interface: a name may resolve to any of ours.
      const auto numeric = numeric_address(hp->host, hp->port);
      Fd listener;
      std::vector<SocketAddress> self;
      try {
        if (numeric) {
          listener = listen_on(*numeric, 1024);
          self.push_back(*numeric);
        } else {
          try {
            listener = listen_on(wildcard_address(AF_INET6, hp->port), 1024);
            self = {loopback(AF_INET, hp->port), loopback(AF_INET6, hp->port)};
          } catch (const Error&) {
            listener = listen_on(wildcard_address(AF_INET, hp->port), 1024);
            self = {loopback(AF_INET, hp->port)};
          }
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
      auto root = start_root(std::move(listener), secret, options, size);
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

  // One node, no address: rank 0 publishes a loopback root in a file.
  const std::string& path = launch.rendezvous_file;
  if (launch.rank == 0) {
    Fd listener;
    try {
      listener = listen_on(loopback(AF_INET, 0), 1024);
    } catch (const Error&) {
      listener = listen_on(loopback(AF_INET6, 0), 1024);
    }
    const SocketAddress address = local_address(listener.get());
    const Secret secret = launch.secret ? *launch.secret : random_secret();
    auto root = start_root(std::move(listener), secret, options, size);
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
      [&](std::string* waiting) {
        auto target = read_rendezvous_file(path, launch.size, waiting);
        if (target && launch.secret) target->secret = *launch.secret;
        return target;
      },
      launch.rank, launch.size, options, nullptr, true);
}

Bootstrap::~Bootstrap() {
  if (socket_.valid() && !failed_ && !aborted_.load()) {
    try {
      std::unique_lock lock(send_mu_, std::chrono::seconds(1));
      if (lock.owns_lock()) {
        int error = 0;
        const auto bye = wire::Writer(wire::FrameType::kBye).finish();
        send_all(socket_.get(), bye, Clock::now() + std::chrono::seconds(2), -1, &error);
      }
    } catch (...) {
    }
  }
  socket_.reset();
  if (!root_) return;
  if (welcomed_ && !failed_ && !aborted_.load()) {
    // Other ranks may still need the root (this process hosts it).
    if (!root_->wait_finished(Clock::now() + timeout_)) {
      log::warn(kTag,
                "rank {}: some ranks still use the bootstrap root hosted here after {} ms; "
                "it stops when this process exits",
                rank_, timeout_.count());
    }
    return;
  }
  // Failed: this process may exit right after; let the root first deliver
  // the failure to the other ranks, so they see the reason and not just a
  // lost connection.
  root_->drain_and_stop();
  root_->wait_finished(Clock::now() + std::chrono::seconds(4));
}

void Bootstrap::fail_sticky(wia_status_t status, std::string message) {
  if (!failed_) {
    failed_ = true;
    failed_status_ = status;
    failed_message_ = std::move(message);
  }
  throw Error(failed_status_, failed_message_);
}

void Bootstrap::throw_if_failed() const {
  if (failed_) throw Error(failed_status_, failed_message_);
}

void Bootstrap::send_frame(const std::vector<std::uint8_t>& frame) {
  throw_if_failed();
  IoResult result;
  int error = 0;
  {
    std::unique_lock lock(send_mu_);
    result = send_all(socket_.get(), frame, Clock::now() + timeout_, wake_.get(), &error);
    // A frame cut short leaves the stream unusable: nothing may follow it.
    if (result != IoResult::kOk) stream_broken_.store(true);
  }
  switch (result) {
    case IoResult::kOk:
      return;
    case IoResult::kWoken:
      break;  // abort(): reported below
    case IoResult::kTimeout:
      fail_sticky(WIA_ERROR_TIMEOUT,
                  fmt::format("bootstrap: rank {} could not send to the root at {} within {} ms",
                              rank_, root_address_, timeout_.count()));
    case IoResult::kClosed:
    case IoResult::kError:
      fail_sticky(WIA_ERROR_REMOTE,
                  fmt::format("bootstrap: rank {} lost its connection to the root at {} ({}); "
                              "did the process hosting the root exit?",
                              rank_, root_address_,
                              result == IoResult::kClosed ? "closed" : std::strerror(error)));
  }
  std::lock_guard lock(abort_mu_);
  fail_sticky(WIA_ERROR_ABORTED,
              fmt::format("bootstrap: aborted on rank {}: {}", rank_, abort_reason_));
}

bool Bootstrap::pump_one(Deadline deadline) {
  throw_if_failed();
  auto aborted = [this]() {
    std::lock_guard lock(abort_mu_);
    fail_sticky(WIA_ERROR_ABORTED,
                fmt::format("bootstrap: aborted on rank {}: {}", rank_, abort_reason_));
  };
  if (aborted_.load()) aborted();
  for (;;) {
    pollfd p[2] = {{socket_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int ready = ::poll(p, 2, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      fail_sticky(WIA_ERROR_IO, fmt::format("bootstrap: poll failed: {}", std::strerror(errno)));
    }
    if ((p[1].revents & POLLIN) != 0) aborted();
    if (ready == 0) return false;
    break;
  }
  auto lost = [this](IoResult r, int error) {
    if (r == IoResult::kWoken) {
      std::lock_guard lock(abort_mu_);
      fail_sticky(WIA_ERROR_ABORTED,
                  fmt::format("bootstrap: aborted on rank {}: {}", rank_, abort_reason_));
    }
    fail_sticky(r == IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_REMOTE,
                fmt::format("bootstrap: rank {} lost its connection to the root at {} ({}); did "
                            "the process hosting the root exit or die?",
                            rank_, root_address_,
                            r == IoResult::kClosed    ? "connection closed"
                            : r == IoResult::kTimeout ? "a frame stalled mid-way"
                                                      : std::strerror(error)));
  };
  // A frame that has begun arrives promptly; give it the full timeout anyway.
  const Deadline frame_deadline = Clock::now() + timeout_;
  std::uint8_t header[wire::kHeaderBytes];
  int error = 0;
  if (IoResult r = recv_all(socket_.get(), header, frame_deadline, wake_.get(), &error);
      r != IoResult::kOk) {
    lost(r, error);
  }
  wire::Header h;
  std::size_t bound = wire::kMaxReplyBytes;
  try {
    h = wire::decode_header(header);
    if (h.type == wire::FrameType::kGatherResult) {
      bound = 12 + static_cast<std::size_t>(size_) * expected_gather_bytes_;
    } else if (h.type == wire::FrameType::kWelcome) {
      bound = 4 + static_cast<std::size_t>(size_) * (4 + wire::kMaxTextBytes);
    }
    if (h.length > bound) {
      throw wire::ProtocolError(fmt::format("'{}' frame of {} bytes exceeds its bound of {}",
                                            wire::frame_type_name(h.type), h.length, bound));
    }
  } catch (const wire::ProtocolError& e) {
    fail_sticky(WIA_ERROR_REMOTE, fmt::format("bootstrap: rank {} got a malformed frame from the "
                                              "root at {}: {}",
                                              rank_, root_address_, e.what()));
  }
  std::vector<std::uint8_t> payload(h.length);
  if (IoResult r = recv_all(socket_.get(), payload, frame_deadline, wake_.get(), &error);
      r != IoResult::kOk) {
    lost(r, error);
  }
  try {
    wire::Reader r(payload);
    switch (h.type) {
      case wire::FrameType::kWelcome: {
        if (r.u32() != static_cast<std::uint32_t>(size_) || welcomed_) {
          throw wire::ProtocolError("welcome for a different job size");
        }
        host_ids_.clear();
        for (int i = 0; i < size_; ++i) host_ids_.push_back(r.text(wire::kMaxTextBytes));
        r.expect_end();
        layout_ = compute_node_layout(host_ids_);
        welcomed_ = true;
        return true;
      }
      case wire::FrameType::kGatherResult: {
        const std::uint64_t seq = r.u64();
        if (r.u32() != expected_gather_bytes_) {
          throw wire::ProtocolError("all-gather result of an unexpected blob size");
        }
        const auto all = r.bytes(static_cast<std::size_t>(size_) * expected_gather_bytes_);
        r.expect_end();
        gather_results_[seq].assign(all.begin(), all.end());
        return true;
      }
      case wire::FrameType::kDeliver: {
        const std::uint32_t src = r.u32();
        const std::uint64_t tag = r.u64();
        const auto data = r.blob(wire::kMaxBlobBytes);
        r.expect_end();
        if (src >= static_cast<std::uint32_t>(size_)) {
          throw wire::ProtocolError(fmt::format("message from rank {} of {}", src, size_));
        }
        mailbox_[{static_cast<int>(src), tag}].emplace_back(data.begin(), data.end());
        return true;
      }
      case wire::FrameType::kValue: {
        const std::uint64_t request = r.u64();
        const auto data = r.blob(wire::kMaxBlobBytes);
        r.expect_end();
        if (request == current_get_) values_[request].assign(data.begin(), data.end());
        return true;  // else the answer to a get() that already timed out
      }
      case wire::FrameType::kError: {
        const auto status = static_cast<wia_status_t>(r.i32());
        std::string message = r.text(wire::kMaxTextBytes);
        const bool known = status <= WIA_ERROR_INVALID_ARGUMENT && status >= WIA_ERROR_ABORTED;
        fail_sticky(known ? status : WIA_ERROR_REMOTE, std::move(message));
      }
      default:
        throw wire::ProtocolError(
            fmt::format("unexpected '{}' frame", wire::frame_type_name(h.type)));
    }
  } catch (const wire::ProtocolError& e) {
    fail_sticky(WIA_ERROR_REMOTE, fmt::format("bootstrap: rank {} got a malformed frame from the "
                                              "root at {}: {}",
                                              rank_, root_address_, e.what()));
  }
}

template <typename Done>
bool Bootstrap::pump_until(Done done, Deadline deadline) {
  while (!done()) {
    if (!pump_one(deadline)) return done();
  }
  return true;
}

template <typename Done>
void Bootstrap::wait_or_report(Done done, std::uint8_t what, std::uint64_t seq,
                               const std::string& waiting_for) {
  if (pump_until(done, Clock::now() + timeout_)) return;
  // Only the root knows who is missing: ask it, and fail with its answer.
  send_frame(wire::Writer(wire::FrameType::kTimeoutReport)
                 .u8(what)
                 .u64(seq)
                 .u32(static_cast<std::uint32_t>(std::min<long long>(timeout_.count(), UINT32_MAX)))
                 .finish());
  const auto grace = std::min<Clock::duration>(timeout_, kReportGrace);
  if (pump_until(done, Clock::now() + grace)) return;
  fail_sticky(WIA_ERROR_TIMEOUT,
              fmt::format("bootstrap: rank {} waited {} ms for {}; the root at {} did not say "
                          "which ranks are missing",
                          rank_, timeout_.count(), waiting_for, root_address_));
}

std::vector<std::uint8_t> Bootstrap::run_gather(std::uint8_t kind,
                                                std::span<const std::uint8_t> mine) {
  throw_if_failed();
  if (mine.size() > wire::kMaxBlobBytes) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: all_gather of {} bytes per rank exceeds the bound of {}",
                            mine.size(), wire::kMaxBlobBytes));
  }
  const std::uint64_t seq = next_gather_seq_++;
  expected_gather_bytes_ = mine.size();
  send_frame(wire::Writer(wire::FrameType::kGather).u64(seq).u8(kind).blob(mine).finish());
  wait_or_report(
      [&] { return gather_results_.count(seq) != 0; },
      static_cast<std::uint8_t>(wire::WaitKind::kGather), seq,
      fmt::format("{} #{}", wire::gather_kind_name(static_cast<wire::GatherKind>(kind)), seq));
  auto node = gather_results_.extract(seq);
  return std::move(node.mapped());
}

std::vector<std::uint8_t> Bootstrap::all_gather(std::span<const std::uint8_t> mine) {
  return run_gather(static_cast<std::uint8_t>(wire::GatherKind::kAllGather), mine);
}

void Bootstrap::all_gather(std::span<const std::uint8_t> mine, std::span<std::uint8_t> all) {
  if (all.size() != mine.size() * static_cast<std::size_t>(size_)) {
    throw Error(
        WIA_ERROR_INVALID_ARGUMENT,
        fmt::format("bootstrap: all_gather output holds {} bytes, needs {} ({} ranks x {})",
                    all.size(), mine.size() * static_cast<std::size_t>(size_), size_, mine.size()));
  }
  const auto result = all_gather(mine);
  std::copy(result.begin(), result.end(), all.begin());
}

void Bootstrap::barrier() { run_gather(static_cast<std::uint8_t>(wire::GatherKind::kBarrier), {}); }

void Bootstrap::send(int peer, std::uint64_t tag, std::span<const std::uint8_t> data) {
  throw_if_failed();
  if (peer < 0 || peer >= size_ || data.size() > wire::kMaxBlobBytes) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: send of {} bytes to rank {} (valid: ranks 0..{}, at most "
                            "{} bytes)",
                            data.size(), peer, size_ - 1, wire::kMaxBlobBytes));
  }
  send_frame(wire::Writer(wire::FrameType::kSend)
                 .u32(static_cast<std::uint32_t>(peer))
                 .u64(tag)
                 .blob(data)
                 .finish());
}

std::vector<std::uint8_t> Bootstrap::recv(int peer, std::uint64_t tag) {
  throw_if_failed();
  if (peer < 0 || peer >= size_) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: recv from rank {} (valid: 0..{})", peer, size_ - 1));
  }
  auto& queue = mailbox_[{peer, tag}];
  if (!pump_until([&] { return !queue.empty(); }, Clock::now() + timeout_)) {
    throw Error(WIA_ERROR_TIMEOUT,
                fmt::format("bootstrap: rank {} waited {} ms for a message from rank {} with tag "
                            "{}",
                            rank_, timeout_.count(), peer, tag));
  }
  auto out = std::move(queue.front());
  queue.pop_front();
  return out;
}

void Bootstrap::put(std::string_view key, std::span<const std::uint8_t> value) {
  throw_if_failed();
  if (key.size() > wire::kMaxKeyBytes || value.size() > wire::kMaxBlobBytes) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: put of a {}-byte key and a {}-byte value (at most {} and "
                            "{})",
                            key.size(), value.size(), wire::kMaxKeyBytes, wire::kMaxBlobBytes));
  }
  send_frame(wire::Writer(wire::FrameType::kPut).text(key).blob(value).finish());
}

std::vector<std::uint8_t> Bootstrap::get(std::string_view key) {
  throw_if_failed();
  if (key.size() > wire::kMaxKeyBytes) {
    throw Error(WIA_ERROR_INVALID_ARGUMENT,
                fmt::format("bootstrap: get of a {}-byte key (at most {})", key.size(),
                            wire::kMaxKeyBytes));
  }
  const std::uint64_t request = next_request_++;
  current_get_ = request;
  send_frame(wire::Writer(wire::FrameType::kGet).u64(request).text(key).finish());
  const bool got = pump_until([&] { return values_.count(request) != 0; }, Clock::now() + timeout_);
  current_get_ = 0;
  if (!got) {
    throw Error(WIA_ERROR_TIMEOUT,
                fmt::format("bootstrap: rank {} waited {} ms for key '{}', which no rank put",
                            rank_, timeout_.count(), key));
  }
  auto node = values_.extract(request);
  return std::move(node.mapped());
}

void Bootstrap::abort(std::string_view reason) noexcept {
  try {
    {
      std::lock_guard lock(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = std::string(reason);
      aborted_.store(true);
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
    if (!socket_.valid() || stream_broken_.load()) return;
    // The waiter (if any) lets go of the socket once woken.
    std::unique_lock lock(send_mu_, std::chrono::seconds(1));
    if (!lock.owns_lock()) return;
    int error = 0;
    const auto frame = wire::Writer(wire::FrameType::kAbort).text(reason.substr(0, 1024)).finish();
    send_all(socket_.get(), frame, Clock::now() + std::chrono::seconds(1), -1, &error);
  } catch (...) {
    // abort() is best effort towards other ranks; locally the flag is set.
  }
}

}  // namespace wia::bootstrap
