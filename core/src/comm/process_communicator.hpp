// SPDX-License-Identifier: Apache-2.0
// Process-based communicators: one rank per process, on the process's
// current device, peers reached through transport providers (shm inside a
// node, tcp between nodes, by default). Created collectively from a
// bootstrap (bootstrap/), or split from another process communicator.
//
// Setup: every rank listens on each transport it has loaded, all-gathers
// the connection handles through the bootstrap, and connects to every peer
// with the first transport of the link's preference list that both ends
// loaded (comm/transport_choice.hpp). The lower rank connects, the higher
// accepts; the connect cookie carries the connector's rank.
//
// Execution: a collective posts a stream task (a host function) on the
// caller's stream; when the stream reaches it, the task runs this rank's
// program of the schedule over the connections (engine/net_exec.hpp), in
// posting order. A small collective posted on an idle stream while nothing
// else of the communicator is pending is started by the posting thread
// itself and driven for up to collectives.post_progress_us: waking the
// stream's worker costs about 50 us here (MACHINE-FACTS), far more than
// the collective. If peers are late it is handed to the stream where it
// stopped, so posting never blocks for long and stream order holds. Every
// rank builds the same schedule from the same arguments and the same link
// model (gathered, not measured locally), and a descriptor check catches
// ranks that did not.
//
// Failure: the first error (mismatch, a lost peer, a timeout) breaks the
// communicator for good, as ncclCommAbort does: the rank sends the reason
// to every peer on the control channel and closes its connections, so
// every other rank fails its current or next collective with that reason
// instead of hanging, and posting fails at once afterwards. Pending
// requests die with their connections, so no late message can land in a
// user buffer. Heartbeats (collectives.heartbeat_ms) find a dead or cut-off
// peer while this rank is idle: a thread per communicator exchanges them
// with the ring neighbours on the control channel and breaks the
// communicator on silence (docs/fault-tolerance.md, "Heartbeats").
//
// The code, by lifetime: process_communicator.cpp (construction and
// destruction), process_mesh.cpp (set-up: listen, exchange, connect),
// process_links.cpp (the link model the tuner costs with),
// process_control.cpp (control channel, failure, heartbeats), process_order.cpp
// (posting and the order operations run in), process_exec.cpp (running
// one collective), process_plan.cpp (plans), process_p2p.cpp (send and
// receive), process_split.cpp (split and topology).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator_base.hpp"
#include "comm/comm_profiler.hpp"
#include "comm/flight_recorder.hpp"
#include "common/page_aligned.hpp"
#include "engine/net_exec.hpp"
#include "engine/progress_signal.hpp"
#include "engine/window_allreduce.hpp"
#include "selector/selector.hpp"
#include "topology/topology.hpp"
#include "tuner/cost_model.hpp"

namespace wia {
struct Allocation;
}

namespace wia::bootstrap {
class Bootstrap;
}

namespace wia::comm {

class NodeWindowSet;

// What setup needs to know about the ranks, whoever gathers it.
struct ProcessLayout {
  int rank = 0;
  int size = 1;
  std::vector<int> node_of_rank;
  std::vector<int> local_rank_of_rank;
  std::vector<std::string> host_of_rank;  // node names, for selector groups
  int nnodes = 1;
  // The rank each member had in the communicator this one was shrunk from
  // (its origin: made by a bootstrap or a split) and the origin's size;
  // empty: this is the origin. Redundancy's shards are numbered by it.
  std::vector<int> origin_of_rank;
  int origin_size = 0;
};

// Gathers one fixed-size blob from every rank (the bootstrap, or the
// parent communicator's links for a split).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual std::vector<std::uint8_t> all_gather(const std::vector<std::uint8_t>& mine) = 0;
  // Why the exchange can no longer complete (a member left it), or "":
  // looked at while waiting between rounds, so that a rank waiting for a
  // connection from a rank that gave up learns it at once.
  virtual std::string abandoned() { return {}; }
};

