// SPDX-License-Identifier: Apache-2.0
// The "wia" c10d ProcessGroup: each torch collective is posted on one libwia
// stream of the group, followed by an event; a completion thread waits for
// the events in posting order and completes the Works and their futures
// (DDP's comm hooks chain on those futures).
#include "process_group_wia.hpp"

#include <Python.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace wia_torch {

namespace {

// The groups not yet destroyed, for ProcessGroupWia::shutdown_all. Never
// freed: atexit handlers and static destructors may come in either order.
std::mutex& live_groups_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<ProcessGroupWia*>& live_groups() {
  static auto* groups = new std::vector<ProcessGroupWia*>;
  return *groups;
}

}  // namespace

namespace {

std::string last_error() {
  const char* e = wia_get_last_error();
  return e ? e : "";
}

wia_datatype_t to_wia(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat: return WIA_FLOAT32;
    case at::kDouble: return WIA_FLOAT64;
    case at::kHalf: return WIA_FLOAT16;
    case at::kBFloat16: return WIA_BFLOAT16;
    case at::kChar: return WIA_INT8;
    case at::kByte: return WIA_UINT8;
    case at::kInt: return WIA_INT32;
    case at::kLong: return WIA_INT64;
    default:
      TORCH_CHECK(false, "wia backend: ", what, ": dtype ", t.scalar_type(),
                  " is not supported (float32/64, float16, bfloat16, int8, uint8, int32, int64 are)");
  }
}

wia_reduce_op_t to_wia(const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return WIA_REDUCE_SUM;
    case c10d::ReduceOp::AVG: return WIA_REDUCE_AVG;
    case c10d::ReduceOp::PRODUCT: return WIA_REDUCE_PROD;
    case c10d::ReduceOp::MIN: return WIA_REDUCE_MIN;
    case c10d::ReduceOp::MAX: return WIA_REDUCE_MAX;
    default:
      TORCH_CHECK(false, "wia backend: ", what, ": reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, AVG, PRODUCT, MIN, MAX are)");
  }
}

// A dense CPU tensor whose bytes libwia may read or write in place.
void require_plain(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), "wia backend: ", what, ": tensor on ", t.device(),
              "; only CPU tensors are supported in this release");
  TORCH_CHECK(t.layout() == c10::kStrided, "wia backend: ", what,
              ": sparse tensors are not supported");
  TORCH_CHECK(t.is_contiguous(), "wia backend: ", what, ": tensors must be contiguous");
}

const at::Tensor& only_tensor(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "wia backend: ", what, ": expects exactly one tensor, got ",
              ts.size());
  require_plain(ts[0], what);
  return ts[0];
}

size_t bytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

// One flat tensor holding `ts` one after the other (allreduce_coalesced,
// reduce_scatter of a list).
at::Tensor flatten(const std::vector<at::Tensor>& ts, const char* what) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const at::Tensor& t : ts) {
    require_plain(t, what);
    TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "wia backend: ", what,
                ": tensors must share one dtype (", ts[0].scalar_type(), " and ",
                t.scalar_type(), ")");
    flat.push_back(t.reshape({-1}));
  }
  return at::cat(flat);
}

}  // namespace

void check(wia_status_t status, const char* what, int rank) {
  if (status == WIA_SUCCESS) return;
  TORCH_CHECK(false, "wia backend: ", what, " failed on rank ", rank, ": ", last_error());
}

