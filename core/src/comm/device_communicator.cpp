// SPDX-License-Identifier: Apache-2.0
#include "comm/device_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "coll/registry.hpp"
#include "comm/algorithm_choice.hpp"
#include "common/cpus.hpp"
#include "common/error.hpp"
#include "common/log.hpp"
#include "kernels/cpu_reduce.hpp"
#include "runtime/device_call.hpp"
#include "runtime/objects.hpp"
#include "tuner/link_file.hpp"

namespace wia::comm {

DeviceCommunicator::DeviceCommunicator(std::vector<wia_device_t> devices)
    : devices_(std::move(devices)),
      next_seq_(devices_.size(), 0),
      selector_(in_process_link_model(static_cast<std::int32_t>(devices_.size()))),
      completed_(devices_.size()),
      scratch_(devices_.size(), nullptr),
      scratch_size_(devices_.size(), 0) {
  Runtime& rt = Runtime::get();
  const std::string engine = rt.config().get_string("collectives.engine");
  for (wia_device_t id : devices_)
    all_host_accessible_ &= (rt.device(id).props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE) != 0;
  engine_ = engine == "device" || (engine == "auto" && !all_host_accessible_) ? Engine::kDevice
                                                                              : Engine::kInline;
  std::set<wia_device_t> seen;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const Device& d = rt.device(devices_[i]);
    if (!seen.insert(d.id).second)
      throw Error(WIA_ERROR_INVALID_ARGUMENT,
                  fmt::format("device {} appears twice (ranks must be distinct devices)", d.id));
    if (engine_ == Engine::kInline && !(d.props.flags & WIA_DEVICE_FLAG_HOST_ACCESSIBLE))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("device {} ({}): collectives.engine is 'inline', which needs "
                              "host-addressable device memory; use 'device' or 'auto'",
                              d.id, d.provider->name()));
    if (!(ops_of(d).caps & WIA_DEVICE_CAP_HOST_FUNC))
      throw Error(WIA_ERROR_NOT_SUPPORTED,
                  fmt::format("device {} ({}) cannot run host functions on its streams", d.id,
                              d.provider->name()));
  }
  for (auto& c : completed_) c.store(0);
  const int cores = usable_cpu_count();
  oversubscribed_ = static_cast<int>(devices_.size()) > cores;
  workers_ = std::min(static_cast<int>(devices_.size()), cores);

  default_timeout_ms_ = static_cast<std::uint32_t>(rt.config().get_int("collectives.timeout_ms"));
  // Measured links (wia-bw --output, tuner.link_file) replace the default
  // per-link figures; the in-process hand-off and kernel rates stay.
  const std::string link_file = rt.config().get_string("tuner.link_file");
  if (!link_file.empty()) {
    const std::vector<int> device_of_rank(devices_.begin(), devices_.end());
    selector_ = tuner::Selector(tuner::with_measured_links(
        selector_.model(), tuner::link_model_from_file(link_file, device_of_rank)));
    log::info("coll", "communicator over {} devices: link figures from {}", devices_.size(),
              link_file);
  }
  static std::atomic<int> created{0};
  comm_index_ = ++created;
  if (engine_ == Engine::kDevice)
    transport_ = CommProfiler::intern_transport(rt.device(devices_[0]).provider->name());
  if (engine_ == Engine::kDevice) init_device_engine();
}

DeviceCommunicator::~DeviceCommunicator() {
  // Callers drain() first and never destroy a communicator with stream tasks
  // still queued (they would run on freed memory); see wia_destroy_communicator.
  if (engine_ == Engine::kDevice) shutdown_device_engine();
  Runtime& rt = Runtime::get();
  for (std::size_t r = 0; r < scratch_.size(); ++r) {
    if (!scratch_[r]) continue;
    const Device& d = rt.device(devices_[r]);
    ops_of(d).mem_free(d.provider->ctx(), d.local_index, scratch_[r]);
  }
}

const char* engine_name(Engine e) noexcept { return e == Engine::kDevice ? "device" : "inline"; }

int DeviceCommunicator::rank_of_device(wia_device_t device) const {
  auto it = std::find(devices_.begin(), devices_.end(), device);
  return it == devices_.end() ? -1 : static_cast<int>(it - devices_.begin());
}