class ProcessCommunicator final : public CommunicatorBase {
 public:
  // A link whose transport the configuration (WIA_TRANSPORT,
  // selector.transport or .rules, a network backend) set to another than
  // the built-in rules would choose with what both ends have, e.g. tcp
  // forced between two ranks of one node that both have shm.
  struct ForcedTransport {
    int a = 0, b = 0;        // ranks, a -> b
    std::string chosen;      // what the link uses
    std::string by_default;  // what the built-in rules would use
    std::string rule;        // the deciding rule ("forced inter_process=tcp (env WIA_TRANSPORT)")
    bool same_node = false;
  };
  // Collective over every rank of `layout`: connects the mesh. `device`
  // is the calling process's device (its memory must be host-addressable
  // in this release). `preferred` optionally names the transport for links
  // between nodes ("" = defaults). Throws wia::Error naming the rank and
  // the link that failed.
  ProcessCommunicator(const ProcessLayout& layout, Exchange& exchange, wia_device_t device,
                      std::chrono::milliseconds setup_timeout,
                      const std::string& preferred_inter_node = "");
  ~ProcessCommunicator() override;

  // From a bootstrap (unique id or launcher).
  static std::unique_ptr<ProcessCommunicator> create(bootstrap::Bootstrap& bs, wia_device_t device,
                                                     const std::string& preferred_inter_node = "");

  int size() const override { return layout_.size; }
  int rank() const { return layout_.rank; }
  wia_device_t device() const { return device_; }
  // The n-th process communicator of this process (1, 2, ...).
  int index_in_process() const { return comm_index_; }
  int rank_of_device(wia_device_t device) const override {
    return device == device_ ? layout_.rank : -1;
  }
  int node_rank(int rank) const override { return layout_.node_of_rank[rank]; }
  int local_rank(int rank) const override { return layout_.local_rank_of_rank[rank]; }
  int node_count() const override { return layout_.nnodes; }
  int origin_rank(int rank) const override {
    return layout_.origin_of_rank.empty() ? rank : layout_.origin_of_rank[rank];
  }
  int origin_size() const override {
    return layout_.origin_of_rank.empty() ? layout_.size : layout_.origin_size;
  }
  // Transport of the link to `peer` ("shm", "tcp"; "" for the rank itself).
  const std::string& transport_to(int peer) const { return peers_[peer].transport; }

  wia_status_t post(int rank, Call call, wia_stream_s* stream) override;
  bool try_post_repeat(int rank, const Call& call, wia_stream_s* stream) override;
  void post_send(int rank, int peer, const void* buf, std::uint64_t count, wia_datatype_t dtype,
                 std::uint32_t timeout_ms, wia_stream_s* stream) override;
  void post_recv(int rank, int peer, void* buf, std::uint64_t count, wia_datatype_t dtype,
                 std::uint32_t timeout_ms, wia_stream_s* stream) override;
  bool drain() override;
  int in_flight() const override { return in_flight_.load(); }
  wia_status_t async_error() const override;
  std::vector<int> failed_ranks() const override;
  void request_abort() override;
  void report_failed(int rank) override { note_failed(rank); }
  wia_algorithm_t last_selected() const override;

  // wia_send_ex / wia_recv_ex (api/api_p2p.cpp): `bytes` bytes to or from
  // `peer` with the caller's `tag` (< 2^31), posted like post_send;
  // `name` is the profiler's and flight recorder's (static storage).
  // `mr`: the buffer's registration on the link's endpoint, or nullptr.
  void post_tagged(int peer, bool is_send, void* buf, std::uint64_t bytes, std::uint32_t tag,
                   const char* name, const char* path, wia_stream_s* stream,
                   wia_mr_t mr = nullptr);
  // How device memory of interface `iface` (WIA_MEM_IFACE_*) can go on the
  // link to `peer`:
  // A transport is given device memory only with its registration (it
  // cannot tell a device pointer from a host one, nor whose it is).
  enum class DeviceMemoryPath {
    kStaged,      // it cannot: through host memory (`why` says why)
    kByAddress,   // registered naming its interface and device (FLAG_DEVICE_MEMORY)
    kDmabuf,      // registered through its dma-buf (FLAG_DEVICE_MEMORY | FLAG_DMABUF)
  };
  // `device_exports_dmabuf`: the buffer's device has WIA_DEVICE_CAP_DMABUF.
  DeviceMemoryPath device_memory_path(int peer, std::uint32_t iface, bool device_exports_dmabuf,
                                      std::string* why) const;
  // The registration of allocation `a` on the link's transport endpoint
  // by `path` (kByAddress, kDmabuf), made once and kept until wia_free.
  // Throws naming the cause (NOT_SUPPORTED: the caller stages).
  wia_mr_t register_device_memory(int peer, const Allocation& a, std::uint32_t iface,
                                  DeviceMemoryPath path) const;

