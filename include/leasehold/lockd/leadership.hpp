// leasehold/lockd: leader election through an etcd lease, and the leader's self-fencing: the
// production driver of LeadershipCore (leadership_core.hpp, where the election and the fence
// are explained), on a thread of its own that makes the core's calls with etcd::Client.
//
// The leadership thread does all etcd I/O here; the io thread reads view() and serving(),
// which take a mutex (a few per loop turn, never per datagram on the refresh path: the daemon
// reads them once per turn).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/leadership_core.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace leasehold::etcd {
class Client;
}

namespace leasehold::lockd {

class Leadership {
 public:
  using View = LeadershipView;
  using StepDown = lockd::StepDown;

  /// Starts the leadership thread (campaigning at once). `wake` runs on that thread after every
  /// change of the view (the daemon passes EventLoop::wake). Refuses (invalid_argument) what
  /// validate() refuses. An empty cfg.election_key is the shard's (election_key(shard_prefix)).
  static Result<std::unique_ptr<Leadership>> start(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg,
                                                   std::function<void()> wake);
  /// Stops the thread; a leader revokes its lease so that another lockd takes over at once.
  ~Leadership();
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  View view() const { return core_->view(); }
  /// LeadershipCore::serving.
  bool serving(std::int64_t revision, std::int64_t now_ns) const { return core_->serving(revision, now_ns); }
  /// LeadershipCore::step_down.
  void step_down(std::int64_t revision, StepDown why) { core_->step_down(revision, why); }
  /// A key rotation (SIGHUP): LeadershipCore::set_cluster_keys.
  void set_cluster_keys(std::string value) { core_->set_cluster_keys(std::move(value)); }
  /// This lockd's token signing key record: LeadershipCore::set_signing_key.
  void set_signing_key(std::string value) { core_->set_signing_key(std::move(value)); }
  /// The etcd lease TTL in force (s).
  std::int64_t lease_s() const noexcept { return core_->config().lease_s; }
  const LeadershipConfig& config() const noexcept { return core_->config(); }

 private:
  Leadership(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg, std::function<void()> wake);
  /// The thread: makes the core's calls until it is done.
  void run();

  std::shared_ptr<etcd::Client> client_;
  std::mutex mu_;               ///< with cv_: a wait of the core, ended early by its interrupt
  std::condition_variable cv_;
  std::unique_ptr<LeadershipCore> core_;
  std::thread thread_;
};

}  // namespace leasehold::lockd