WorkWia::WorkWia(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                 std::vector<at::Tensor> keep_alive)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      keep_alive_(std::move(keep_alive)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

WorkWia::~WorkWia() {
  if (event_) wia_destroy_event(event_);
}

void WorkWia::complete(std::exception_ptr error) {
  finish(error);
  keep_alive_.clear();
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupWia::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<float> timeout) {
  return c10::make_intrusive<ProcessGroupWia>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
}

ProcessGroupWia::ProcessGroupWia(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                 int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), timeout_(timeout) {
  static std::once_flag init_once;
  std::call_once(init_once, [&] {
    // init_process_group's timeout bounds libwia's waits too, unless the
    // configuration says otherwise (an environment variable wins; read at
    // wia_init, so it applies to every group of the process).
    const std::string ms = std::to_string(timeout_ms(c10d::kUnsetTimeout));
    setenv("WIA_BOOTSTRAP_TIMEOUT_MS", ms.c_str(), 0);
    setenv("WIA_COLLECTIVES_TIMEOUT_MS", ms.c_str(), 0);
    check(wia_init(), "wia_init", rank);
  });

  // The rendezvous goes through the group's c10d store (a prefix store of
  // its own, so one key per group): rank 0 starts libwia's root and
  // publishes the id that leads to it, as ProcessGroupNCCL does with
  // ncclGetUniqueId.
  wia_unique_id_t id;
  const std::string key = "wia_unique_id";
  if (rank == 0) {
    check(wia_get_unique_id(&id), "wia_get_unique_id", rank);
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal));
  } else {
    const std::vector<uint8_t> v = store->get(key);
    TORCH_CHECK(v.size() == sizeof id.internal, "wia backend: the store's ", key, " holds ",
                v.size(), " bytes, expected ", sizeof id.internal);
    std::memcpy(id.internal, v.data(), v.size());
  }
  check(wia_create_communicator_from_id(&id, size, rank, &comm_),
        "wia_create_communicator_from_id", rank);
  const wia_status_t st = wia_create_stream(&stream_);
  if (st != WIA_SUCCESS) {
    const std::string msg = last_error();
    wia_destroy_communicator(comm_);
    TORCH_CHECK(false, "wia backend: wia_create_stream failed on rank ", rank, ": ", msg);
  }
  completion_ = std::thread([this] { completion_loop(); });
  std::lock_guard<std::mutex> lock(live_groups_mu());
  live_groups().push_back(this);
}

ProcessGroupWia::~ProcessGroupWia() {
  shutdown();
  std::lock_guard<std::mutex> lock(live_groups_mu());
  auto& live = live_groups();
  live.erase(std::remove(live.begin(), live.end(), this), live.end());
}

namespace {

// WIA_TORCH_SHUTDOWN_GRACE_MS: how long shutdown() lets work in flight
// finish before it aborts the communicator (0 .. one day; default 10 s,
// also for a value that is not such a number, which is said on stderr).
std::chrono::milliseconds shutdown_grace() {
  constexpr long long kDefaultMs = 10000, kMaxMs = 86400000;
  const char* v = std::getenv("WIA_TORCH_SHUTDOWN_GRACE_MS");
  if (!v || !*v) return std::chrono::milliseconds(kDefaultMs);
  char* end = nullptr;
  errno = 0;
  const long long ms = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || ms < 0 || ms > kMaxMs) {
    std::fprintf(stderr,
                 "wia backend: WIA_TORCH_SHUTDOWN_GRACE_MS '%s' is not a number of ms from 0 to "
                 "%lld; using %lld\n",
                 v, kMaxMs, kDefaultMs);
    return std::chrono::milliseconds(kDefaultMs);
  }
  return std::chrono::milliseconds(ms);
}

}  // namespace

void ProcessGroupWia::shutdown() noexcept {
  std::lock_guard<std::mutex> once(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  // Python drops the last reference to a group (and calls atexit
  // handlers) with the GIL held. The completion thread may need the GIL to
  // release a tensor Python let go of, and destroying the communicator
  // waits for peers: hold it neither while joining nor while destroying.
  PyThreadState* gil = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  bool drained = true;
  std::size_t in_flight = 0;
  const std::chrono::milliseconds grace = shutdown_grace();
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    stopping_ = true;
    queue_cv_.notify_all();
    if (completion_.joinable())
      drained = queue_cv_.wait_for(lock, grace, [&] { return completion_done_; });
    in_flight = queue_.size();
  }
  if (!drained) {
    // A collective some peer has not posted (it exited, or never will)
    // would hold this exit for its timeout: abort instead, which fails it
    // here and tells the peers at once.
    std::fprintf(stderr,
                 "wia backend: rank %d: %zu operation(s) still in flight %lld ms after shutdown "
                 "began (WIA_TORCH_SHUTDOWN_GRACE_MS); aborting the communicator\n",
                 getRank(), in_flight, static_cast<long long>(grace.count()));
    std::lock_guard<std::mutex> lock(comm_mu_);
    wia_comm_abort(std::exchange(comm_, nullptr));
  }
  if (completion_.joinable()) completion_.join();
  if (stream_) wia_destroy_stream(std::exchange(stream_, nullptr));
  if (comm_) wia_destroy_communicator(std::exchange(comm_, nullptr));
  if (gil) PyEval_RestoreThread(gil);
}