  // Runs a collective now on the calling thread (after every posted one);
  // used by split. Throws wia::Error on failure.
  void run_now(Call call);

  // wia_comm_discover_topology: collective; every rank as a device, its
  // node and NUMA node, and every link with the transport it uses and the
  // tuner's figures for it (measured between nodes).
  topo::Topology topology();

  // wia_comm_split: collective over this communicator; nullptr for a
  // negative color (the rank joins no new communicator).
  std::unique_ptr<ProcessCommunicator> split(int color, int key);

  // Fault tolerance (process_recovery.cpp, docs/fault-tolerance.md,
  // "Revoke, agree, shrink"). Agreement and shrink run over a recovery
  // channel of their own (a TCP listener per rank, opened at set-up), not
  // over the connections, which a failure closes.
  // wia_comm_revoke: breaks the communicator on this rank with
  // WIA_ERROR_ABORTED and tells every peer, whose operations fail with
  // WIA_ERROR_ABORTED too; idempotent, a no-op once broken.
  void revoke();
  struct Agreement {
    std::int32_t flag = 0;    // the AND of the survivors' flags
    std::vector<int> failed;  // the ranks agreed to have failed, ascending
  };
  // wia_comm_agree: collective over the survivors; bounded by
  // collectives.timeout_ms. Throws wia::Error.
  Agreement agree(std::int32_t flag);
  // wia_comm_shrink: agrees on the failed ranks, then builds a
  // communicator of the others, renumbered densely in rank order; a
  // survivor that dies meanwhile makes it agree and build again. The
  // agreed failed ranks go to `failed` when not null. Throws wia::Error.
  std::unique_ptr<ProcessCommunicator> shrink(std::vector<int>* failed);

 private:
  // Header of a control-channel message (process_control.cpp).
  struct ControlHeader {
    std::uint32_t magic = 0x57494158;  // "WIAX"
    std::uint32_t type = 0;
    std::uint64_t seq = 0;        // query: the collective asked about
    std::uint64_t completed = 0;  // reply: collectives this rank completed
    std::int64_t running = -1;    // reply: the collective it is in, -1 none
  };
  struct Peer {
    engine::NetLink link;
    std::string transport;
    // The control channel (process_control.cpp): a receive always
    // posted, one message of ours in flight, the peer's last reply.
    std::vector<char> control_buf;
    wia_request_t control_req = nullptr;
    std::vector<char> send_buf;
    wia_request_t send_req = nullptr;
    bool has_reply = false;
    ControlHeader reply{};
    bool said_bye = false;
    bool said_abort = false;  // it broke the communicator and told us why
    // Heartbeats (process_control.cpp): when a control message last came
    // from the peer, and when this rank last sent it a heartbeat.
    std::chrono::steady_clock::time_point last_heard{}, last_beat{};
    bool watched = false;  // a ring neighbour whose silence counts
  };
  // Defined in process_internal.hpp, private to process_*.cpp:
  class Control;            // the control channel (abort, query, reply, bye, heartbeat)
  struct Recovery;          // the recovery channel (process_recovery.cpp)
  class RecoveryExchange;   // a shrink's set-up exchange over it
  class RecoveryDesk;       // its decisions, kept and handed out (process_recovery.cpp)
  struct Heartbeat;         // the heartbeat thread (process_control.cpp)
  struct MeshSetup;         // what connect_mesh's steps gather and share
  struct RunningOperation;  // the operation this rank runs now, in one of four modes
  struct StreamTask;        // the work item a stream runs: one operation, in sequence

