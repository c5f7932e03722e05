// leasehold/sim: lockd in the simulated world: the real LockService (lockd/service.hpp) on the
// world's ports. Its DatagramPort sends through the simulated network (a worker's address is
// 127.0.0.1:(1000 + worker index)); its DurabilityPort is the simulated disk; time is `now_ns`
// on lockd's own clock. A crash drops the LockNode (the in-memory core); a restart builds a new
// one from what the disk made durable, as a restarted leasehold-lockd loads its store.
#pragma once

#include "leasehold/lease/lease_table.hpp"
#include "leasehold/sim/disk.hpp"
#include "leasehold/sim/world.hpp"
#include "leasehold/wire/auth.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace leasehold::sim {

/// What lockd's FIFOs of waiters did in one step (LockService's counters, as differences).
struct WaiterCounts {
  std::uint64_t queued = 0;                     ///< waits_queued
  std::uint64_t granted = 0;                    ///< waiters_granted
  std::uint64_t granted_on_release = 0;         ///< of those, in the step of a Release datagram
  std::uint64_t granted_on_kill_confirmed = 0;  ///< of those, in the step of a KillConfirmed datagram
  std::uint64_t lapsed = 0;                     ///< waiters_lapsed
  bool any() const noexcept { return queued + granted + lapsed != 0; }
};

class LockdEnv {
 public:
  virtual ~LockdEnv() = default;
  /// A datagram to the supervisor of worker `worker` (index).
  virtual void send_to_worker(std::uint32_t worker, std::span<const std::uint8_t> bytes) = 0;
  /// A step of lockd changed the counts of its waiters by `delta` (every incarnation and
  /// replica reports its own, so the sum covers the run).
  virtual void waiters_counted(const WaiterCounts& delta) { (void)delta; }
};

/// The address worker `worker` (index) sends from and lockd answers to.
SocketAddress worker_address(std::uint32_t worker);

class LockdNode {
 public:
  /// Builds a new incarnation from `disk`'s durable content (one store open) at `now_ns`
  /// (lockd's clock). Throws std::runtime_error if the store does not rebuild a table.
  LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env, SimDisk& disk,
            std::int64_t now_ns);
  /// lockd on etcd (sim/cluster.hpp): one replica's service at `now_ns` - a leader's, on the
  /// table `restored` loaded from the store and over `store` (its guarded writes), or a
  /// follower's (an empty table and a store that takes nothing; set_not_leader). `instance`
  /// tells the replica's incarnations apart (lockd's instance id).
  LockdNode(const SimConfig& cfg, const wire::WireKey& cluster_key, LockdEnv& env, lockd::RestoredTable restored,
            lockd::DurabilityPort& store, std::int64_t now_ns, std::uint64_t instance);
  ~LockdNode();
  /// LockService::set_not_leader: a follower answers every request not_leader naming `hint`.
  void set_not_leader(const std::string& hint);
  /// LockService::set_loading: a won election whose table is loading.
  void set_loading(bool loading);
  LockdNode(const LockdNode&) = delete;
  LockdNode& operator=(const LockdNode&) = delete;

  /// A datagram from worker `from` (index).
  void on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns);
  /// LockService::tick: verdicts, expiry, submission; returns the next time (lockd's clock) it
  /// has time-driven work.
  std::int64_t tick(std::int64_t now_ns);

  const LeaseTable& table() const noexcept;
  /// The store failed a change (SimDisk::fail): lockd has stopped answering and must restart.
  bool failed() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold::sim
