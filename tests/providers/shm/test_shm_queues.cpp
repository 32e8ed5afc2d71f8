// SPDX-License-Identifier: Apache-2.0
// The shm provider's allocation-free queues (providers/shm/shm_queues.hpp)
// against std::map<tag, std::deque>: per-tag FIFO order, removal of
// emptied tags (backward-shift deletion) under probe collisions, growth
// with entries in place, and drain.
#include <doctest/doctest.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "../../../providers/shm/shm_queues.hpp"

namespace {

struct Node {
  Node* qnext = nullptr;
  std::uint64_t tag = 0;
  int id = 0;
};

using Reference = std::map<std::uint64_t, std::deque<Node*>>;

// Every tag of the reference answers the same front in the table, and
// tags the reference lacks answer nothing.
void check_same(const wia::shm::TagQueues<Node>& q, const Reference& ref,
                const std::vector<std::uint64_t>& all_tags) {
  CHECK(q.tags() == ref.size());
  CHECK(q.empty() == ref.empty());
  for (std::uint64_t tag : all_tags) {
    auto it = ref.find(tag);
    Node* want = it == ref.end() ? nullptr : it->second.front();
    REQUIRE(q.front(tag) == want);
  }
}

}  // namespace

TEST_CASE("shm queues: Fifo keeps insertion order and can be refilled after emptying") {
  wia::shm::Fifo<Node> f;
  Node n[3];
  CHECK(f.empty());
  for (Node& x : n) f.push_back(&x);
  CHECK(f.pop_front() == &n[0]);
  f.push_back(&n[0]);
  CHECK(f.pop_front() == &n[1]);
  CHECK(f.pop_front() == &n[2]);
  CHECK(f.pop_front() == &n[0]);
  CHECK(f.empty());
  f.push_back(&n[2]);
  CHECK(f.front() == &n[2]);
  CHECK(n[2].qnext == nullptr);
}

TEST_CASE("shm queues: TagQueues matches a map of deques under random push/pop") {
  // Tags chosen so that many share a home slot: multiples of a large power
  // of two differ only in high bits, plus small tags, plus random ones.
  std::vector<std::uint64_t> tags;
  for (std::uint64_t i = 0; i < 24; ++i) tags.push_back(i);
  for (std::uint64_t i = 1; i < 24; ++i) tags.push_back(i << 32);
  for (std::uint64_t i = 1; i < 12; ++i) tags.push_back(i << 60);
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 16; ++i) tags.push_back(rng());

  wia::shm::TagQueues<Node> q;
  Reference ref;
  std::vector<std::unique_ptr<Node>> nodes;
  int next_id = 0;
  for (int step = 0; step < 200000; ++step) {
    const std::uint64_t tag = tags[rng() % tags.size()];
    // Phases that fill the table (growth, long probe runs) and drain it
    // (every tag's slot freed, runs shifted back).
    const bool filling = (step / 5000) % 2 == 0;
    if (rng() % 100 < (filling ? 65u : 35u)) {
      nodes.push_back(std::make_unique<Node>());
      Node* n = nodes.back().get();
      n->tag = tag;
      n->id = next_id++;
      REQUIRE(q.push(tag, n));
      ref[tag].push_back(n);
    } else {
      Node* got = q.pop(tag);
      auto it = ref.find(tag);
      if (it == ref.end()) {
        REQUIRE(got == nullptr);
      } else {
        REQUIRE(got == it->second.front());
        REQUIRE(got->tag == tag);
        it->second.pop_front();
        if (it->second.empty()) ref.erase(it);
      }
    }
    if (step % 997 == 0) check_same(q, ref, tags);
  }
  check_same(q, ref, tags);
  // Drain visits each remaining entry once and leaves the table empty.
  std::size_t remaining = 0;
  for (const auto& [tag, d] : ref) remaining += d.size();
  std::size_t visited = 0;
  q.drain([&](Node*) { ++visited; });
  CHECK(visited == remaining);
  CHECK(q.empty());
  CHECK(q.front(tags[0]) == nullptr);
}

TEST_CASE("shm queues: a tag whose queue empties is gone, and its neighbours stay reachable") {
  wia::shm::TagQueues<Node> q;
  // 64 tags in a table that grows to 128 slots: with half the slots taken
  // some probe runs are long, and removing from the middle of a run must
  // keep the rest findable.
  std::vector<Node> n(64);
  for (std::size_t i = 0; i < n.size(); ++i) {
    n[i].tag = i * 0x100000000ull;
    REQUIRE(q.push(n[i].tag, &n[i]));
  }
  for (std::size_t i = 0; i < n.size(); i += 2) REQUIRE(q.pop(n[i].tag) == &n[i]);
  CHECK(q.tags() == n.size() / 2);
  for (std::size_t i = 0; i < n.size(); ++i) {
    INFO("tag index " << i);
    CHECK(q.front(n[i].tag) == (i % 2 == 0 ? nullptr : &n[i]));
  }
  // Re-adding a removed tag starts a fresh queue.
  REQUIRE(q.push(n[0].tag, &n[0]));
  CHECK(q.pop(n[0].tag) == &n[0]);
  CHECK(q.pop(n[0].tag) == nullptr);
}
