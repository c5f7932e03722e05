// leasehold/lockd: leader election through an etcd lease, and the leader's self-fencing.
//
// Several lockd processes share one etcd store (etcd_store.hpp); per shard one of them leads and
// answers for the shard's names, the others answer not_leader with the leader's address.
//
// Election (campaign()): a lockd holds an etcd lease of TTL L (--leader-lease-s) and runs one
// transaction: "if the shard's election key does not exist, create it holding my advertised
// address, attached to my lease; otherwise read it". Winning gives the leader revision R, the
// key's create_revision: strictly above every earlier leader's, it is the leader's incarnation
// and the guard of every write it makes (EtcdStore). A loser reads the leader's address from the
// key, and tries again once the key is gone (it polls it every poll interval).
//
// Self-fencing (serving()): the leader sends a keep-alive every L/4. etcd deletes the election
// key only when the lease expires, no earlier than its receipt of the last keep-alive plus L, so
// no earlier than that keep-alive's send time plus L on etcd's clock. The leader serves only
// while  now < s + L·(1−ρ) − margin,  s the send time of its last acknowledged keep-alive (or of
// the lease grant) on CLOCK_BOOTTIME: it stops answering requests before any other lockd can
// win the key (the supervisor's rule, one level up: DESIGN.md "Time"). Past that point it steps
// down: it revokes its lease (best effort: the key goes at once if etcd still has it) and
// campaigns again with a new lease, as a follower.
//
// The leadership thread does all etcd I/O here; the io thread reads view() and serving(),
// which take a mutex (a few per loop turn, never per datagram on the refresh path... see the
// daemon: it reads them once per turn).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/config.hpp"

#include <atomic>
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

/// Defaults and bounds of the election timing.
inline constexpr std::int64_t kLeaderLeaseSDefault = 2;   ///< etcd's smallest TTL with its default timing
inline constexpr std::int64_t kLeaderPollNsDefault = 200'000'000;  ///< a follower reads the key this often
inline constexpr std::int64_t kLeaderKeyCheckNsDefault = 100'000'000;  ///< a leader reads its key this often

/// A leader that gave up its leadership because its own store failed (a write refused or
/// failed, the takeover's load failed: a row that does not decode) does not campaign again at
/// once - it would win again and fail again, in a loop as fast as etcd answers. It waits
/// step_down_backoff_ns(n) after its n-th such step-down in a row (other lockd may win
/// meanwhile); n starts again at 1 once a leadership lasted kStepDownBackoffResetNs.
inline constexpr std::int64_t kStepDownBackoffMinNs = 250'000'000;
inline constexpr std::int64_t kStepDownBackoffMaxNs = 10'000'000'000;
inline constexpr std::int64_t kStepDownBackoffResetNs = kStepDownBackoffMaxNs;
/// The wait after the n-th (n >= 1) failed leadership in a row: min · 2^(n-1), capped at max,
/// jittered down by up to half (by `random`) so that several lockd do not retry in step.
std::int64_t step_down_backoff_ns(unsigned n, std::uint64_t random) noexcept;

struct LeadershipConfig {
  std::string shard_prefix;   ///< etcd_store.hpp shard_prefix()
  std::string advertise;      ///< the ADDR:PORT clients reach this lockd at (the key's value)
  std::int64_t lease_s = kLeaderLeaseSDefault;  ///< L
  double clock_rate_bound = 0.01;               ///< ρ between this host and etcd's
  std::int64_t margin_ns = 100'000'000;         ///< for the send of an answer after the check
  std::int64_t poll_ns = kLeaderPollNsDefault;
  /// A leader reads its election key this often between keep-alives, and steps down at once
  /// when it is gone or another's (deleted by hand); a new leader serves only this long (plus
  /// the margin) after its election, by when the previous one has checked.
  std::int64_t key_check_ns = kLeaderKeyCheckNsDefault;
  /// The cluster's key record (etcd_store.hpp cluster_key_key) and this lockd's own
  /// (cluster_keys_value). A lockd campaigns only while its keys include every recorded one;
  /// its election records its own set, and a leader records a reloaded one (set_cluster_keys).
  /// Empty path: no check (tests of the election alone).
  std::string cluster_key_path;
  std::string cluster_keys;
};