void ProcessGroupWia::shutdown_all() noexcept {
  // From Python's atexit, on the main thread: groups are created and
  // destroyed by Python there too, so none goes away while this runs.
  std::vector<ProcessGroupWia*> groups;
  {
    std::lock_guard<std::mutex> lock(live_groups_mu());
    groups = live_groups();
  }
  for (ProcessGroupWia* g : groups) g->shutdown();
}

uint32_t ProcessGroupWia::timeout_ms(std::chrono::milliseconds opt) const {
  const std::chrono::milliseconds t = opt == c10d::kUnsetTimeout ? timeout_ : opt;
  // libwia's longest timeout is one day (collectives.timeout_ms's range).
  const int64_t ms = std::clamp<int64_t>(t.count(), 1, 86400000);
  return static_cast<uint32_t>(ms);
}

wia_collective_config_t ProcessGroupWia::config_for(wia_collective_op_t op, const at::Tensor& t,
                                                    const c10d::ReduceOp& reduce,
                                                    std::chrono::milliseconds timeout,
                                                    const char* what) const {
  wia_collective_config_t c{};
  c.operation = op;
  c.reduction_op = to_wia(reduce, what);
  c.datatype = to_wia(t, what);
  c.timeout_ms = timeout_ms(timeout);
  return c;
}

void ProcessGroupWia::copy_async(void* dst, const void* src, size_t bytes, const char* what) {
  if (bytes == 0 || dst == src) return;
  check(wia_memcpy_async(dst, src, bytes, stream_), what, getRank());
}

