// SPDX-License-Identifier: Apache-2.0
// Private to the process communicator's .cpp files (process_*.cpp): the
// records ranks exchange at set-up, the state connect_mesh's steps share,
// the control channel's class, and the two per-operation structs (the
// operation being run and the task a stream runs).
#pragma once

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bootstrap/socket.hpp"
#include "comm/process_communicator.hpp"
#include "engine/eager_allreduce.hpp"
#include "selector/selector.hpp"

namespace wia {
class Config;
class Provider;
}  // namespace wia

namespace wia::comm {

using Clock = std::chrono::steady_clock;

inline void sleep_us(long us) {
  timespec ts{0, us * 1000};
  nanosleep(&ts, nullptr);
}

// What each rank publishes at setup: one connection handle per transport
// it listens on. Fixed size, so every rank's blob has the same length.
inline constexpr std::uint32_t kRecordMagic = 0x57494152;  // "WIAR"
inline constexpr std::size_t kMaxTransports = 4;
struct HandleSlot {
  char name[16];
  std::uint32_t endpoint_flags;  // WIA_TRANSPORT_FLAG_* of the endpoint listened on
  std::uint8_t handle[WIA_TRANSPORT_HANDLE_SIZE];
};
inline constexpr int kCpuWords = 16;  // CPUs 0 .. 1023

struct RankRecord {
  std::uint32_t magic;
  std::uint32_t count;
  char host[64];  // node name, for selector groups
  HandleSlot slots[kMaxTransports];
  // The measured link figures this rank read (tuner.link_file), as a
  // digest; 0 = none. Every rank uses them only when all digests agree.
  std::uint64_t link_file_digest;
  // This rank's node-shared window (all ranks on one node), if it has one,
  // and the settings every rank must share to use the windows: the bank
  // size (the layout of every window) and the limits that decide which
  // calls take them.
  std::uint32_t has_window;
  wia_ipc_handle_t window;
  std::uint64_t window_chunk_bytes;
  std::uint64_t window_max_bytes;
  std::uint64_t one_shot_max_bytes;
  std::uint64_t window_one_shot_peer_bytes;
  // The CPUs this process may run on (sched_getaffinity: taskset, cgroup
  // cpusets, a launcher's binding), bit c = CPU c; all zero if unknown.
  std::uint64_t cpus[kCpuWords];
  // The recovery channel (process_recovery.cpp): this rank's listening
  // address (a sockaddr of recovery_len bytes) and a random word; the
  // channel's token mixes every rank's, so only members know it.
  std::uint32_t recovery_len;
  std::uint8_t recovery_addr[128];
  std::uint64_t recovery_nonce;
  // The compression.* keys, which decide what collectives a compressed
  // call posts: every rank must hold the same (check_compression_keys).
  char compression_keys[192];
};

// Measured links for a communicator of `nranks` ranks: the file of config
// key tuner.link_file when it has exactly one device per rank (rank r on
// device r, as wia-bw --procs writes it).
struct MeasuredLinks {
  std::string path;  // "" = key not set
  std::optional<tuner::LinkModel> model;
  std::uint64_t digest = 0;  // of the figures; 0 = no model
  std::string why_not;       // when the key is set but no model
  bool bad_file = false;     // why_not is a read or format error
};
MeasuredLinks read_measured_links(const Config& config, int nranks);  // process_links.cpp

// This rank's node: how many ranks it has, and how many CPUs they may run
// on together (0: unknown). process_mesh.cpp.
std::pair<int, int> node_ranks_and_cpus(const std::vector<RankRecord>& records,
                                        const ProcessLayout& layout);

// What connect_mesh's steps gather and hand on (process_mesh.cpp); lives
// for the set-up only.
struct ProcessCommunicator::MeshSetup {
  struct Listening {
    const Provider* provider;
    std::int32_t endpoint;
    wia_listener_t listener;
  };
  std::vector<Listening> listening;
  RankRecord mine{};
  std::vector<RankRecord> records;  // every rank's, once exchanged
  MeasuredLinks measured;           // read before the exchange
  // The transport rules and what each rank can use: choose() below.
  selector::RuleSet rules;
  std::vector<selector::TransportAvailability> avail;

  const Listening* listening_on(const std::string& name) const;
  // The transport of link a -> b: every rank computes the same for every
  // link, from what both ends published.
  selector::Choice choose(const ProcessLayout& layout, int a, int b) const;
  // What the built-in rules alone would choose for that link (no forced
  // transport, no user rule): profiling's transport suggestion.
  selector::Choice choose_by_default(const ProcessLayout& layout, int a, int b) const;
  // Idempotent: set-up closes them once connected, or on failure.
  void close_listeners() noexcept;
};

// The control channel (process_control.cpp): one receive always posted
// per peer, for messages that are not part of any collective.
class ProcessCommunicator::Control final : public engine::ControlChannel {
 public:
  explicit Control(ProcessCommunicator& c) : c_(c) {}
  std::string poll() override;
  // Destroy: tell every peer, then wait (bounded) until each has said
  // goodbye too or is gone, so that no rank closes a connection a peer
  // still reads from (a finalize barrier, as MPI_Finalize has).
  void goodbye(std::chrono::milliseconds bound);
  std::string diagnose(std::uint64_t seq) override;
  // Polled by the heartbeat thread: no operation of this rank is running.
  bool idle_ = false;