wia_status_t DeviceCommunicator::async_error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return async_error_;
}

void DeviceCommunicator::record_async_error(wia_status_t status, const std::string& message) {
  std::lock_guard<std::mutex> lock(err_mu_);
  if (async_error_ == WIA_SUCCESS) {
    async_error_ = status;
    log::error("coll", "{}", message);
  }
}

wia_algorithm_t DeviceCommunicator::last_selected() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return last_selected_;
}

std::string DeviceCommunicator::describe_mismatch(const Operation& op) const {
  const Call& a = op.calls[0];
  for (int r = 1; r < size(); ++r) {
    const Call& b = op.calls[r];
    std::string diff;
    auto add = [&](const char* field, const std::string& x, const std::string& y) {
      diff += fmt::format("{}{} {} vs {}", diff.empty() ? "" : ", ", field, x, y);
    };
    if (a.collective != b.collective)
      add("collective", coll::collective_name(a.collective), coll::collective_name(b.collective));
    if (a.count != b.count) add("count", std::to_string(a.count), std::to_string(b.count));
    if (a.dtype != b.dtype)
      add("datatype", kernels::dtype_name(a.dtype), kernels::dtype_name(b.dtype));
    if (coll::is_reducing(a.collective) && a.collective == b.collective && a.op != b.op)
      add("op", kernels::reduce_op_name(a.op), kernels::reduce_op_name(b.op));
    if ((a.collective == coll::Collective::kBroadcast ||
         a.collective == coll::Collective::kReduce) &&
        a.collective == b.collective && a.root != b.root)
      add("root", std::to_string(a.root), std::to_string(b.root));
    if (a.algorithm != b.algorithm)
      add("algorithm", coll::algorithm_name(a.algorithm), coll::algorithm_name(b.algorithm));
    if (!diff.empty())
      return fmt::format(
          "collective #{} does not match across ranks: rank 0 and rank {} differ "
          "in {}",
          op.seq, r, diff);
  }
  return {};
}

std::shared_ptr<const engine::ExecPlan> DeviceCommunicator::plan_for(const Operation& op) {
  const Call& c = op.calls[0];
  coll::CollArgs args;
  args.collective = c.collective;
  args.op = c.op;
  args.dtype = c.dtype;
  args.count = c.count;
  args.nranks = size();
  args.root = c.root;
  args.options.num_chunks = c.num_chunks;
  args.options.in_place =
      std::all_of(op.calls.begin(), op.calls.end(), [](const Call& k) { return k.in_place; });
  coll::validate_args(args);
  AlgorithmChoice choice;
  std::shared_ptr<const engine::ExecPlan> plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    choice = choose_algorithm(args, c.algorithm, selector_);
    args.algorithm = choice.algorithm;
    if (args.options.num_chunks == 0) args.options.num_chunks = choice.num_chunks;
    plan = plans_.find(args, choice.algorithm);
  }
  if (!plan) {
    plan = engine::make_plan(coll::build_schedule(args), choice.estimated_ms);
    std::lock_guard<std::mutex> lock(mu_);
    plans_.insert(args, choice.algorithm, plan);
  }
  log::debug("coll", "collective #{}: {} chosen by {} (estimate {:.3f} ms), {} engine", op.seq,
             plan->schedule.describe(), choice.reason, choice.estimated_ms, engine_name(engine_));
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    last_selected_.id = static_cast<wia_algorithm_id_t>(choice.algorithm);
    last_selected_.name = coll::algorithm_name(choice.algorithm);
    last_selected_.collective = coll::collective_name(args.collective);
    last_selected_.estimated_time_ms = choice.estimated_ms;
  }
  return plan;
}

wia_status_t DeviceCommunicator::post(int rank, Call call, wia_stream_s* stream) {
  check_revoked();
  if (engine_ == Engine::kDevice) return post_device(rank, std::move(call), stream);
  std::shared_ptr<Operation> op;
  bool complete = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uint64_t seq = next_seq_[rank]++;
    auto& slot = ops_[seq];
    if (!slot) slot = new_operation(seq);
    op = slot;
    op->calls[rank] = std::move(call);
    op->posted[rank] = true;
    complete = ++op->posted_count == size();
  }
  // The last rank to post matches the set and builds the plan; stream tasks of
  // the other ranks wait for `ready`.
  const wia_status_t result = complete ? complete_set(*op) : WIA_SUCCESS;
  launch_stream_task(&DeviceCommunicator::stream_task, op, rank, stream);
  // The call that completed a failed set reports it at once; the other
  // ranks see it on their streams.
  if (result != WIA_SUCCESS) throw Error(result, op->sync.message());
  return result;
}