template <typename Post>
c10::intrusive_ptr<c10d::Work> ProcessGroupWia::run(c10d::OpType type,
                                                    std::vector<at::Tensor> outputs,
                                                    std::vector<at::Tensor> keep_alive,
                                                    const char* what, Post&& post) {
  auto work = c10::make_intrusive<WorkWia>(getRank(), type, std::move(outputs),
                                           std::move(keep_alive));
  work->what_ = what;
  std::lock_guard<std::mutex> posting(post_mu_);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    TORCH_CHECK(failure_.empty(), "wia backend: ", what, " on rank ", getRank(),
                ": the process group failed earlier: ", failure_);
    TORCH_CHECK(!stopping_, "wia backend: ", what, " on rank ", getRank(),
                ": the process group was shut down (wia_torch shuts groups down at exit)");
  }
  post();
  check(wia_create_event(&work->event_), what, getRank());
  check(wia_event_record(work->event_, stream_), what, getRank());
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(work);
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroupWia::completion_loop() {
  for (;;) {
    c10::intrusive_ptr<WorkWia> work;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        completion_done_ = true;
        queue_cv_.notify_all();  // shutdown() waits for this
        return;
      }
      work = queue_.front();
    }
    // Bounded: every collective fails within its timeout, and the stream
    // moves on past a failed one.
    const wia_status_t waited = wia_event_synchronize(work->event_);
    std::string failure;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      failure = failure_;
    }
    auto async_error = [&] {
      std::lock_guard<std::mutex> lock(comm_mu_);
      return comm_ ? wia_comm_get_async_error(comm_) : WIA_ERROR_ABORTED;
    };
    if (failure.empty() && (waited != WIA_SUCCESS || async_error() != WIA_SUCCESS)) {
      // The stream holds the message of the first failed operation.
      failure = waited != WIA_SUCCESS ? last_error() : std::string();
      if (wia_stream_synchronize(stream_) != WIA_SUCCESS || failure.empty()) {
        std::string s = last_error();
        const std::string prefix = "wia_stream_synchronize: ";
        if (s.rfind(prefix, 0) == 0) s.erase(0, prefix.size());
        if (!s.empty()) failure = s;
      }
      if (failure.empty()) failure = wia_status_string(async_error());
      std::lock_guard<std::mutex> lock(queue_mu_);
      failure_ = failure;
    }
    std::exception_ptr error;
    if (!failure.empty())
      error = std::make_exception_ptr(std::runtime_error("wia backend: " + std::string(work->what_) +
                                                         " failed on rank " +
                                                         std::to_string(getRank()) + ": " + failure));
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      queue_.pop_front();
    }
    work->complete(error);
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const char* what = "broadcast";
  const at::Tensor& t = only_tensor(tensors, what);
  return run(c10d::OpType::BROADCAST, tensors, {}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_BROADCAST, t, c10d::ReduceOp::SUM, opts.timeout, what);
    check(wia_broadcast_ex(comm_, t.data_ptr(), t.data_ptr(), t.numel(),
                           static_cast<int>(opts.rootRank), &c, stream_),
          what, getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* what = "allreduce";
  const at::Tensor& t = only_tensor(tensors, what);
  return run(c10d::OpType::ALLREDUCE, tensors, {}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_ALLREDUCE, t, opts.reduceOp, opts.timeout, what);
    check(wia_all_reduce(comm_, t.data_ptr(), t.data_ptr(), t.numel(), &c, stream_), what,
          getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* what = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "wia backend: ", what, ": no tensors");
  // One all-reduce of the concatenation: many small tensors cost one
  // latency, not one each (gloo does the same).
  at::Tensor flat = flatten(tensors, what);
  return run(c10d::OpType::ALLREDUCE_COALESCED, tensors, {flat}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_ALLREDUCE, flat, opts.reduceOp, opts.timeout, what);
    check(wia_all_reduce(comm_, flat.data_ptr(), flat.data_ptr(), flat.numel(), &c, stream_),
          what, getRank());
    const char* src = static_cast<const char*>(flat.data_ptr());
    for (const at::Tensor& t : tensors) {
      copy_async(t.data_ptr(), src, bytes_of(t), what);
      src += bytes_of(t);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const char* what = "reduce";
  const at::Tensor& t = only_tensor(tensors, what);
  return run(c10d::OpType::REDUCE, tensors, {}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_REDUCE, t, opts.reduceOp, opts.timeout, what);
    check(wia_reduce(comm_, t.data_ptr(), t.data_ptr(), t.numel(), static_cast<int>(opts.rootRank),
                     &c, stream_),
          what, getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* what = "allgather";
  const at::Tensor& in = only_tensor(inputs, what);
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
              "wia backend: ", what, ": expects one list of ", getSize(), " output tensors");
  for (const at::Tensor& o : outputs[0]) {
    require_plain(o, what);
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(), "wia backend: ",
                what, ": every output must have the input's size and dtype");
  }
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  return run(c10d::OpType::ALLGATHER, outputs[0], {in, flat}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_ALLGATHER, in, c10d::ReduceOp::SUM, opts.timeout, what);
    check(wia_all_gather_ex(comm_, in.data_ptr(), flat.data_ptr(), in.numel(), &c, stream_),
          what, getRank());
    const char* src = static_cast<const char*>(flat.data_ptr());
    for (const at::Tensor& o : outputs[0]) {
      copy_async(o.data_ptr(), src, bytes_of(o), what);
      src += bytes_of(o);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* what = "_allgather_base";
  require_plain(input, what);
  require_plain(output, what);
  TORCH_CHECK(output.numel() == getSize() * input.numel() &&
                  output.scalar_type() == input.scalar_type(),
              "wia backend: ", what, ": output must hold ", getSize(),
              " x the input's elements, of its dtype");
  return run(c10d::OpType::_ALLGATHER_BASE, {output}, {input}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_ALLGATHER, input, c10d::ReduceOp::SUM, opts.timeout, what);
    check(wia_all_gather_ex(comm_, input.data_ptr(), output.data_ptr(), input.numel(), &c,
                            stream_),
          what, getRank());
  });
}

