// SPDX-License-Identifier: Apache-2.0
#include "flight_analysis.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace wia_info {
namespace {
namespace fs = std::filesystem;

struct Entry {
  std::uint64_t seq = 0;
  std::int64_t coll = -1;
  std::string op, dtype, state;
  std::uint64_t count = 0;
  int root = -1, peer = -1;
};

struct RankDump {
  std::string file;
  int rank = 0, nranks = 0;
  std::string host, status, reason;
  std::uint64_t collectives_posted = 0;
  std::vector<Entry> entries;
};

std::string describe(const Entry& e) {
  std::string s = fmt::format("{} of {} x {}", e.op, e.count, e.dtype);
  if (e.op == "broadcast" || e.op == "reduce") s += fmt::format(" (root {})", e.root);
  if (e.peer >= 0) s += fmt::format(" with rank {}", e.peer);
  return s;
}

std::string list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

RankDump read_dump(const fs::path& path) {
  const YAML::Node y = YAML::LoadFile(path.string());
  RankDump d;
  d.file = path.filename().string();
  d.rank = y["rank"].as<int>();
  d.nranks = y["nranks"].as<int>();
  d.host = y["host"].as<std::string>("");
  d.status = y["status"].as<std::string>("");
  d.reason = y["reason"].as<std::string>("");
  d.collectives_posted = y["collectives_posted"].as<std::uint64_t>(0);
  for (const auto& n : y["entries"]) {
    Entry e;
    e.seq = n["seq"].as<std::uint64_t>();
    e.coll = n["coll"].as<std::int64_t>(-1);
    e.op = n["op"].as<std::string>();
    e.count = n["count"].as<std::uint64_t>();
    e.dtype = n["dtype"].as<std::string>();
    e.root = n["root"].as<int>(-1);
    e.peer = n["peer"].as<int>(-1);
    e.state = n["state"].as<std::string>();
    d.entries.push_back(std::move(e));
  }
  return d;
}

// The first collective this rank has not finished (collectives_posted when
// it finished every one it posted).
std::uint64_t first_open_collective(const RankDump& d) {
  for (const auto& e : d.entries)
    if (e.coll >= 0 && e.state != "done") return static_cast<std::uint64_t>(e.coll);
  return d.collectives_posted;
}

const Entry* collective(const RankDump& d, std::uint64_t c) {
  for (const auto& e : d.entries)
    if (e.coll == static_cast<std::int64_t>(c)) return &e;
  return nullptr;
}

void analyse_comm(int comm, const std::map<int, RankDump>& dumps) {
  const int nranks = dumps.begin()->second.nranks;
  fmt::print("communicator {} ({} ranks, {} dumps)\n", comm, nranks, dumps.size());
  std::vector<int> missing;
  for (int r = 0; r < nranks; ++r)
    if (!dumps.count(r)) missing.push_back(r);
  std::uint64_t stuck = UINT64_MAX;
  for (const auto& [r, d] : dumps) stuck = std::min(stuck, first_open_collective(d));
  std::vector<int> joined, absent;
  std::map<std::string, std::vector<int>> forms;  // how each joined rank called it
  for (const auto& [r, d] : dumps) {
    if (d.collectives_posted > stuck) {
      joined.push_back(r);
      if (const Entry* e = collective(d, stuck)) forms[describe(*e)].push_back(r);
    } else {
      absent.push_back(r);
    }
  }
  if (joined.empty()) {
    fmt::print("  every rank that left a dump finished all {} collectives it posted\n", stuck);
  } else {
    const std::string what = forms.empty() ? std::string("?") : forms.begin()->first;
    fmt::print("  the job stopped at collective #{} ({}): posted by rank{} {}\n", stuck, what,
               joined.size() > 1 ? "s" : "", list(joined));
    for (int r : absent) {
      const RankDump& d = dumps.at(r);
      std::string last = "nothing";
      for (auto it = d.entries.rbegin(); it != d.entries.rend(); ++it) {
        last = fmt::format("{} {}, {}", it->coll >= 0 ? "#" + std::to_string(it->coll) : "p2p",
                           describe(*it), it->state);
        break;
      }
      fmt::print("  rank {} never joined it (its last operation: {})\n", r, last);
    }
    if (forms.size() > 1) {
      fmt::print("  the ranks disagree on it:\n");
      for (const auto& [form, ranks] : forms) fmt::print("    {}: rank(s) {}\n", form, list(ranks));
    }
  }
  if (!missing.empty())
    fmt::print("  no dump from rank{} {} (dead, or its communicator did not fail)\n",
               missing.size() > 1 ? "s" : "", list(missing));
  for (const auto& [r, d] : dumps)
    if (!d.reason.empty())
      fmt::print("  rank {} ({}): {}: {}\n", r, d.host, d.status, d.reason.substr(0, 300));
}

}  // namespace

int analyse_flight(const std::string& dir) {
  std::map<int, std::map<int, RankDump>> comms;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    int comm = 0, rank = 0;
    if (std::sscanf(name.c_str(), "wia-flight-comm%d-rank%d.yaml", &comm, &rank) != 2 ||
        name.size() < 5 || name.substr(name.size() - 5) != ".yaml")
      continue;
    try {
      RankDump d = read_dump(f.path());
      comms[comm][d.rank] = std::move(d);
    } catch (const YAML::Exception& e) {
      std::fprintf(stderr, "wia-info: %s: not a flight recorder dump: %s\n", f.path().c_str(),
                   e.what());
      return 1;
    }
  }
  if (ec) {
    std::fprintf(stderr, "wia-info: --analyse %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  if (comms.empty()) {
    std::fprintf(stderr,
                 "wia-info: --analyse %s: no wia-flight-comm*-rank*.yaml files (set "
                 "flight_recorder.dir, WIA_FLIGHT_RECORDER_DIR, before the job runs)\n",
                 dir.c_str());
    return 1;
  }
  for (const auto& [comm, dumps] : comms) analyse_comm(comm, dumps);
  return 0;
}

}  // namespace wia_info