 private:
  // One look at every peer's control receive (and the heartbeats):
  // the failure it found, or "".
  std::string poll_once();
  // Sends the heartbeats that are due; the failure of a watched peer
  // silent for longer than heartbeat_timeout_ms, or "".
  std::string heartbeat();
  void progress_send(Peer& p);
  void send(Peer& p, const ControlHeader& h);

  ProcessCommunicator& c_;
};

// The recovery channel (process_recovery.cpp): this rank's listener, every
// rank's address, the token its frames carry, and how many agreements
// and shrinks ran (the epoch, which every rank counts alike).
struct ProcessCommunicator::Recovery {
  bootstrap::Fd listener;
  std::vector<bootstrap::SocketAddress> address;  // by rank
  std::uint64_t token = 0;
  std::uint64_t epoch = 0;
  std::mutex mu;  // one agreement or shrink at a time

  // Decisions outlive their coordinator (process_recovery.cpp): this
  // rank's answers for the agreements it took part in, given to any rank
  // that asks later, and what the listener brought in between agreements.
  struct Decided {
    std::uint64_t epoch = 0;
    std::uint32_t op = 0;
    std::int32_t flag = 0;
    std::vector<std::uint8_t> failed;  // the decision's payload: failed ranks
  };
  struct Arrival {  // accepted, its first frame not read yet
    bootstrap::Fd fd;
    std::chrono::steady_clock::time_point since;
  };
  struct EarlyHello {  // a hello for an agreement this rank has not decided yet
    bootstrap::Fd fd;
    std::uint64_t epoch = 0;
    std::uint32_t op = 0;
    std::int32_t rank = -1, flag = 0;
    std::vector<std::uint8_t> payload;
    std::chrono::steady_clock::time_point since;
  };
  // How long a kept hello may wait for this rank's agreement (its sender
  // gives up at its collectives.timeout_ms).
  std::chrono::milliseconds hello_timeout{0};
  std::mutex answer_mu;  // the members below, and accepting on the listener
  bool coordinating = false;  // then the coordinator accepts, not the heartbeat thread
  std::vector<Decided> decided;  // the newest last, at most kKeptDecisions
  std::vector<Arrival> arrivals;
  std::vector<EarlyHello> early;
};

// The heartbeat thread: heartbeat_tick() every tick until stopped.
struct ProcessCommunicator::Heartbeat {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread thread;
};

// One operation being run by this rank and everything its engine object
// refers to; kept for reuse (take_spare_operation, recycle).
struct ProcessCommunicator::RunningOperation {
  // How it runs: the first three are collectives, the last a send or a
  // receive.
  enum class Mode : std::uint8_t {
    kNetwork,       // the schedule over the connections (`execution`)
    kEager,         // a small all-reduce on the one-shot fast path (`eager`)
    kWindow,        // an all-reduce through the node-shared windows (`window`)
    kPointToPoint,  // one transport request to or from `peer`
  };
  explicit RunningOperation(ProcessCommunicator& c) : control(c) {}
  Mode mode = Mode::kNetwork;
  std::uint64_t seq = 0;    // among all operations of this rank
  std::uint64_t index = 0;  // among collectives: the same on every rank
  std::shared_ptr<const engine::ExecPlan> plan;
  engine::RankBuffers buffers;
  engine::Descriptor descriptor;
  std::vector<engine::NetLink> links;
  Control control;
  engine::NetExecOptions options;
  std::unique_ptr<engine::NetExecution> execution;  // kNetwork
  engine::EagerAllReduce eager;                     // kEager
  engine::WindowAllReduce window;                   // kWindow
  // `window` last ran the current window_repeat_ call and can run it
  // again on new buffers (WindowAllReduce::restart);
  // take_spare_operation clears it.
  bool window_restartable = false;
  // kPointToPoint: the peer, the direction, the bytes, the one request.
  int peer = -1;
  bool is_send = false;
  char* buf = nullptr;
  std::uint64_t bytes = 0;
  std::uint32_t tag = 0;  // the caller's (wia_send_ex), under the point-to-point bit
  wia_mr_t mr = nullptr;  // the buffer's registration (device memory by dma-buf), or none
  wia_request_t request = nullptr;
};

// The work item posted on a user's stream as a host function
// (stream_task): runs operation `seq` when the stream reaches it.
struct ProcessCommunicator::StreamTask {
  ProcessCommunicator* comm;
  std::uint64_t seq;
  Call call;
  wia_stream_s* stream;
  // Point-to-point instead of a collective: peer >= 0.
  int peer = -1;
  bool is_send = false;
  // An operation the posting thread started and handed over.
  std::unique_ptr<RunningOperation> running;
  // Counted in large_in_flight_.
  bool large = false;
};

}  // namespace wia::comm