// Gather and scatter are point to point with the root: the root runs its
// receives (sends) in rank order, each other rank one send (receive), so
// no rank waits on a cycle.
c10::intrusive_ptr<c10d::Work> ProcessGroupWia::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const char* what = "gather";
  const at::Tensor& in = only_tensor(inputs, what);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "wia backend: ", what, ": root ", root,
              " is not a rank of [0, ", getSize(), ")");
  const bool am_root = getRank() == root;
  if (am_root) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                "wia backend: ", what, ": the root expects one list of ", getSize(),
                " output tensors");
    for (const at::Tensor& o : outputs[0]) {
      require_plain(o, what);
      TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                  "wia backend: ", what, ": every output must have the input's size and dtype");
    }
  } else {
    TORCH_CHECK(outputs.empty() || outputs[0].empty(), "wia backend: ", what,
                ": only the root passes output tensors");
  }
  const wia_datatype_t dt = to_wia(in, what);
  std::vector<at::Tensor> outs = am_root ? outputs[0] : std::vector<at::Tensor>{};
  return run(c10d::OpType::GATHER, outs, {in}, what, [&] {
    if (!am_root) {
      check(wia_comm_send(comm_, in.data_ptr(), in.numel(), dt, root, stream_), what, getRank());
      return;
    }
    for (int r = 0; r < getSize(); ++r) {
      if (r == root)
        copy_async(outputs[0][r].data_ptr(), in.data_ptr(), bytes_of(in), what);
      else
        check(wia_comm_recv(comm_, outputs[0][r].data_ptr(), in.numel(), dt, r, stream_), what,
              getRank());
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const char* what = "scatter";
  const at::Tensor& out = only_tensor(outputs, what);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "wia backend: ", what, ": root ", root,
              " is not a rank of [0, ", getSize(), ")");
  const bool am_root = getRank() == root;
  if (am_root) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                "wia backend: ", what, ": the root expects one list of ", getSize(),
                " input tensors");
    for (const at::Tensor& i : inputs[0]) {
      require_plain(i, what);
      TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                  "wia backend: ", what, ": every input must have the output's size and dtype");
    }
  }
  const wia_datatype_t dt = to_wia(out, what);
  std::vector<at::Tensor> keep = am_root ? inputs[0] : std::vector<at::Tensor>{};
  return run(c10d::OpType::SCATTER, outputs, keep, what, [&] {
    if (!am_root) {
      check(wia_comm_recv(comm_, out.data_ptr(), out.numel(), dt, root, stream_), what,
            getRank());
      return;
    }
    for (int r = 0; r < getSize(); ++r) {
      if (r == root)
        copy_async(out.data_ptr(), inputs[0][r].data_ptr(), bytes_of(out), what);
      else
        check(wia_comm_send(comm_, inputs[0][r].data_ptr(), out.numel(), dt, r, stream_), what,
              getRank());
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter";
  const at::Tensor& out = only_tensor(outputs, what);
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
              "wia backend: ", what, ": expects one list of ", getSize(), " input tensors");
  for (const at::Tensor& i : inputs[0])
    TORCH_CHECK(i.numel() == out.numel(), "wia backend: ", what,
                ": every input must have the output's size");
  at::Tensor flat = flatten(inputs[0], what);
  TORCH_CHECK(flat.scalar_type() == out.scalar_type(), "wia backend: ", what,
              ": inputs and output must share one dtype");
  return run(c10d::OpType::REDUCE_SCATTER, outputs, {flat}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_REDUCE_SCATTER, out, opts.reduceOp, opts.timeout, what);
    check(wia_reduce_scatter(comm_, flat.data_ptr(), out.data_ptr(), out.numel(), &c, stream_),
          what, getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* what = "_reduce_scatter_base";
  require_plain(input, what);
  require_plain(output, what);
  TORCH_CHECK(input.numel() == getSize() * output.numel() &&
                  output.scalar_type() == input.scalar_type(),
              "wia backend: ", what, ": input must hold ", getSize(),
              " x the output's elements, of its dtype");
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_REDUCE_SCATTER, output, opts.reduceOp, opts.timeout, what);
    check(wia_reduce_scatter(comm_, input.data_ptr(), output.data_ptr(), output.numel(), &c,
                             stream_),
          what, getRank());
  });
}

