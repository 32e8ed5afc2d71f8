// SPDX-License-Identifier: Apache-2.0
// The Bootstrap object once it has joined (join.cpp builds it): its
// lifetime (the goodbye, keeping a hosted root alive for the other ranks),
// its conversation with the root (sending frames, and pumping: reading each
// frame the root sends and filing it where its waiter looks), failure that
// sticks, and the operations it offers: all-gather, barrier, point to point,
// the key-value store and abort. Also the value helpers of bootstrap.hpp
// (Options::from_config, compute_node_layout).
#include <fmt/core.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "bootstrap/bootstrap.hpp"
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

// Locks `lock`'s mutex within `limit`, or returns false. Polled try_lock
// rather than a std::timed_mutex: libstdc++ waits for a steady_clock
// deadline in pthread_mutex_clocklock, which ThreadSanitizer (GCC 12's and
// clang 14's runtimes) does not intercept: it saw the unlock without the
// lock, reported "unlock of an unlocked mutex" and lost the ordering the
// mutex gives. Only the goodbye and abort() wait like this, off every
// fast path; the holder is a send that abort() has just woken.
bool lock_within(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!lock.try_lock()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

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

Bootstrap::~Bootstrap() {
  if (socket_.valid() && !failed_ && !aborted_.load()) {
    try {
      std::unique_lock lock(send_mu_, std::defer_lock);
      if (lock_within(lock, std::chrono::seconds(1))) {
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
  fail_aborted();
}

bool Bootstrap::pump_one(Deadline deadline) {
  throw_if_failed();
  if (!wait_for_frame(deadline)) return false;
  // A frame that has begun arrives promptly; give it the full timeout anyway.
  const Deadline frame_deadline = Clock::now() + timeout_;
  const wire::Header header = read_frame_header(frame_deadline);
  const std::vector<std::uint8_t> payload = read_frame_payload(header.length, frame_deadline);
  file_frame(header.type, payload);
  return true;
}

bool Bootstrap::wait_for_frame(Deadline deadline) {
  if (aborted_.load()) fail_aborted();
  for (;;) {
    pollfd p[2] = {{socket_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    const int ready = ::poll(p, 2, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) {
      fail_sticky(WIA_ERROR_IO, fmt::format("bootstrap: poll failed: {}", std::strerror(errno)));
    }
    if ((p[1].revents & POLLIN) != 0) fail_aborted();
    return ready != 0;
  }
}

wire::Header Bootstrap::read_frame_header(Deadline frame_deadline) {
  std::uint8_t header[wire::kHeaderBytes];
  int error = 0;
  if (IoResult r = recv_all(socket_.get(), header, frame_deadline, wake_.get(), &error);
      r != IoResult::kOk) {
    fail_connection_lost(r, error);
  }
  try {
    const wire::Header h = wire::decode_header(header);
    const std::size_t bound = payload_bound(h.type);
    if (h.length > bound) {
      throw wire::ProtocolError(fmt::format("'{}' frame of {} bytes exceeds its bound of {}",
                                            wire::frame_type_name(h.type), h.length, bound));
    }
    return h;
  } catch (const wire::ProtocolError& e) {
    fail_malformed_frame(e);
  }
}

std::size_t Bootstrap::payload_bound(wire::FrameType type) const {
  if (type == wire::FrameType::kGatherResult) {
    return 12 + static_cast<std::size_t>(size_) * expected_gather_bytes_;
  }
  if (type == wire::FrameType::kWelcome) {
    return 4 + static_cast<std::size_t>(size_) * (4 + wire::kMaxTextBytes);
  }
  return wire::kMaxReplyBytes;
}

std::vector<std::uint8_t> Bootstrap::read_frame_payload(std::size_t length,
                                                        Deadline frame_deadline) {
  std::vector<std::uint8_t> payload(length);
  int error = 0;
  if (IoResult r = recv_all(socket_.get(), payload, frame_deadline, wake_.get(), &error);
      r != IoResult::kOk) {
    fail_connection_lost(r, error);
  }
  return payload;
}

void Bootstrap::file_frame(wire::FrameType type, std::span<const std::uint8_t> payload) {
  try {
    wire::Reader r(payload);
    switch (type) {
      case wire::FrameType::kWelcome:
        return file_welcome(r);
      case wire::FrameType::kGatherResult:
        return file_gather_result(r);
      case wire::FrameType::kDeliver:
        return file_delivery(r);
      case wire::FrameType::kValue:
        return file_value(r);
      case wire::FrameType::kError:
        fail_with_root_error(r);
      default:
        throw wire::ProtocolError(
            fmt::format("unexpected '{}' frame", wire::frame_type_name(type)));
    }
  } catch (const wire::ProtocolError& e) {
    fail_malformed_frame(e);
  }
}

void Bootstrap::file_welcome(wire::Reader& r) {
  if (r.u32() != static_cast<std::uint32_t>(size_) || welcomed_) {
    throw wire::ProtocolError("welcome for a different job size");
  }
  host_ids_.clear();
  for (int i = 0; i < size_; ++i) host_ids_.push_back(r.text(wire::kMaxTextBytes));
  r.expect_end();
  layout_ = compute_node_layout(host_ids_);
  welcomed_ = true;
}

void Bootstrap::file_gather_result(wire::Reader& r) {
  const std::uint64_t seq = r.u64();
  if (r.u32() != expected_gather_bytes_) {
    throw wire::ProtocolError("all-gather result of an unexpected blob size");
  }
  const auto all = r.bytes(static_cast<std::size_t>(size_) * expected_gather_bytes_);
  r.expect_end();
  gather_results_[seq].assign(all.begin(), all.end());
}

void Bootstrap::file_delivery(wire::Reader& r) {
  const std::uint32_t src = r.u32();
  const std::uint64_t tag = r.u64();
  const auto data = r.blob(wire::kMaxBlobBytes);
  r.expect_end();
  if (src >= static_cast<std::uint32_t>(size_)) {
    throw wire::ProtocolError(fmt::format("message from rank {} of {}", src, size_));
  }
  mailbox_[{static_cast<int>(src), tag}].emplace_back(data.begin(), data.end());
}

void Bootstrap::file_value(wire::Reader& r) {
  const std::uint64_t request = r.u64();
  const auto data = r.blob(wire::kMaxBlobBytes);
  r.expect_end();
  // Else the answer to a get() that already timed out.
  if (request == current_get_) values_[request].assign(data.begin(), data.end());
}

void Bootstrap::fail_with_root_error(wire::Reader& r) {
  const auto status = static_cast<wia_status_t>(r.i32());
  std::string message = r.text(wire::kMaxTextBytes);
  const bool known = status <= WIA_ERROR_INVALID_ARGUMENT && status >= WIA_ERROR_CORRUPT;
  fail_sticky(known ? status : WIA_ERROR_REMOTE, std::move(message));
}

void Bootstrap::fail_aborted() {
  std::lock_guard lock(abort_mu_);
  fail_sticky(WIA_ERROR_ABORTED,
              fmt::format("bootstrap: aborted on rank {}: {}", rank_, abort_reason_));
}

void Bootstrap::fail_connection_lost(IoResult r, int error) {
  if (r == IoResult::kWoken) fail_aborted();
  fail_sticky(r == IoResult::kTimeout ? WIA_ERROR_TIMEOUT : WIA_ERROR_REMOTE,
              fmt::format("bootstrap: rank {} lost its connection to the root at {} ({}); did "
                          "the process hosting the root exit or die?",
                          rank_, root_address_,
                          r == IoResult::kClosed    ? "connection closed"
                          : r == IoResult::kTimeout ? "a frame stalled mid-way"
                                                    : std::strerror(error)));
}

void Bootstrap::fail_malformed_frame(const wire::ProtocolError& e) {
  fail_sticky(WIA_ERROR_REMOTE, fmt::format("bootstrap: rank {} got a malformed frame from the "
                                            "root at {}: {}",
                                            rank_, root_address_, e.what()));
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

void Bootstrap::await_welcome() {
  wait_or_report([&] { return welcomed_; }, static_cast<std::uint8_t>(wire::WaitKind::kRendezvous),
                 0, "the other ranks to join");
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
    std::unique_lock lock(send_mu_, std::defer_lock);
    if (!lock_within(lock, std::chrono::seconds(1))) return;
    int error = 0;
    const auto frame = wire::Writer(wire::FrameType::kAbort).text(reason.substr(0, 1024)).finish();
    send_all(socket_.get(), frame, Clock::now() + std::chrono::seconds(1), -1, &error);
  } catch (...) {
    // abort() is best effort towards other ranks; locally the flag is set.
  }
}

}  // namespace wia::bootstrap