/// The serving window of a lease whose last acknowledged keep-alive (or grant) was sent at
/// `sent_ns`: the leader answers while now < this. (The inequality above, in one place.)
std::int64_t serve_until_ns(std::int64_t sent_ns, std::int64_t lease_s, double clock_rate_bound,
                            std::int64_t margin_ns) noexcept;

class Leadership {
 public:
  /// What the io thread sees.
  struct View {
    bool leading = false;
    std::int64_t revision = 0;       ///< R while leading (0 otherwise)
    std::int64_t serve_until_ns = 0; ///< while leading: the fence (CLOCK_BOOTTIME)
    std::int64_t serve_from_ns = 0;  ///< while leading: serving starts (its election + key check)
    std::string leader;              ///< the leader's advertised address ("" = none known)
    std::string last_error;          ///< the last etcd failure, for logs ("" = none)
    /// After a failed leadership: no campaign before this (CLOCK_BOOTTIME; 0 = none), and how
    /// many failed in a row (step_down_backoff_ns).
    std::int64_t campaign_after_ns = 0;
    unsigned failed_in_a_row = 0;
  };
  /// Why the io thread gives up its leadership.
  enum class StepDown : std::uint8_t {
    fenced,  ///< the fence passed (no keep-alive acknowledged in time): campaign again at once
    failed,  ///< its store failed or refused a write, or the takeover's load failed: back off
  };

  /// Starts the leadership thread (campaigning at once). `wake` runs on that thread after every
  /// change of the view (the daemon passes EventLoop::wake). Refuses (invalid_argument) a lease
  /// of 0 or above kLeaderLeaseSMax, or a margin the lease cannot absorb.
  static Result<std::unique_ptr<Leadership>> start(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg,
                                                   std::function<void()> wake);
  /// Stops the thread; a leader revokes its lease so that another lockd takes over at once.
  ~Leadership();
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  View view() const;
  /// True while this lockd leads with revision `revision` and `now_ns` is inside the fence
  /// (and past serve_from_ns).
  bool serving(std::int64_t revision, std::int64_t now_ns) const;
  /// The io thread gives up revision `revision` (its store rejected or failed a write, the
  /// takeover failed, or the fence passed): the thread revokes the lease and campaigns again,
  /// after a backoff when `why` is failed. No-op for another revision.
  void step_down(std::int64_t revision, StepDown why);
  /// A key rotation (SIGHUP): this lockd's cluster key record from now on (the campaign
  /// checks it; a leader writes it to the cluster's record, guarded on its revision).
  void set_cluster_keys(std::string value);
  /// The etcd lease TTL in force (s): what etcd granted, at least what was asked.
  std::int64_t lease_s() const noexcept { return cfg_.lease_s; }
  const LeadershipConfig& config() const noexcept { return cfg_; }

 private:
  Leadership(std::shared_ptr<etcd::Client> client, LeadershipConfig cfg, std::function<void()> wake);
  void run();
  /// One campaign round; true when it won.
  bool campaign();
  void publish(const View& v);
  /// Waits up to `ns` or until stopped; false when stopped.
  bool pause(std::int64_t ns);

  std::shared_ptr<etcd::Client> client_;
  LeadershipConfig cfg_;
  std::string election_;
  std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  View view_;                  // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  std::int64_t step_down_ = 0; // guarded by mu_: a revision the io thread gave up
  StepDown step_down_why_ = StepDown::failed;  // guarded by mu_
  std::string cluster_keys_;   // guarded by mu_: this lockd's key record (cfg_.cluster_keys, reloaded)
  bool keys_dirty_ = false;    // guarded by mu_: a leader has a reloaded record to write
  // Leadership thread only:
  std::int64_t lease_id_ = 0;
  std::int64_t last_ack_sent_ns_ = 0;
  std::int64_t won_ns_ = 0;     ///< when the current (or last) leadership was won
  std::int64_t last_key_check_ns_ = 0;  ///< a leader's last read of its election key
  std::uint64_t jitter_state_;  ///< the backoff's jitter (splitmix64)
  std::thread thread_;
};

}  // namespace leasehold::lockd
