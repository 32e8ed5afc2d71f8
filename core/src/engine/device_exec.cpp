// SPDX-License-Identifier: Apache-2.0
#include "engine/device_exec.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "runtime/device_call.hpp"

namespace wia::engine {

DevicePools::~DevicePools() {
  for (auto& [rank, events] : events_)
    for (wia_provider_event_t e : events) {
      const Device& d = *devices_[rank];
      ops_of(d).event_destroy(d.provider->ctx(), e);
    }
  for (auto& [size, b] : buffers_) free_buffer(b);
}

void DevicePools::free_buffer(const Buffer& b) noexcept {
  if (b.kind == kMalloc) {
    std::free(b.ptr);
    return;
  }
  const Device& d = *devices_[b.rank];
  ops_of(d).mem_free(d.provider->ctx(), d.local_index, b.ptr);
}

wia_provider_event_t DevicePools::take_event(int rank, Lease& lease) {
  wia_provider_event_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& free_list = events_[rank];
    if (!free_list.empty()) {
      e = free_list.back();
      free_list.pop_back();
    }
  }
  if (!e) {
    const Device& d = *devices_[rank];
    device_call(d, "event_create", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.event_create(ctx, d.local_index, &e);
    });
  }
  lease.events.emplace_back(rank, e);
  return e;
}

void* DevicePools::take_buffer(int rank, std::uint64_t bytes, std::uint32_t kind, Lease& lease) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Smallest free buffer of this rank and kind that fits.
    for (auto it = buffers_.lower_bound(bytes); it != buffers_.end(); ++it) {
      if (it->second.rank != rank || it->second.kind != kind) continue;
      lease.buffers.push_back(it->second);
      buffers_.erase(it);
      return lease.buffers.back().ptr;
    }
  }
  // Round up so that a sweep of sizes reuses buffers instead of growing
  // one allocation per size.
  std::uint64_t size = 64 * 1024;
  while (size < bytes) size *= 2;
  Buffer b{rank, kind, size, nullptr};
  const Device& d = *devices_[rank];
  if (kind == kMalloc) {
    b.ptr = std::malloc(size);
    if (!b.ptr)
      throw Error(WIA_ERROR_OUT_OF_MEMORY,
                  fmt::format("device engine: cannot allocate {} B of host staging memory", size));
  } else {
    device_call(d, kind == WIA_MEM_DEVICE ? "mem_alloc(collective scratch)"
                                          : "mem_alloc(collective host staging)",
                [&](const wia_device_ops_v1_t& o, void* ctx) {
                  return o.mem_alloc(ctx, d.local_index, size, kind, &b.ptr);
                });
  }
  lease.buffers.push_back(b);
  return b.ptr;
}

void DevicePools::give_back(Lease& lease) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [rank, e] : lease.events) events_[rank].push_back(e);
  for (const Buffer& b : lease.buffers) buffers_.emplace(b.size, b);
  lease.events.clear();
  lease.buffers.clear();
}

namespace {

// Enqueue of one operation: the state of the round-robin walk.
class Enqueuer {
 public:
  Enqueuer(const ExecPlan& plan, std::vector<RankBuffers> buffers, std::vector<DeviceRank>& ranks,
           const PeerMatrix& direct, DevicePools& pools, DevicePools::Lease& lease)
      : plan_(plan),
        s_(plan.schedule),
        es_(s_.elem_size()),
        buffers_(std::move(buffers)),
        ranks_(ranks),
        direct_(direct),
        pools_(pools),
        lease_(lease) {
    const int p = s_.nranks;
    cursor_.assign(p, 0);
    finished_.assign(p, false);
    started_.assign(p, false);
    recv_tmp_.assign(p, nullptr);
    events_.resize(p);
    staged_.resize(p);
    waited_.resize(p);
    for (int r = 0; r < p; ++r) {
      const std::size_t n = s_.programs[r].steps.size();
      events_[r].assign(n, nullptr);
      staged_[r].assign(n, nullptr);
      waited_[r].assign(n, 0);
    }
  }

  void run(wia_host_fn_t on_done, void* const* done_args) {
    const int p = s_.nranks;
    int unfinished = p;
    while (unfinished > 0) {
      bool progressed = false;
      for (int r = 0; r < p; ++r) {
        if (finished_[r]) continue;
        if (!started_[r]) start(r);
        const auto& steps = s_.programs[r].steps;
        while (cursor_[r] < steps.size() && prerequisites_recorded(r, cursor_[r])) {
          enqueue_step(r, cursor_[r]);
          ++cursor_[r];
          progressed = true;
        }
        if (cursor_[r] == steps.size() && all_sends_read(r)) {
          finish(r, on_done, done_args[r]);
          --unfinished;
          progressed = true;
        }
      }
      if (!progressed) {
        int r = 0;
        while (finished_[r]) ++r;
        throw Error(WIA_ERROR_INTERNAL,
                    fmt::format("device engine: schedule {} cannot be enqueued: rank {} is blocked "
                                "at step {} (a builder bug)",
                                s_.describe(), r, cursor_[r]));
      }
    }
  }