std::shared_ptr<Operation> DeviceCommunicator::new_operation(std::uint64_t seq) const {
  auto op = std::make_shared<Operation>();
  op->seq = seq;
  op->calls.resize(devices_.size());
  op->posted.assign(devices_.size(), false);
  op->task_arrived.reset(new std::atomic<std::uint8_t>[devices_.size()]());
  op->rank_done.reset(new std::atomic<std::uint8_t>[devices_.size()]());
  op->rank_end_ns.reset(new std::atomic<std::int64_t>[devices_.size()]());
  op->rank_start_ns.reset(new std::atomic<std::int64_t>[devices_.size()]());
  return op;
}

wia_status_t DeviceCommunicator::complete_set(Operation& op) {
  wia_status_t result = WIA_SUCCESS;
  std::string mismatch = describe_mismatch(op);
  if (!mismatch.empty()) {
    op.sync.fail(WIA_ERROR_MISMATCH, mismatch);
    record_async_error(WIA_ERROR_MISMATCH, mismatch);
    result = WIA_ERROR_MISMATCH;
  } else {
    try {
      op.plan = plan_for(op);
      op.sync.init(op.plan->schedule);
    } catch (const Error& e) {
      op.sync.fail(e.status(), e.what());
      record_async_error(e.status(), e.what());
      result = e.status();
    }
  }
  op.buffers.reserve(op.calls.size());
  const bool in_place = op.plan && op.plan->schedule.in_place;
  for (const Call& c : op.calls) {
    engine::RankBuffers b = c.buffers;
    // An in-place reduce-scatter schedule addresses the whole input as
    // its "recv" buffer (schedule.hpp, "In place").
    if (in_place && c.collective == coll::Collective::kReduceScatter) b.recv = b.send;
    if (in_place) b.send = nullptr;
    op.buffers.push_back(std::move(b));
  }
  op.ready.store(true, std::memory_order_release);
  op.sync.signal.notify();
  return result;
}

void DeviceCommunicator::launch_stream_task(wia_host_fn_t fn, const std::shared_ptr<Operation>& op,
                                            int rank, wia_stream_s* stream) {
  auto* g = new StreamTask{this, op, rank, stream};
  in_flight_.fetch_add(1);
  const Device& d = Runtime::get().device(stream->device);
  try {
    device_call(d, "launch_host_func", [&](const wia_device_ops_v1_t& o, void* ctx) {
      return o.launch_host_func(ctx, stream->ps, fn, g);
    });
  } catch (const Error& e) {
    delete g;
    in_flight_.fetch_sub(1);
    // Peers must not wait for a rank whose stream task will never run.
    op->sync.fail(e.status(), fmt::format("rank {} could not post collective #{}: {}", rank,
                                          op->seq, e.what()));
    throw;
  }
}

void DeviceCommunicator::stream_task(void* arg) {
  std::unique_ptr<StreamTask> g(static_cast<StreamTask*>(arg));
  g->comm->run_stream_task(*g);
}

void* DeviceCommunicator::scratch_for(int rank, std::uint64_t bytes) {
  if (bytes == 0) return nullptr;
  if (scratch_size_[rank] >= bytes) return scratch_[rank];
  const Device& d = Runtime::get().device(devices_[rank]);
  if (scratch_[rank]) ops_of(d).mem_free(d.provider->ctx(), d.local_index, scratch_[rank]);
  scratch_[rank] = nullptr;
  scratch_size_[rank] = 0;
  // Grow geometrically so a size sweep does not reallocate every call.
  const std::uint64_t size = std::max<std::uint64_t>(bytes, std::uint64_t(1) << 16);
  device_call(d, "mem_alloc(scratch)", [&](const wia_device_ops_v1_t& o, void* ctx) {
    return o.mem_alloc(ctx, d.local_index, size, WIA_MEM_DEVICE, &scratch_[rank]);
  });
  std::memset(scratch_[rank], 0, size);  // pre-fault now, not inside a timed collective
  scratch_size_[rank] = size;
  return scratch_[rank];
}

