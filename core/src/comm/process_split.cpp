// SPDX-License-Identifier: Apache-2.0
// What the process communicator derives from itself, collectively: split
// (a new communicator whose set-up exchange runs over this one's links)
// and topology (every rank's device and every link's figures).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "comm/process_internal.hpp"
#include "common/error.hpp"
#include "runtime/objects.hpp"
#include "runtime/runtime.hpp"

namespace wia::comm {

namespace {

// A split's setup exchange runs over the parent's links: an all-gather of
// every parent rank's record, of which the new communicator keeps its
// members'.
class ParentExchange final : public Exchange {
 public:
  ParentExchange(ProcessCommunicator& parent, std::vector<int> members)
      : parent_(parent), members_(std::move(members)) {}
  std::vector<std::uint8_t> all_gather(const std::vector<std::uint8_t>& mine) override {
    ++calls_;
    std::vector<std::uint8_t> all(mine.size() * parent_.size());
    Call c;
    c.collective = coll::Collective::kAllGather;
    c.dtype = WIA_UINT8;
    c.count = mine.size();
    c.buffers.send = const_cast<char*>(reinterpret_cast<const char*>(mine.data()));
    c.buffers.recv = reinterpret_cast<char*>(all.data());
    parent_.run_now(c);
    std::vector<std::uint8_t> kept;
    for (int r : members_)
      kept.insert(kept.end(), all.begin() + r * mine.size(), all.begin() + (r + 1) * mine.size());
    return kept;
  }

  // Every parent rank must run the same exchanges, in the same order and of
  // the same sizes, whatever its color: connect_mesh runs the records
  // exchange (sizeof(RankRecord)) and then, only for a group of more than
  // one rank on one node, the node windows' 1-byte agreement. A rank with
  // no color, alone in its color, or in a group spanning nodes ran one
  // exchange where the others ran two: the others waited for the 1 byte
  // until the collective timed out (wia-soak, seed 2: a split with one
  // NOCOLOR rank). Each rank pads its sequence to the full one.
  void pad() {
    if (calls_ == 0) all_gather(std::vector<std::uint8_t>(sizeof(RankRecord), 0));
    if (calls_ == 1) all_gather({1});
    if (calls_ != kExchanges)
      throw Error(WIA_ERROR_INTERNAL,
                  fmt::format("split: the set-up ran {} exchanges over the parent, {} expected",
                              calls_, kExchanges));
  }

 private:
  static constexpr int kExchanges = 2;
  ProcessCommunicator& parent_;
  std::vector<int> members_;
  int calls_ = 0;
};

}  // namespace

std::unique_ptr<ProcessCommunicator> ProcessCommunicator::split(int color, int key) {
  const int p = size();
  std::vector<std::int32_t> mine = {color, key};
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(p));
  Call c;
  c.collective = coll::Collective::kAllGather;
  c.dtype = WIA_INT32;
  c.count = 2;
  c.buffers.send = reinterpret_cast<char*>(mine.data());
  c.buffers.recv = reinterpret_cast<char*>(all.data());
  run_now(c);
  if (color < 0) {
    // Not a member, but the members' setup exchange runs over every rank.
    ParentExchange(*this, {}).pad();
    return nullptr;
  }
  std::vector<int> members;
  for (int r = 0; r < p; ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  ProcessLayout l;
  l.size = static_cast<int>(members.size());
  std::map<int, int> node_index;  // parent node -> new index, by first appearance
  std::map<int, int> next_local;
  for (int i = 0; i < l.size; ++i) {
    const int r = members[i];
    if (r == layout_.rank) l.rank = i;
    const int node = layout_.node_of_rank[r];
    auto [it, inserted] = node_index.emplace(node, static_cast<int>(node_index.size()));
    l.node_of_rank.push_back(it->second);
    l.local_rank_of_rank.push_back(next_local[node]++);
    if (!layout_.host_of_rank.empty()) l.host_of_rank.push_back(layout_.host_of_rank[r]);
  }
  l.nnodes = static_cast<int>(node_index.size());
  ParentExchange ex(*this, members);
  std::string preferred;
  auto child = std::make_unique<ProcessCommunicator>(
      l, ex, device_, std::chrono::milliseconds(default_timeout_ms_), preferred);
  ex.pad();
  return child;
}

topo::Topology ProcessCommunicator::topology() {
  // What only each rank knows: its device and NUMA node.
  struct Record {
    char device[96];
    std::int32_t numa;
    std::int32_t pad;
  };
  Record mine{};
  const Device& d = Runtime::get().device(device_);
  std::snprintf(mine.device, sizeof(mine.device), "%s%d", d.provider->name().c_str(),
                d.local_index);
  mine.numa = d.props.numa_node;
  std::vector<Record> all(static_cast<std::size_t>(size()));
  Call c;
  c.collective = coll::Collective::kAllGather;
  c.dtype = WIA_UINT8;
  c.count = sizeof(Record);
  c.buffers.send = reinterpret_cast<char*>(&mine);
  c.buffers.recv = reinterpret_cast<char*>(all.data());
  run_now(c);

  const int p = size();
  topo::Topology t;
  for (int node = 0; node < layout_.nnodes; ++node) {
    std::string name = fmt::format("node{}", node);
    for (int r = 0; r < p; ++r)
      if (layout_.node_of_rank[r] == node && !layout_.host_of_rank.empty() &&
          !layout_.host_of_rank[r].empty()) {
        name = layout_.host_of_rank[r];
        break;
      }
    // Host names need not be unique (faked hosts, containers): the node
    // index keeps them apart.
    for (const std::string& other : t.node_names)
      if (other == name) name += fmt::format("#{}", node);
    t.node_names.push_back(name);
  }
  t.resize(p);
  const tuner::LinkModel& m = selector_->model();
  for (int r = 0; r < p; ++r) {
    t.node_of.push_back(layout_.node_of_rank[r]);
    t.device_names.push_back(
        fmt::format("{}/rank{}:{}", t.node_names[layout_.node_of_rank[r]], r,
                    std::string(all[r].device, strnlen(all[r].device, sizeof(all[r].device)))));
    t.numa_of.push_back(all[r].numa);
    t.process_of.push_back(r);
  }
  // Every rank computed every link's transport alike; this rank knows its
  // own links' names, the model has every pair's figures.
  for (int a = 0; a < p; ++a)
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      const bool same_node = layout_.node_of_rank[a] == layout_.node_of_rank[b];
      const std::size_t k = t.at(a, b);
      t.bandwidth[k] = m.bandwidth(a, b);
      t.latency[k] = m.alpha(a, b);
      t.hops[k] = same_node ? 1 : 2;
      const std::string& transport = link_transport_[static_cast<std::size_t>(a) * p + b];
      t.type[k] = t.type_index(transport == "shm" ? "shared_memory" : transport);
      t.p2p[k] = 0;
    }
  return t;
}

}  // namespace wia::comm
