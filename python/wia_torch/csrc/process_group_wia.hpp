// SPDX-License-Identifier: Apache-2.0
// torch.distributed backend "wia": a c10d ProcessGroup (the torch 1.13 API)
// on one libwia process communicator. docs/torch.md says what each
// collective maps to and what differs from gloo.
#pragma once

#include <wia/wia.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace wia_torch {

class ProcessGroupWia;

// One posted operation: done when the event recorded after it on the
// group's stream has passed, failed when the communicator reported an
// error by then. The tensors it reads and writes stay alive until then.
class WorkWia : public c10d::Work {
 public:
  WorkWia(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
          std::vector<at::Tensor> keep_alive);
  ~WorkWia() override;

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // CPU tensors: the data is in place once wait() returned.
  void synchronize() override {}

 private:
  friend class ProcessGroupWia;
  void complete(std::exception_ptr error);

  const char* what_ = "";  // the collective, for error messages
  wia_event_t event_ = nullptr;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_alive_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupWia : public c10d::ProcessGroup {
 public:
  // The creator torch.distributed calls (Backend.register_backend): rank 0
  // starts the libwia rendezvous and publishes its id in the group's store.
  static c10::intrusive_ptr<c10d::ProcessGroup> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                       int rank, int size,
                                                       std::chrono::duration<float> timeout);

  ProcessGroupWia(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);
  ~ProcessGroupWia() override;

  // Completes what is in flight, joins the completion thread and destroys
  // the communicator, once (the destructor calls it too). What is still
  // in flight after WIA_TORCH_SHUTDOWN_GRACE_MS (default 10000) - a
  // collective some peer never posts - is ended by aborting the
  // communicator (wia_comm_abort: the peers fail at once, naming this
  // rank) instead of holding the exit for the collective's timeout. Every live group
  // is shut down by shutdown_all(), which wia_torch registers with Python's
  // atexit: while the interpreter is whole, not during its finalization
  // (where CPython ends a thread that asks for the GIL, as the completion
  // thread does to release a tensor, and the forced unwind through C++
  // destructors aborts the process) nor among static destructors.
  void shutdown() noexcept;
  static void shutdown_all() noexcept;

  const std::string getBackendName() const override { return "wia"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // libwia's compressed all-reduce (sum or average) of a float32, float16
  // or bfloat16 tensor, in place; `config` as wia_all_reduce_compressed takes it.
  c10::intrusive_ptr<c10d::Work> allreduce_compressed(at::Tensor& tensor,
                                                      const wia_compression_config_t& config,
                                                      bool average);

  wia_communicator_t communicator() const { return comm_; }

 private:
  // Everything posted by one collective call runs on stream_ in posting
  // order; `post` runs it under the posting lock and enqueues the Work.
  template <typename Post>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, std::vector<at::Tensor> outputs,
                                     std::vector<at::Tensor> keep_alive, const char* what,
                                     Post&& post);
  void completion_loop();
  // The config of one reducing collective: datatype, op and timeout.
  wia_collective_config_t config_for(wia_collective_op_t op, const at::Tensor& t,
                                     const c10d::ReduceOp& reduce, std::chrono::milliseconds timeout,
                                     const char* what) const;
  uint32_t timeout_ms(std::chrono::milliseconds opt) const;
  void copy_async(void* dst, const void* src, size_t bytes, const char* what);
  // Posts the exchange of uneven all-to-all splits as pairwise send/receive.
  void post_pairwise_exchange(const std::vector<char*>& out, const std::vector<size_t>& out_bytes,
                              const std::vector<const char*>& in,
                              const std::vector<size_t>& in_bytes, const char* what);

  // Null once shutdown() aborted it; the completion thread reads it under
  // comm_mu_ (wia_comm_abort releases the handle).
  wia_communicator_t comm_ = nullptr;
  std::mutex comm_mu_;
  wia_stream_t stream_ = nullptr;
  std::chrono::milliseconds timeout_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;  // under shutdown_mu_

  std::mutex post_mu_;  // one collective posts at a time: every rank posts in the same order

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<c10::intrusive_ptr<WorkWia>> queue_;
  bool stopping_ = false;
  bool completion_done_ = false;  // the completion thread returned (under queue_mu_)
  std::string failure_;  // the communicator's first error, for every later Work
  std::thread completion_;
};

// Throws a c10::Error (a RuntimeError in Python) naming the call and
// libwia's message when status is not WIA_SUCCESS.
void check(wia_status_t status, const char* what, int rank);

}  // namespace wia_torch
