// leasehold/sim: lockd on etcd in the simulated world - several lockd replicas of one shard on a
// simulated etcd.
//
// SimEtcd is etcd as the election and the store see it: keys with create / mod revisions,
// leases with a TTL on etcd's clock (the world's true time) that delete their keys when they
// expire, the election's guarded transactions, and the shard's table (DurableTable) written
// only while the writer's election key is current (EtcdStore's guard).
//
// LockdReplica is one leasehold-lockd of the cluster: the production election (LeadershipCore,
// driven call by call by the world over a simulated path to etcd that delays, loses and cuts)
// and what LockdDaemon serves - a follower answering not_leader with the leader's address, or,
// after a won election and the load of the table, the leader's LockService over a guarded
// store - with the daemon's own rules for taking over, dropping a stale load and fencing
// itself (leadership_core.hpp may_take_over, load_still_leads, fence_of).
#pragma once

#include "leasehold/lockd/leadership_core.hpp"
#include "leasehold/sim/disk.hpp"
#include "leasehold/sim/lockd_node.hpp"
#include "leasehold/sim/world.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

namespace leasehold::sim {

/// The shard's election key in the simulated etcd.
inline constexpr std::string_view kSimElectionKey = "/leasehold/shards/0/election";

class SimEtcd {
 public:
  /// `now` is etcd's clock (the world's true time).
  explicit SimEtcd(std::function<std::int64_t()> now) : now_(std::move(now)) {}
  /// Answers one call of an election (never wait / next_endpoint / done).
  lockd::ElectionReply handle(const lockd::ElectionCall& c);
  /// The election key's create revision now (0: no key): the guard of a leader's writes.
  std::int64_t election_revision();
  /// The value of the election key now ("" = none).
  std::string election_value();
  DurableTable& table() noexcept { return table_; }
  std::uint64_t leases_expired() const noexcept { return leases_expired_; }

 private:
  struct Kv {
    std::string value;
    std::int64_t create_revision = 0;
    std::int64_t mod_revision = 0;
    std::int64_t lease = 0;
  };
  struct Lease {
    std::int64_t ttl_s = 0;
    std::int64_t expiry_ns = 0;
  };
  void expire();
  /// Puts at the current revision (the caller moved it: one revision per transaction).
  void put(const std::string& key, const std::string& value, std::int64_t lease);
  void drop_lease(std::int64_t id);

  std::function<std::int64_t()> now_;
  std::map<std::string, Kv> kv_;
  std::map<std::int64_t, Lease> leases_;
  std::int64_t revision_ = 1;
  std::int64_t next_lease_ = 0x1ea5e;
  std::uint64_t leases_expired_ = 0;
  DurableTable table_;
};

/// The replica's address (its election key value and the not_leader hint): 127.0.0.1:2000+k.
std::string replica_address(std::uint32_t replica);
/// The replica an address names (nullopt: none).
std::optional<std::uint32_t> replica_of(std::string_view address);

class LockdReplica {
 public:
  class Env : public LockdEnv {
   public:
    /// The replica's election core has a new pending call (the world makes it).
    virtual void election_call(std::uint32_t replica) = 0;
    /// The replica won revision `revision` and loads the table (the world reads it from etcd
    /// and calls load_done / load_failed).
    virtual void load_table(std::uint32_t replica, std::int64_t revision) = 0;
    /// The leader's store took a batch (the world carries it to etcd).
    virtual void store_submitted(std::uint32_t replica) = 0;
  };
  /// A new incarnation of replica `index` (lockd's instance id `instance`), a follower
  /// campaigning at once. `now` is the replica's own clock.
  LockdReplica(const SimConfig& cfg, const wire::WireKey& cluster_key, Env& env, SimEtcd& etcd, std::uint32_t index,
               std::uint64_t instance, std::function<std::int64_t()> now);
  ~LockdReplica();
  LockdReplica(const LockdReplica&) = delete;
  LockdReplica& operator=(const LockdReplica&) = delete;

  lockd::LeadershipCore& core() noexcept { return *core_; }
  /// A wait of the core should end now (its io side stepped down): take it and clear it.
  bool take_interrupt() noexcept { return std::exchange(interrupted_, false); }

  /// A datagram from worker `from`, at the replica's `now_ns`: the fence first, as the daemon.
  void on_datagram(std::span<const std::uint8_t> bytes, std::uint32_t from, std::int64_t now_ns);
  /// The daemon's after_iteration: the takeover rules, then the service's tick. Returns the
  /// next time (the replica's clock) it has time-driven work.
  std::int64_t tick(std::int64_t now_ns);
  /// The table of revision `revision` as the load read it (after the world's round trip).
  void load_done(std::int64_t revision, lockd::RestoredTable table);
  void load_failed(std::int64_t revision);

  /// The revision it serves as the leader (0: a follower).
  std::int64_t leading() const noexcept { return leading_; }
  /// The service it runs now (a leader's or a follower's).
  const LockdNode& node() const noexcept { return *node_; }
  /// The leader's store (null for a follower): the world completes its batches.
  const std::shared_ptr<SimDisk>& store() const noexcept { return store_; }
  std::uint32_t index() const noexcept { return index_; }
  /// Takeovers and step-downs of this incarnation (for the world's counts).
  std::uint64_t takeovers() const noexcept { return takeovers_; }

 private:
  bool fenced(std::int64_t now_ns) const;
  void become_follower(std::int64_t now_ns, bool fence);
  void follow(std::int64_t now_ns);

  const SimConfig& cfg_;
  const wire::WireKey& cluster_key_;
  Env& env_;
  SimEtcd& etcd_;
  std::uint32_t index_;
  std::uint64_t instance_;
  std::function<std::int64_t()> now_;
  std::unique_ptr<lockd::LeadershipCore> core_;
  bool interrupted_ = false;
  std::shared_ptr<SimDisk> store_;
  /// The follower's store: takes nothing (a follower changes nothing).
  struct NoStore final : lockd::DurabilityPort {
    bool submit(lockd::DurableBatch&&) override { return false; }
    void poll(std::vector<lockd::DurabilityVerdict>&) override {}
  } no_store_;
  std::unique_ptr<LockdNode> node_;
  std::int64_t leading_ = 0;
  std::int64_t fence_ns_ = 0;
  std::int64_t refused_ = 0;
  std::int64_t loading_ = 0;  ///< the revision whose table is loading (0: none)
  std::string leader_seen_;
  std::uint64_t takeovers_ = 0;
  std::uint64_t services_ = 0;
};

}  // namespace leasehold::sim