  // Operations run in posting order, whatever streams they were posted
  // on: an operation waits (bounded) for its turn in that sequence, and
  // passes the turn on when destroyed, whatever happened
  // (process_order.cpp).
  class SequenceTurn {
   public:
    SequenceTurn(ProcessCommunicator& c, std::uint64_t seq,
                 std::chrono::steady_clock::time_point deadline);
    ~SequenceTurn();
    SequenceTurn(const SequenceTurn&) = delete;
    SequenceTurn& operator=(const SequenceTurn&) = delete;
    bool reached() const { return reached_; }

   private:
    ProcessCommunicator& c_;
    std::uint64_t seq_;
    bool reached_ = false;
  };

  // Set-up (process_mesh.cpp): connect_mesh runs these steps in order.
  void connect_mesh(Exchange& exchange, std::chrono::milliseconds timeout,
                    const std::string& preferred_inter_node);
  // Listens on every loaded transport; one handle slot of s.mine each.
  void listen_on_transports(MeshSetup& s);
  // The rest of s.mine: host name, CPUs, measured links' digest, window.
  void describe_this_rank(MeshSetup& s);
  // All-gathers every rank's record into s.records.
  void exchange_records(Exchange& exchange, MeshSetup& s);
  // Whether this node's ranks outnumber the CPUs they may run on.
  void note_oversubscription(const MeshSetup& s);
  // Each link's transport, chosen alike on every rank.
  void choose_link_transports(MeshSetup& s, const std::string& preferred_inter_node);
  // The lower rank of each pair connects, the higher accepts.
  void connect_peers(MeshSetup& s, Exchange& exchange, std::chrono::milliseconds timeout);
  void open_control_channel();
  // The recovery channel's listener (process_recovery.cpp): opened before
  // the records are exchanged (its address travels in this rank's), the
  // peers' addresses taken from theirs after.
  void open_recovery_listener(MeshSetup& s);
  void adopt_recovery_addresses(const MeshSetup& s);
  void check_compression_keys(const MeshSetup& s);
  // The agreement of agree and shrink; `session` keeps the coordinator's
  // connections for a shrink's exchange (null: closed at the end).
  Agreement run_agreement(std::uint32_t op, std::int32_t flag,
                          std::unique_ptr<RecoveryExchange>* session);
  // The heartbeat thread's part of the recovery channel: answers ranks
  // that ask for a decision this rank holds (process_recovery.cpp).
  void answer_recovery() noexcept;
  // One attempt of shrink: the communicator of the agreed members.
  std::unique_ptr<ProcessCommunicator> shrink_to(RecoveryExchange& ex);
  // Maps the peers' windows when every rank has one and every link stays
  // inside the node; collective (one exchange round when on one node).
  void share_node_windows(Exchange& exchange, const MeshSetup& s);
  void map_node_windows(Exchange& exchange, const std::vector<wia_ipc_handle_t>& handles,
                        bool every_rank_has_one);

  // The cost model every rank builds alike (process_links.cpp).
  void build_link_model(const MeshSetup& s, std::chrono::milliseconds timeout);
  // Figures of each link's transport; fills link_transport_.
  tuner::LinkModel model_from_transports(const MeshSetup& s, double& message_overhead_us,
                                         double& inter_gbps);
  // Replaces them with tuner.link_file's when every rank read the same
  // figures; true when it did.
  bool adopt_measured_links(const MeshSetup& s, tuner::LinkModel& model, double& inter_gbps);
  // Times the link between the first ranks of nodes 0 and 1; every rank
  // adopts the result for every link between nodes.
  void probe_inter_node_link(tuner::LinkModel& model, double& inter_gbps,
                             std::chrono::milliseconds timeout);