void DeviceCommunicator::run_stream_task(StreamTask& g) {
  Operation& op = *g.op;
  const int rank = g.rank;
  const Call& call = op.calls[rank];
  const std::uint32_t timeout_ms = call.timeout_ms ? call.timeout_ms : default_timeout_ms_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);

  // A rank's operations run one at a time, in posting order.
  const bool in_order = completion_signal_.wait_until(
      [&] { return completed_[rank].load(std::memory_order_acquire) >= op.seq; }, deadline,
      oversubscribed_);
  if (!in_order)
    op.sync.fail(WIA_ERROR_TIMEOUT,
                 fmt::format("rank {}: collective #{} timed out after {} ms waiting for the "
                             "rank's previous collective to finish",
                             rank, op.seq, timeout_ms));

  if (!op.sync.failed()) {
    const bool ready = op.sync.signal.wait_until(
        [&] { return op.ready.load(std::memory_order_acquire) || op.sync.failed(); }, deadline,
        oversubscribed_);
    if (!ready) {
      std::string missing;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int r = 0; r < size(); ++r)
          if (!op.posted[r])
            missing += fmt::format("{}{} (posted {} collective(s) so far)",
                                   missing.empty() ? "" : ", ", r, next_seq_[r]);
      }
      op.sync.fail(WIA_ERROR_TIMEOUT,
                   fmt::format("collective #{} timed out after {} ms on rank {}: rank(s) {} "
                               "never posted it",
                               op.seq, timeout_ms, rank, missing));
    }
  }

  std::vector<char> staged_input;  // in-place rank inside an out-of-place schedule
  int order = -1;                  // arrival order, decides which stream tasks execute
  if (!op.sync.failed()) {
    try {
      // Each rank completes its own buffer entry before it arrives; the
      // arrival barrier publishes it to the executing threads.
      const coll::Schedule& s = op.plan->schedule;
      engine::RankBuffers& mine = op.buffers[rank];
      mine.scratch = static_cast<char*>(scratch_for(rank, s.scratch_bytes(rank)));
      if (call.in_place && !s.in_place) stage_input(s, rank, mine, staged_input);
    } catch (const Error& e) {
      op.sync.fail(e.status(), fmt::format("rank {}: {}", rank, e.what()));
    }
  }
  op.task_arrived[rank].store(1, std::memory_order_release);
  // The last stream task to arrive starts the collective: the profiler
  // hears of it before any executing thread can see every rank arrived.
  if (op.arriving.fetch_add(1, std::memory_order_acq_rel) + 1 == size() && !op.sync.failed())
    record_start(op);
  order = op.arrived.fetch_add(1, std::memory_order_acq_rel);
  op.sync.signal.notify();

  // Every rank's input is ready only once every stream task arrived: earlier work
  // on each rank's stream produced it.
  if (!op.sync.failed()) {
    const bool all_in = op.sync.signal.wait_until(
        [&] { return op.arrived.load(std::memory_order_acquire) == size() || op.sync.failed(); },
        deadline, oversubscribed_);
    if (!all_in) {
      std::string missing;
      for (int r = 0; r < size(); ++r)
        if (!op.task_arrived[r].load(std::memory_order_acquire))
          missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      op.sync.fail(WIA_ERROR_TIMEOUT,
                   fmt::format("collective #{} timed out after {} ms on rank {}: rank(s) {} "
                               "posted it but their streams never reached it (earlier work on "
                               "those streams is stuck)",
                               op.seq, timeout_ms, rank, missing));
    }
  }
  if (!op.sync.failed()) {
    // The first `workers_` stream tasks to arrive execute every rank's program,
    // each a share of the ranks, so no more threads run than cores exist.
    if (order < workers_) {
      std::vector<int> owned;
      for (int r = order; r < size(); r += workers_) owned.push_back(r);
      try {
        engine::execute_ranks(*op.plan, owned, op.buffers, op.sync, op.rank_done.get(), deadline,
                              oversubscribed_);
      } catch (const std::exception& e) {
        op.sync.fail(WIA_ERROR_INTERNAL, fmt::format("rank {}: {}", rank, e.what()));
      }
    }
    if (!op.sync.failed()) {
      const bool mine_done = op.sync.signal.wait_until(
          [&] { return op.rank_done[rank].load(std::memory_order_acquire) || op.sync.failed(); },
          deadline, oversubscribed_);
      if (!mine_done && !op.sync.failed())
        op.sync.fail(WIA_ERROR_TIMEOUT,
                     fmt::format("collective #{} timed out after {} ms on rank {} waiting for its "
                                 "program to be executed",
                                 op.seq, timeout_ms, rank));
    }
  }
  if (op.sync.failed()) {
    const int status = op.sync.status();
    const std::string message = op.sync.message();
    g.stream->set_async_error(status, message);
    record_async_error(status, message);
  }
  if (profiler_.on()) op.note_rank_end(rank);
  const bool last = op.finished.fetch_add(1) + 1 == size();
  // Before this rank's stream moves on: a report taken after every
  // stream was synchronized has the collective.
  if (last && !op.sync.failed()) record_end(op);
  completed_[rank].store(op.seq + 1, std::memory_order_release);
  if (last) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.erase(op.seq);
  }
  // Notify, then decrement, and touch nothing after: once drain() reads
  // in_flight_ at 0 its caller frees this communicator, signal included.
  // The other order had notify() run on freed memory (ThreadSanitizer saw
  // it under wia_finalize). A drain() that checks between the two sleeps
  // one 20 ms slice at most.
  completion_signal_.notify();
  in_flight_.fetch_sub(1);
}