 private:
  const Device& dev(int r) const { return *ranks_[r].device; }
  std::uint64_t bytes(const coll::Step& st) const { return st.count * es_; }
  char* at(int r, const coll::Region& region) const { return region_ptr(buffers_[r], region, es_); }

  // The peer has enqueued the step that matches step k of rank r.
  bool peer_reached(int r, std::uint32_t k) const {
    const coll::Step& st = s_.programs[r].steps[k];
    return cursor_[st.peer] > plan_.match[r][k];
  }

  bool prerequisites_recorded(int r, std::uint32_t k) const {
    const coll::RankProgram& prog = s_.programs[r];
    const coll::Step& st = prog.steps[k];
    if (st.is_recv() && !peer_reached(r, k)) return false;
    const std::uint32_t* deps = prog.deps_of(st);
    for (std::uint32_t i = 0; i < st.dep_count; ++i)
      if (prog.steps[deps[i]].is_send() && !peer_reached(r, deps[i])) return false;
    return true;
  }

  bool all_sends_read(int r) const {
    const auto& steps = s_.programs[r].steps;
    for (std::uint32_t k = 0; k < steps.size(); ++k)
      if (steps[k].is_send() && !peer_reached(r, k)) return false;
    return true;
  }

  // Rank r's stream waits until the receiver of send k has read it.
  void wait_send_read(int r, std::uint32_t k) {
    if (waited_[r][k]) return;
    waited_[r][k] = 1;
    const coll::Step& st = s_.programs[r].steps[k];
    // A staged send was read into host memory on r's own stream already.
    if (!direct_[st.peer][r]) return;
    wait_event(r, events_[st.peer][plan_.match[r][k]]);
  }

  void wait_event(int r, wia_provider_event_t e) {
    device_call(dev(r), "stream_wait_event", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.stream_wait_event(ctx, ranks_[r].stream, e);
    });
  }