  // The control channel and failure (process_control.cpp).
  void post_control_recv(Peer& peer);
  // Makes the communicator unusable and tells the peers why.
  void break_communicator(wia_status_t status, const std::string& reason);
  // An operation's failure text, led by a peer's abort reason when the
  // control channel holds one (a connection failure is often its echo).
  std::string with_peer_reason(RunningOperation& r, wia_status_t status, std::string error);
  void close_all() noexcept;
  // Heartbeats (process_control.cpp, docs/fault-tolerance.md): a thread
  // that, while no operation uses the connections, polls the control
  // channel, sends this rank's heartbeats to its ring neighbours and
  // breaks the communicator when a peer failed; an operation that runs
  // does the same in its own polls.
  void start_heartbeat();
  void stop_heartbeat() noexcept;
  void heartbeat_tick();
  // Held while this rank's transports are used on the connections (an
  // operation's begin and proceed, the heartbeat thread, breaking):
  // entries on one connection must not run on two threads at once
  // (docs/provider-abi.md 1.6). Not taken when heartbeats are off.
  std::unique_lock<std::recursive_mutex> wire_lock() {
    return heartbeat_ms_ ? std::unique_lock<std::recursive_mutex>(wire_mu_)
                         : std::unique_lock<std::recursive_mutex>();
  }

  // Ordering and posting (process_order.cpp).
  // The host function a StreamTask is posted as.
  static void stream_task(void* arg);
  // Queues operation `call` (or a send/receive with `peer` >= 0) on
  // `stream` as a StreamTask.
  void post_stream_task(Call call, wia_stream_s* stream, int peer, bool is_send);
  void run_stream_task(StreamTask& task);
  // The posting-thread path (see the file comment); false when `call`
  // must go through the stream.
  bool try_post_inline(Call& call, wia_stream_s* stream, int peer, bool is_send);
  // Runs operation `seq`, claimed by the posting thread and begun as `r`
  // (null: begin failed with `st`, `error`), until done or `post_progress_`
  // passes, then hands it to the stream; releases the turn when done.
  // `now`: when the caller last read the clock (the epoch: it did not).
  void run_claimed(std::uint64_t seq, std::unique_ptr<RunningOperation> r, wia_status_t st,
                   std::string& error, wia_stream_s* stream, int peer, bool is_send,
                   std::chrono::steady_clock::time_point now, std::chrono::milliseconds timeout);
  // Operation `seq` is over: the next one may run.
  void release_turn(std::uint64_t seq);
  // Runs operation `seq` (`call`, or a send/receive with `peer` >= 0) once
  // every earlier one has run. Returns the status; on failure the
  // communicator is broken.
  wia_status_t execute(std::uint64_t seq, Call& call, int peer, bool is_send, std::string& error);

