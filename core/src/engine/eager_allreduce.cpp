// SPDX-License-Identifier: Apache-2.0
#include "engine/eager_allreduce.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/error.hpp"
#include "engine/backoff.hpp"
#include "engine/link_call.hpp"
#include "kernels/cpu_reduce.hpp"

namespace wia::engine {

void EagerAllReduce::start(int rank, const Descriptor& desc, const void* send, void* recv,
                           wia_reduce_op_t op, std::uint64_t max_bytes,
                           std::vector<NetLink>& links, ControlChannel& control,
                           const NetExecOptions& options) {
  rank_ = rank;
  nranks_ = static_cast<int>(links.size());
  desc_ = desc;
  recv_ = recv;
  op_ = op;
  links_ = &links;
  control_ = &control;
  options_ = &options;
  bytes_ = desc.count * kernels::dtype_size(static_cast<wia_datatype_t>(desc.dtype));
  msg_bytes_ = sizeof(Descriptor) + bytes_;
  slot_bytes_ = sizeof(Descriptor) + std::max(bytes_, max_bytes);
  const std::size_t p = static_cast<std::size_t>(nranks_);
  if (buf_.size() < p * slot_bytes_) buf_.resize(p * slot_bytes_);
  // Requests are cleared as they complete: only a failed collective (after
  // which the communicator is unusable) leaves any behind.
  if (sends_.size() != p) {
    sends_.assign(p, nullptr);
    recvs_.assign(p, nullptr);
    inline_recv_.assign(p, 0);
  }
  srcs_.resize(p);
  reduced_ = false;
  pending_ = 0;

  // The outgoing message doubles as this rank's operand, so an in-place
  // call may overwrite `recv` while the message is still being sent.
  char* mine = slot(rank_);
  std::memcpy(mine, &desc_, sizeof(Descriptor));
  std::memcpy(mine + sizeof(Descriptor), send, bytes_);
  for (int q = 0; q < nranks_; ++q) srcs_[q] = slot(q) + sizeof(Descriptor);
  failure_ = WIA_SUCCESS;
  try {
    post_all(mine);
  } catch (const Error& e) {
    // Reported by progress(), which knows to ask the peers for a better
    // reason (a peer that failed first closes its connections).
    failure_ = e.status();
    failure_text_ = e.what();
  }
}

namespace {
bool has_inline(const NetLink& l) {
  return (l.provider->transport()->caps & WIA_TRANSPORT_CAP_INLINE) != 0;
}
}  // namespace

void EagerAllReduce::post_all(const char* mine) {
  const std::vector<NetLink>& links = *links_;
  // Sends first: the peers are waiting for them; what arrives before its
  // receive is taken waits in the transport. A transport with inline
  // messages sends and receives them without request objects (half the
  // cost of a small message); it may decline, and then isend/irecv do.
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    const NetLink& l = links[q];
    inline_recv_[q] = has_inline(l);  // the receive loop below reads it too
    const bool sent_inline =
        inline_recv_[q] &&
        link_call(l, "send_inline", [&](const wia_transport_ops_v1_t& t, void* ctx) {
          return t.send_inline(ctx, l.conn, mine, msg_bytes_, kDescriptorTag);
        }) == WIA_SUCCESS;
    if (sent_inline) continue;
    link_call(l, "isend", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.isend(ctx, l.conn, mine, msg_bytes_, kDescriptorTag, nullptr, &sends_[q]);
    });
    check_posted(q, sends_[q]);
  }
  for (int q = 0; q < nranks_; ++q) {
    if (q == rank_) continue;
    if (inline_recv_[q])
      ++pending_;
    else
      post_recv(q);
  }
}

void EagerAllReduce::post_recv(int q) {
  const NetLink& l = (*links_)[q];
  link_call(l, "irecv", [&](const wia_transport_ops_v1_t& t, void* ctx) {
    return t.irecv(ctx, l.conn, slot(q), slot_bytes_, kDescriptorTag, nullptr, &recvs_[q]);
  });
  check_posted(q, recvs_[q]);
}

bool EagerAllReduce::test_inline(int q) {
  const NetLink& l = (*links_)[q];
  std::int32_t done = 0;
  std::uint64_t size = 0;
  try {
    link_call(l, "recv_inline", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.recv_inline(ctx, l.conn, slot(q), slot_bytes_, kDescriptorTag, &done, &size);
    });
  } catch (const Error& e) {
    inline_recv_[q] = 0;
    --pending_;
    if (e.status() == WIA_ERROR_NOT_SUPPORTED) {  // declined: this message needs irecv
      post_recv(q);
      return true;
    }
    throw Error(e.status(), fmt::format("rank {}: one-shot all-reduce #{}: receive of {} B from "
                                        "rank {}: {}",
                                        rank_, desc_.seq, msg_bytes_, q, e.what()));
  }
  if (!done) return false;
  inline_recv_[q] = 0;
  --pending_;
  check_message(q, size);
  return true;
}