  wia_provider_event_t record(int r) {
    wia_provider_event_t e = pools_.take_event(r, lease_);
    device_call(dev(r), "event_record", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.event_record(ctx, e, ranks_[r].stream);
    });
    return e;
  }

  void copy(int r, void* dst, const void* src, std::uint64_t n) {
    device_call(dev(r), "memcpy_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.memcpy_async(ctx, ranks_[r].stream, dst, src, n);
    });
  }

  void reduce(int r, const coll::Step& st, void* dst, const void* a, const void* b) {
    const void* srcs[2] = {a, b};
    const wia_reduce_args_v1_t args = step_reduce_args(s_, st, dst, srcs);
    device_call(dev(r), "reduce_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.reduce_async(ctx, ranks_[r].stream, &args);
    });
  }

  std::uint32_t host_kind(int r) const {
    return (ops_of(dev(r)).caps & WIA_DEVICE_CAP_PINNED_HOST) ? WIA_MEM_HOST_PINNED
                                                               : DevicePools::kMalloc;
  }

  void start(int r) {
    started_[r] = true;
    if (ranks_[r].input_ready) wait_event(r, ranks_[r].input_ready);
    if (ranks_[r].on_start != nullptr)
      device_call(dev(r), "launch_host_func(start)", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.launch_host_func(ctx, ranks_[r].stream, ranks_[r].on_start, ranks_[r].start_arg);
      });
    // Scratch of this operation: pooled, so it stays private to the
    // operation until every rank finished.
    const std::uint64_t scratch = s_.scratch_bytes(r);
    if (scratch)
      buffers_[r].scratch =
          static_cast<char*>(pools_.take_buffer(r, scratch, WIA_MEM_DEVICE, lease_));
    if (!ranks_[r].snapshot_input) return;
    RankBuffers& b = buffers_[r];
    const coll::BufferSizes& sizes = s_.programs[r].sizes;
    if (b.send && sizes.send) {
      char* snap = static_cast<char*>(
          pools_.take_buffer(r, sizes.send * es_, WIA_MEM_DEVICE, lease_));
      copy(r, snap, b.send, sizes.send * es_);
      b.send = snap;
    }
    for (char*& shard : b.send_shards) {
      if (!sizes.send_shard) break;
      char* snap = static_cast<char*>(
          pools_.take_buffer(r, sizes.send_shard * es_, WIA_MEM_DEVICE, lease_));
      copy(r, snap, shard, sizes.send_shard * es_);
      shard = snap;
    }
  }

  void enqueue_step(int r, std::uint32_t k) {
    const coll::RankProgram& prog = s_.programs[r];
    const coll::Step& st = prog.steps[k];
    const std::uint32_t* deps = prog.deps_of(st);
    for (std::uint32_t i = 0; i < st.dep_count; ++i)
      if (prog.steps[deps[i]].is_send()) wait_send_read(r, deps[i]);

    switch (st.kind) {
      case coll::StepKind::kSend: {
        if (!direct_[st.peer][r]) {
          void* host = pools_.take_buffer(r, bytes(st), host_kind(r), lease_);
          copy(r, host, at(r, st.src), bytes(st));
          staged_[r][k] = host;
        }
        events_[r][k] = record(r);
        break;
      }
      case coll::StepKind::kRecv:
      case coll::StepKind::kRecvReduce: {
        const std::uint32_t m = plan_.match[r][k];
        const coll::Step& send = s_.programs[st.peer].steps[m];
        wait_event(r, events_[st.peer][m]);
        const bool direct = direct_[r][st.peer];
        const void* msg = direct ? static_cast<const void*>(at(st.peer, send.src))
                                 : static_cast<const void*>(staged_[st.peer][m]);
        if (st.kind == coll::StepKind::kRecv) {
          if (direct) {
            const Device& me = dev(r);
            const Device& peer = dev(st.peer);
            device_call(me, "memcpy_peer_async", [&](const wia_device_ops_v1_t& o, void* ctx) {
              return o.memcpy_peer_async(ctx, ranks_[r].stream, at(r, st.dst), me.local_index,
                                         msg, peer.local_index, bytes(st));
            });
          } else {
            copy(r, at(r, st.dst), msg, bytes(st));
          }
        } else {
          if (!direct) {
            // The reduction reads device memory only: land the message in
            // a per-operation temporary first (reused by later steps in
            // stream order).
            if (!recv_tmp_[r])
              recv_tmp_[r] = pools_.take_buffer(r, max_recv_reduce_bytes(r), WIA_MEM_DEVICE,
                                                lease_);
            copy(r, recv_tmp_[r], msg, bytes(st));
            msg = recv_tmp_[r];
          }
          reduce(r, st, at(r, st.dst), at(r, st.src), msg);
        }
        events_[r][k] = record(r);
        break;
      }
      case coll::StepKind::kCopy:
        copy(r, at(r, st.dst), at(r, st.src), bytes(st));
        break;
      case coll::StepKind::kReduce:
        reduce(r, st, at(r, st.dst), at(r, st.dst), at(r, st.src));
        break;
    }
  }

  std::uint64_t max_recv_reduce_bytes(int r) const {
    std::uint64_t m = 0;
    for (const coll::Step& st : s_.programs[r].steps)
      if (st.kind == coll::StepKind::kRecvReduce) m = std::max(m, bytes(st));
    return m;
  }

  void finish(int r, wia_host_fn_t on_done, void* arg) {
    const auto& steps = s_.programs[r].steps;
    for (std::uint32_t k = 0; k < steps.size(); ++k)
      if (steps[k].is_send()) wait_send_read(r, k);
    ranks_[r].done = record(r);
    if (on_done != nullptr)
      device_call(dev(r), "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
        return o.launch_host_func(ctx, ranks_[r].stream, on_done, arg);
      });
    finished_[r] = true;
  }

  const ExecPlan& plan_;
  const coll::Schedule& s_;
  const std::size_t es_;
  std::vector<RankBuffers> buffers_;
  std::vector<DeviceRank>& ranks_;
  const PeerMatrix& direct_;
  DevicePools& pools_;
  DevicePools::Lease& lease_;

  std::vector<std::uint32_t> cursor_;  // next step to enqueue, per rank
  std::vector<bool> finished_, started_;
  std::vector<void*> recv_tmp_;
  // [rank][step]: S for sends, R for receives; host copy of staged sends;
  // whether the rank's stream already waits for a send's R.
  std::vector<std::vector<wia_provider_event_t>> events_;
  std::vector<std::vector<void*>> staged_;
  std::vector<std::vector<std::uint8_t>> waited_;
};

}  // namespace

void enqueue_on_device_streams(const ExecPlan& plan, std::vector<RankBuffers> buffers,
                               std::vector<DeviceRank>& ranks, const PeerMatrix& direct,
                               DevicePools& pools, DevicePools::Lease& lease,
                               wia_host_fn_t on_done, void* const* done_args) {
  Enqueuer e(plan, std::move(buffers), ranks, direct, pools, lease);
  e.run(on_done, done_args);
}

}  // namespace wia::engine