  // Running a collective (process_exec.cpp).
  // Everything a collective needs to run, its engine object started; null
  // on failure (status and error set, communicator broken).
  std::unique_ptr<RunningOperation> begin(std::uint64_t seq, Call& call,
                                          std::chrono::steady_clock::time_point deadline,
                                          wia_status_t& status, std::string& error);
  // begin's steps.
  // An in-place call runs the in-place plan when its messages match the
  // out-of-place one's, else on a snapshot of its input.
  void prepare_in_place(const Call& call, std::shared_ptr<const engine::ExecPlan>& plan,
                        engine::RankBuffers& b);
  void reserve_scratch_and_staging(const engine::ExecPlan& plan, engine::RankBuffers& b);
  void fill_descriptor(const Call& call, const engine::ExecPlan& plan, engine::Descriptor& desc);
  void remember_window_call(const Call& call, const engine::Descriptor& desc, double estimate);
  // Starts r's engine object for its mode (r.plan, r.buffers, r.descriptor set).
  void start_engine(RunningOperation& r, const Call& call);
  // The same for a repeat of the last small all-reduce through the
  // windows (window_repeat_): the call, the plan and the descriptor are
  // those of last time, so only the sequence numbers change.
  std::unique_ptr<RunningOperation> begin_window_repeat(
      std::uint64_t seq, const Call& call, std::chrono::steady_clock::time_point deadline,
      wia_status_t& status, std::string& error);
  bool repeats_window_call(const Call& call) const;
  // Records what wia_get_selected_algorithm reports (when it changed).
  void note_selected(coll::Algorithm algorithm, coll::Collective collective, double estimate);
  // Drives it until done, failed or `give_up_at` (WIA_IN_PROGRESS).
  wia_status_t proceed(RunningOperation& r, std::chrono::steady_clock::time_point give_up_at,
                       std::string& error);
  std::unique_ptr<RunningOperation> take_spare_operation();
  void recycle(std::unique_ptr<RunningOperation> r);
  // Whether `call`, run as `plan`, takes the one-shot fast path
  // (engine/eager_allreduce.hpp).
  bool eager(const Call& call, const engine::ExecPlan& plan) const;
  // Whether `call`, run as `plan`, runs through the node-shared windows
  // (engine/window_allreduce.hpp).
  bool through_windows(const Call& call, const engine::ExecPlan& plan) const;
  // Whether the windows would read `call`'s input in place (a libwia
  // allocation, collectives.node_window_zero_copy_min_bytes): the cost
  // of its window path, and so part of the plan memo's key.
  bool window_reads_in_place(const Call& call) const;
  // RunningOperation's links: this communicator's, connections refreshed.
  void fill_links(std::vector<engine::NetLink>& links) const;

  // Plans (process_plan.cpp).
  std::shared_ptr<const engine::ExecPlan> plan_for(const Call& call, bool in_place,
                                                   double* estimate, std::string* reason);
  // Whether in-place plan `ip` sends the same messages as `plan`.
  bool same_messages_as(const std::shared_ptr<const engine::ExecPlan>& ip,
                        const std::shared_ptr<const engine::ExecPlan>& plan);

  // Point to point (process_p2p.cpp).
  void post_p2p(int rank, int peer, bool is_send, void* buf, std::uint64_t count,
                wia_datatype_t dtype, std::uint32_t timeout_ms, wia_stream_s* stream,
                std::uint32_t tag = 0, const char* name = nullptr, const char* path = nullptr,
                wia_mr_t mr = nullptr);
  // A send or receive; it cannot fail: posting is retried, bounded, in
  // proceed_p2p.
  std::unique_ptr<RunningOperation> begin_p2p(std::uint64_t seq, const Call& call, int peer,
                                              bool is_send,
                                              std::chrono::steady_clock::time_point deadline);
  wia_status_t proceed_p2p(RunningOperation& r, std::chrono::steady_clock::time_point give_up_at,
                           std::string& error);

  ProcessLayout layout_;
  wia_device_t device_;
  // The device provider's entries and context, for the posting thread's
  // stream query (try_post_inline, try_post_repeat).
  const wia_device_ops_v1_t* device_ops_ = nullptr;
  void* device_ctx_ = nullptr;
  std::vector<Peer> peers_;
  std::vector<std::string> link_transport_;  // [a * size + b]: every link's transport
  std::vector<ForcedTransport> forced_transports_;
  bool oversubscribed_ = false;
  // Measure the link between nodes at setup (WIA_PROBE_LINKS=0 skips it).
  bool probe_inter_node_ = true;
  std::uint32_t default_timeout_ms_ = 0;
  std::chrono::microseconds post_progress_{0};
  std::uint64_t post_progress_max_bytes_ = 0;
  std::uint64_t one_shot_max_bytes_ = 0;     // collectives.one_shot_max_bytes
  std::uint64_t node_window_max_bytes_ = 0;  // collectives.node_window_max_bytes
  // collectives.node_window_one_shot_peer_bytes
  std::uint64_t node_window_one_shot_peer_bytes_ = 0;
  std::uint64_t node_window_zero_copy_min_bytes_ =
      0;  // collectives.node_window_zero_copy_min_bytes
  // Every rank's window, when all ranks share one node (else nullptr).
  std::unique_ptr<NodeWindowSet> windows_;