void EagerAllReduce::check_posted(int q, wia_request_t req) {
  // Messages this small are not worth a retry path: a transport out of
  // resources for them fails the collective with a clear message.
  if (!req)
    throw Error(WIA_ERROR_OUT_OF_MEMORY,
                fmt::format("rank {}: the transport to rank {} has no resources for a {} B "
                            "message",
                            rank_, q, msg_bytes_));
  ++pending_;
}

bool EagerAllReduce::test(int q, wia_request_t& req, bool is_send) {
  const NetLink& l = (*links_)[q];
  std::int32_t done = 0;
  std::uint64_t size = 0;
  try {
    link_call(l, "test", [&](const wia_transport_ops_v1_t& t, void* ctx) {
      return t.test(ctx, req, &done, &size);
    });
  } catch (const Error& e) {
    req = nullptr;  // a failed request is released by the provider
    throw Error(e.status(), fmt::format("rank {}: one-shot all-reduce #{}: {} of {} B {} rank {}: {}",
                                        rank_, desc_.seq, is_send ? "send" : "receive",
                                        msg_bytes_, is_send ? "to" : "from", q, e.what()));
  }
  if (!done) return false;
  req = nullptr;
  --pending_;
  if (!is_send) check_message(q, size);
  return true;
}

void EagerAllReduce::check_message(int q, std::uint64_t size) {
  if (size == msg_bytes_ && std::memcmp(slot(q), &desc_, sizeof(Descriptor)) == 0) return;
  Descriptor theirs{};
  if (size >= sizeof(Descriptor)) std::memcpy(&theirs, slot(q), sizeof(Descriptor));
  std::string diff = size >= sizeof(Descriptor) ? describe_difference(desc_, theirs) : "";
  if (diff.empty() && size != msg_bytes_)
    diff = fmt::format("message size ({} B received, {} B expected: rank {} did not make this "
                       "small all-reduce)",
                       size, msg_bytes_, q);
  if (!diff.empty())
    throw Error(WIA_ERROR_MISMATCH,
                fmt::format("collective #{} does not match across ranks: rank {} and rank {} "
                            "differ in {}",
                            desc_.seq, rank_, q, diff));
}

bool EagerAllReduce::run(std::chrono::steady_clock::time_point give_up_at) {
  Backoff backoff(options_->oversubscribed);
  ControlPace pace;
  while (pending_ > 0) {
    bool progressed = false;
    for (int q = 0; q < nranks_; ++q) {
      if (inline_recv_[q]) progressed |= test_inline(q);
      if (recvs_[q]) progressed |= test(q, recvs_[q], false);
      if (sends_[q]) progressed |= test(q, sends_[q], true);
    }
    if (progressed) {
      backoff.reset();
      continue;
    }
    // Peers that failed tell us on the control channel, and peers asking
    // where we are get their answer: looked at while waiting only.
    const IdleRound waited = idle_round(backoff, pace, *control_, *options_, give_up_at);
    if (waited == IdleRound::kGiveUp) return false;
    if (waited == IdleRound::kTimedOut) {
      const std::string where = control_->diagnose(desc_.seq);
      throw Error(WIA_ERROR_TIMEOUT, timeout_message() + (where.empty() ? "" : "; " + where));
    }
  }
  if (!reduced_) {
    // Rank order on every rank: bit-identical results.
    reduce_in_order(desc_, op_, recv_, srcs_, desc_.count, rank_, "one-shot all-reduce");
    reduced_ = true;
  }
  return true;
}

std::string EagerAllReduce::timeout_message() const {
  std::string ranks;
  for (int q = 0; q < nranks_; ++q)
    if (recvs_[q] || inline_recv_[q]) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", q);
  return fmt::format("collective #{} (one-shot all-reduce of {} B) timed out after {} ms on rank "
                     "{}: waiting for rank(s) {}",
                     desc_.seq, bytes_, options_->timeout_ms, rank_,
                     ranks.empty() ? "none (sends not taken)" : ranks);
}

wia_status_t EagerAllReduce::progress(std::chrono::steady_clock::time_point give_up_at,
                                      std::string& error) {
  try {
    if (failure_ != WIA_SUCCESS) throw Error(failure_, failure_text_);
    return run(give_up_at) ? WIA_SUCCESS : WIA_IN_PROGRESS;
  } catch (const Error& e) {
    // A lost connection is often a peer that failed first and said why.
    if (e.status() != WIA_ERROR_TIMEOUT && e.status() != WIA_ERROR_MISMATCH) {
      if (const std::string reason = control_->poll(); !reason.empty()) {
        error = reason;
        return WIA_ERROR_REMOTE;
      }
    }
    error = e.what();
    return e.status();
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: {}", rank_, e.what());
    return WIA_ERROR_INTERNAL;
  }
}

}  // namespace wia::engine