// A rank that passed an in-place call while others did not runs the
// out-of-place schedule; its input is snapshotted first because the
// schedule may write the output before it has read all of the input.
void DeviceCommunicator::stage_input(const coll::Schedule& s, int rank, engine::RankBuffers& mine,
                                     std::vector<char>& staged) {
  const std::uint64_t bytes = s.programs[rank].sizes.send * s.elem_size();
  if (mine.send && bytes) {
    staged.assign(mine.send, mine.send + bytes);
    mine.send = staged.data();
  }
  if (!mine.send_shards.empty()) {
    const std::uint64_t shard = s.programs[rank].sizes.send_shard * s.elem_size();
    staged.resize(shard * mine.send_shards.size());
    for (std::size_t j = 0; j < mine.send_shards.size(); ++j) {
      std::memcpy(staged.data() + j * shard, mine.send_shards[j], shard);
      mine.send_shards[j] = staged.data() + j * shard;
    }
  }
}

bool DeviceCommunicator::drain() {
  // Every stream task gives up after its collective's timeout once its stream
  // reaches it; a margin on top covers stream tasks still queued behind other work.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(2 * std::uint64_t(default_timeout_ms_) + 1000);
  return completion_signal_.wait_until([&] { return in_flight_.load() == 0; }, deadline, false);
}

int DeviceCommunicator::in_flight() const { return in_flight_.load(); }

void DeviceCommunicator::record_start(const Operation& op) {
  if (!profiler_.on() || !op.plan) return;
  const Call& c = op.calls[0];
  const double p = size();
  double factor = 1.0;  // broadcast, reduce (nccl-tests' bus bandwidth factors)
  if (c.collective == coll::Collective::kAllReduce) factor = 2 * (p - 1) / p;
  if (c.collective == coll::Collective::kAllGather ||
      c.collective == coll::Collective::kReduceScatter ||
      c.collective == coll::Collective::kAllToAll)
    factor = (p - 1) / p;
  profiler_.posted(op.seq, coll::collective_name(c.collective),
                   c.count * kernels::dtype_size(c.dtype), factor,
                   coll::algorithm_name(op.plan->schedule.algorithm), transport_, -1, c.dtype);
}

void DeviceCommunicator::record_end(const Operation& op) {
  if (profiler_.on())
    profiler_.finished(op.seq, nullptr, nullptr,
                       {op.rank_start_ns.get(), op.rank_end_ns.get(), size()});
}

double DeviceCommunicator::slowest_link_gbps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return selector_.model().slowest_gbps();
}

tuner::LinkModel DeviceCommunicator::cost_model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return selector_.model();
}

}  // namespace wia::comm