// Uneven all-to-all: libwia's all-to-all moves equal shards, so uneven
// splits go as one send/receive per pair of ranks. Pairs follow the
// hypercube order (step s pairs rank r with r xor s, skipping partners past
// the last rank): every pair meets exactly once, a rank talks to one
// partner per step, and the lower rank of a pair sends first while the
// higher one receives first, so no cycle of waiting ranks can form even
// when a transport does not buffer whole messages.
void ProcessGroupWia::post_pairwise_exchange(const std::vector<char*>& out,
                                             const std::vector<size_t>& out_bytes,
                                             const std::vector<const char*>& in,
                                             const std::vector<size_t>& in_bytes,
                                             const char* what) {
  const int me = getRank();
  const int n = getSize();
  TORCH_CHECK(out_bytes[me] == in_bytes[me], "wia backend: ", what, ": rank ", me, " sends ",
              in_bytes[me], " bytes to itself but expects ", out_bytes[me]);
  copy_async(out[me], in[me], in_bytes[me], what);
  int steps = 1;
  while (steps < n) steps <<= 1;
  for (int s = 1; s < steps; ++s) {
    const int peer = me ^ s;
    if (peer >= n) continue;
    auto send = [&] {
      check(wia_comm_send(comm_, in[peer], in_bytes[peer], WIA_UINT8, peer, stream_),
            what, me);
    };
    auto recv = [&] {
      check(wia_comm_recv(comm_, out[peer], out_bytes[peer], WIA_UINT8, peer,
                          stream_),
            what, me);
    };
    if (me < peer) {
      send();
      recv();
    } else {
      recv();
      send();
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  const char* what = "alltoall_base";
  require_plain(input, what);
  require_plain(output, what);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "wia backend: ", what,
              ": input and output must share one dtype");
  const int n = getSize();
  if (output_splits.empty() && input_splits.empty()) {
    TORCH_CHECK(input.numel() % n == 0 && output.numel() == input.numel(), "wia backend: ", what,
                ": without splits, input and output must hold the same number of elements, "
                "a multiple of the group size ",
                n);
    return run(c10d::OpType::ALLTOALL_BASE, {output}, {input}, what, [&] {
      wia_collective_config_t c =
          config_for(WIA_COLLECTIVE_ALLTOALL, input, c10d::ReduceOp::SUM, opts.timeout, what);
      check(wia_all_to_all_contiguous(comm_, input.data_ptr(), output.data_ptr(),
                                      input.numel() / n, &c, stream_),
            what, getRank());
    });
  }
  // Splits count rows of dimension 0; an empty list means equal splits.
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* side,
                    std::vector<size_t>& bytes, std::vector<size_t>& offsets) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : bytes_of(t) / rows;
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      TORCH_CHECK(rows % n == 0, "wia backend: ", what, ": ", side, " has ", rows,
                  " rows, not a multiple of the group size ", n);
      s.assign(n, rows / n);
    }
    TORCH_CHECK(s.size() == static_cast<size_t>(n), "wia backend: ", what, ": ", side,
                " splits have ", s.size(), " entries for ", n, " ranks");
    size_t offset = 0;
    int64_t total = 0;
    for (int64_t rows_to : s) {
      TORCH_CHECK(rows_to >= 0, "wia backend: ", what, ": negative ", side, " split");
      bytes.push_back(static_cast<size_t>(rows_to) * row_bytes);
      offsets.push_back(offset);
      offset += bytes.back();
      total += rows_to;
    }
    TORCH_CHECK(total == rows, "wia backend: ", what, ": ", side, " splits sum to ", total,
                " rows, the tensor has ", rows);
  };
  std::vector<size_t> out_bytes, out_offsets, in_bytes, in_offsets;
  layout(output, output_splits, "output", out_bytes, out_offsets);
  layout(input, input_splits, "input", in_bytes, in_offsets);
  std::vector<char*> out(n);
  std::vector<const char*> in(n);
  for (int r = 0; r < n; ++r) {
    out[r] = static_cast<char*>(output.data_ptr()) + out_offsets[r];
    in[r] = static_cast<const char*>(input.data_ptr()) + in_offsets[r];
  }
  return run(c10d::OpType::ALLTOALL_BASE, {output}, {input}, what,
             [&] { post_pairwise_exchange(out, out_bytes, in, in_bytes, what); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions&) {
  const char* what = "alltoall";
  const int n = getSize();
  TORCH_CHECK(outputs.size() == static_cast<size_t>(n) && inputs.size() == static_cast<size_t>(n),
              "wia backend: ", what, ": expects ", n, " input and ", n, " output tensors");
  std::vector<char*> out;
  std::vector<const char*> in;
  std::vector<size_t> out_bytes, in_bytes;
  for (int r = 0; r < n; ++r) {
    require_plain(outputs[r], what);
    require_plain(inputs[r], what);
    TORCH_CHECK(outputs[r].scalar_type() == inputs[0].scalar_type() &&
                    inputs[r].scalar_type() == inputs[0].scalar_type(),
                "wia backend: ", what, ": tensors must share one dtype");
    out.push_back(static_cast<char*>(outputs[r].data_ptr()));
    out_bytes.push_back(bytes_of(outputs[r]));
    in.push_back(static_cast<const char*>(inputs[r].data_ptr()));
    in_bytes.push_back(bytes_of(inputs[r]));
  }
  return run(c10d::OpType::ALLTOALL, outputs, inputs, what,
             [&] { post_pairwise_exchange(out, out_bytes, in, in_bytes, what); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int /*tag*/) {
  const char* what = "send";
  const at::Tensor& t = only_tensor(tensors, what);
  return run(c10d::OpType::SEND, {}, {t}, what, [&] {
    check(wia_comm_send(comm_, t.data_ptr(), t.numel(), to_wia(t, what), dst, stream_), what,
          getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int /*tag*/) {
  const char* what = "recv";
  const at::Tensor& t = only_tensor(tensors, what);
  return run(c10d::OpType::RECV, tensors, {}, what, [&] {
    check(wia_comm_recv(comm_, t.data_ptr(), t.numel(), to_wia(t, what), src, stream_), what,
          getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::barrier(const c10d::BarrierOptions& opts) {
  const char* what = "barrier";
  // An all-reduce of one byte: it completes on no rank before every rank
  // has posted it.
  at::Tensor token = at::zeros({1}, at::kByte);
  return run(c10d::OpType::BARRIER, {}, {token}, what, [&] {
    wia_collective_config_t c =
        config_for(WIA_COLLECTIVE_ALLREDUCE, token, c10d::ReduceOp::SUM, opts.timeout, what);
    check(wia_all_reduce(comm_, token.data_ptr(), token.data_ptr(), 1, &c, stream_), what,
          getRank());
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWia::allreduce_compressed(
    at::Tensor& tensor, const wia_compression_config_t& config, bool average) {
  const char* what = "allreduce_compressed";
  require_plain(tensor, what);
  const wia_datatype_t dt = to_wia(tensor, what);
  return run(c10d::OpType::ALLREDUCE, {tensor}, {}, what, [&] {
    check(wia_all_reduce_compressed_ex(comm_, tensor.data_ptr(), tensor.data_ptr(),
                                       tensor.numel(), dt,
                                       average ? WIA_REDUCE_AVG : WIA_REDUCE_SUM, &config,
                                       stream_),
          what, getRank());
  });
}

}  // namespace wia_torch
