// SPDX-License-Identifier: Apache-2.0
// The process-wide table of hosted roots (hosted_roots.hpp).
#include "bootstrap/hosted_roots.hpp"

#include <unistd.h>

#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log.hpp"

namespace wia::bootstrap {

namespace {

constexpr std::string_view kTag = "bootstrap";

class RootRegistry {
 public:
  void add(std::shared_ptr<RootServer> root) {
    std::lock_guard lock(mu_);
    forget_inherited();
    std::erase_if(roots_, [](const auto& r) { return r->finished(); });
    roots_.push_back(std::move(root));
  }
  std::shared_ptr<RootServer> find(const Secret& secret) {
    std::lock_guard lock(mu_);
    forget_inherited();
    for (const auto& r : roots_) {
      if (!r->finished() && r->secret() == secret) return r;
    }
    return nullptr;
  }
  ~RootRegistry() {
    forget_inherited();
    for (const auto& r : roots_) r->stop();
  }
  void stop_all() {
    std::vector<std::shared_ptr<RootServer>> roots;
    {
      std::lock_guard lock(mu_);
      forget_inherited();
      roots = std::move(roots_);
      roots_.clear();
    }
    for (const auto& r : roots) r->stop();
    // The last reference of each joins its thread as it goes, outside mu_.
  }
  void reap_finished() {
    std::vector<std::shared_ptr<RootServer>> finished;
    {
      std::lock_guard lock(mu_);
      forget_inherited();
      for (auto& r : roots_)
        if (r->finished()) finished.push_back(std::move(r));
      std::erase(roots_, nullptr);
    }
    // Joined here, outside mu_, by the last reference (a live Bootstrap
    // that still holds one joins it when it lets go).
  }

 private:
  // Roots inherited through fork() have no thread here: destroying one
  // would join a thread that does not exist. They are leaked on purpose.
  void forget_inherited() {
    if (getpid() == owner_) return;
    new std::vector<std::shared_ptr<RootServer>>(std::move(roots_));
    roots_.clear();
    owner_ = getpid();
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<RootServer>> roots_;
  pid_t owner_ = getpid();
};

RootRegistry& registry() {
  static RootRegistry instance;
  return instance;
}

}  // namespace

std::shared_ptr<RootServer> start_hosted_root(Fd listener, const Secret& secret,
                                              const Options& options, std::uint32_t expected_size) {
  RootServer::Settings settings;
  settings.secret = secret;
  settings.timeout = options.timeout;
  settings.handshake_timeout = options.handshake_timeout;
  settings.expected_size = expected_size;
  auto root = std::make_shared<RootServer>(std::move(listener), settings);
  registry().add(root);
  log::debug(kTag, "root listening on {}", root->address().to_string());
  return root;
}

std::shared_ptr<RootServer> find_hosted_root(const Secret& secret) {
  return registry().find(secret);
}

void stop_hosted_roots() { registry().stop_all(); }

void reap_finished_hosted_roots() { registry().reap_finished(); }

}  // namespace wia::bootstrap