  std::mutex mu_;  // plans, selector; next_seq_ is only changed under it
  std::atomic<std::uint64_t> next_seq_{0};
  engine::PlanCache plans_;
  // The last plans chosen, by call: a repeated call (the common case)
  // skips the rules, the cost model and the cache key's formatting.
  struct PlanMemo {
    coll::Collective collective{};
    coll::Algorithm requested{};
    wia_reduce_op_t op{};
    wia_datatype_t dtype{};
    std::uint64_t count = 0;
    int root = 0;
    std::uint32_t num_chunks = 0;
    bool in_place = false;
    bool window_reads_in_place = false;
    std::shared_ptr<const engine::ExecPlan> plan;
    double estimate = 0;
    std::string reason;
  };
  std::array<PlanMemo, 8> plan_memo_;
  std::unique_ptr<RunningOperation> spare_operation_;  // take_spare_operation()
  // The last one-shot all-reduce that ran through the windows: a call
  // with the same arguments skips the plan lookup and the descriptor's
  // construction (an 8-byte all-reduce is a few hundred ns).
  struct WindowRepeat {
    bool valid = false;
    Call key;  // buffers unused
    bool reads_in_place = false;  // window_reads_in_place(key), for the estimate
    engine::Descriptor descriptor;
    double estimate = 0;
  };
  WindowRepeat window_repeat_;
  // Whether the last in-place plan sends the same messages as its
  // out-of-place twin (holding both keeps their addresses unique).
  struct SameMessagesMemo {
    std::shared_ptr<const engine::ExecPlan> in_place, out_of_place;
    bool same = false;
  };
  SameMessagesMemo same_messages_memo_;
  std::size_t plan_memo_next_ = 0;
  std::unique_ptr<tuner::Selector> selector_;
  // All-reduces through node-shared windows are costed with this model of
  // threads copying (build_link_model); none without windows.
  std::optional<tuner::LinkModel> window_model_;
  std::optional<selector::LinkCompress> link_compress_;  // choose_link_transports
  std::string compression_keys_differ_;                  // check_compression_keys
  // The node grouping when the communicator spans nodes (hierarchical
  // algorithms and the two-level link model use it), else nullptr.
  std::shared_ptr<const coll::RankGroups> groups_;
  std::atomic<std::uint64_t> executed_{0};  // collectives run (in order)
  // Collectives (not point to point, which only some ranks see): begun
  // (in order, by whoever runs one), completed, and the one running now
  // (-1 none); what a descriptor and a peer's "where are you?" use.
  std::uint64_t collectives_begun_ = 0;
  std::atomic<std::uint64_t> collectives_done_{0};
  std::atomic<std::int64_t> running_{-1};
  engine::ProgressSignal order_signal_;
  // Operations queued on streams (not those the posting thread finishes
  // itself): destroy waits for them.
  std::atomic<int> in_flight_{0};
  std::atomic<int> large_in_flight_{0};  // of those, not small collectives
  // Used by one collective at a time.
  std::vector<char, PageAligned<char>> staging_, scratch_, snapshot_;

  mutable std::mutex err_mu_;
  std::atomic<bool> broken_{false};
  wia_status_t error_ = WIA_SUCCESS;
  std::string error_message_;
  std::vector<int> failed_ranks_;  // sorted, under err_mu_
  std::atomic<bool> abort_requested_{false};
  // collectives.heartbeat_ms and heartbeat_timeout_ms (0: no heartbeats).
  std::uint32_t heartbeat_ms_ = 0;
  std::uint32_t heartbeat_timeout_ms_ = 0;
  std::recursive_mutex wire_mu_;  // wire_lock()
  // The first failure the control channel reported (a peer's abort, a
  // lost connection, a silent peer), under wire_mu_: whoever polls next
  // (an operation or the heartbeat thread) reports it again.
  std::string control_failure_;
  bool control_failure_told_ = false;  // it came in a peer's abort message
  std::unique_ptr<Heartbeat> heartbeat_;
  // `st`, or WIA_ERROR_ABORTED for a failure after wia_comm_abort.
  wia_status_t unless_aborted(wia_status_t st) const {
    return st != WIA_SUCCESS && (abort_requested_.load() || revoked_.load()) ? WIA_ERROR_ABORTED
                                                                             : st;
  }
  // wia_comm_revoke was called here (revoke_requested_: Control::poll
  // fails the running operation), or here or on a peer (revoked_: every
  // failure is WIA_ERROR_ABORTED).
  std::atomic<bool> revoke_requested_{false};
  std::atomic<bool> revoked_{false};
  std::unique_ptr<Recovery> recovery_;
  // Records that `rank` failed (thread safe; repeats are ignored).
  void note_failed(int rank);
  wia_algorithm_t last_selected_{};

  // The last operations, dumped to flight_dir_ when the communicator breaks.
  FlightRecorder flight_;
  std::string flight_dir_;
  int comm_index_ = 0;  // the n-th process communicator of this process
  std::atomic<std::uint64_t> collectives_posted_{0};
  CommProfiler profiler_;  // wia_enable_comm_profiling

 public:
  CommProfiler* profiler() override { return &profiler_; }
  // The slowest link's GB/s in the cost model (the bound of profiling's
  // bandwidth utilization).
  double slowest_link_gbps();
  // A copy of the cost model the tuner selects with (profiling's
  // suggestions); none before the links are set up.
  std::optional<tuner::LinkModel> cost_model();
  // Every such link, set when the links are set up (empty when none):
  // profiling's transport suggestion costs both.
  const std::vector<ForcedTransport>& forced_transports() const { return forced_transports_; }
  // The compress key of the selector rule that decides this communicator's
  // links between nodes (none when that rule has none, or on one node).
  const std::optional<selector::LinkCompress>& link_compress() const { return link_compress_; }
  // Why compressed calls cannot run here (the ranks' compression.* keys
  // differ), or "".
  const std::string& compression_keys_differ() const { return compression_keys_differ_; }

 private:
  // Records operation `seq` as posted.
  // `stream`: what it was posted on (nullptr: none), the timeline's track.
  void record_posted(std::uint64_t seq, const Call& call, int peer, bool is_send,
                     const wia_stream_s* stream) noexcept;

  // The profile's `transport` of a collective run as `plan` through
  // `windows` or links ("shm", "shm+tcp", "windows", "host" without peers),
  // interned; remembered for the plan last asked about (held, so its
  // address is not reused by another).
  const char* transports_of(const std::shared_ptr<const engine::ExecPlan>& plan, bool windows);
  // The ranks this rank's part of `plan` exchanges with ("1,3", sorted;
  // every other rank through the windows), in storage that lives as long
  // as the process: the timeline's `peers`. Cached with transports_of.
  const char* peers_of(const std::shared_ptr<const engine::ExecPlan>& plan, bool windows);
  // Interned transport name of each peer's link, and of each set of the
  // distinct ones (bit i: the i-th distinct one in peer order); filled on
  // first use.
  void name_link_transports();
  // The interned transport of the link to `peer` ("host" for this rank).
  const char* transport_to_peer(int peer) noexcept;
  std::once_flag link_transports_named_;
  std::vector<const char*> transport_of_peer_;
  std::vector<std::uint32_t> transport_bit_of_peer_;
  std::vector<const char*> transport_of_set_;
  std::shared_ptr<const engine::ExecPlan> transport_plan_, peers_plan_;
  const char* transport_plan_name_ = nullptr;
  const char* peers_plan_list_ = nullptr;
  const char* every_other_rank_ = nullptr;  // peers_of's answer for the windows
  // What the collective running now used, for release_turn's profiler call.
  const char* op_transport_ = nullptr;
  const char* op_peers_ = nullptr;
};

}  // namespace wia::comm
