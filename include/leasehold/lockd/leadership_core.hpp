// leasehold/lockd: the election's logic without its I/O (leadership.hpp is the production
// driver on etcd; the simulator drives the same core on its simulated etcd, sim/cluster.hpp).
//
// Several lockd processes share one store; per shard one of them leads and answers for the
// shard's names, the others answer not_leader with the leader's address.
//
// Election (the campaign): a lockd holds a lease of TTL L (--leader-lease-s) in etcd and runs
// one transaction: "if the shard's election key does not exist, create it holding my advertised
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
// The core is a coroutine that asks for one call at a time (pending()) and is resumed with its
// reply (resume()). It never blocks and reads time only through the clock it is given. The
// io side (view(), serving(), step_down(), set_cluster_keys(), stop()) may run on another
// thread: that state is behind a mutex. The daemon's takeover rules (may_take_over,
// load_still_leads, fence_of) are here too, so that the simulator runs the same ones.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lockd/config.hpp"

#include <coroutine>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

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
  /// The shard's election key (etcd_store.hpp election_key(shard_prefix); Leadership::start
  /// fills it in when empty).
  std::string election_key;
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
  /// Empty path: no check (tests of the election alone, the simulator).
  std::string cluster_key_path;
  std::string cluster_keys;
  /// Why `mine` may not lead a cluster whose record is `recorded` ("" = it may):
  /// etcd_store.hpp cluster_keys_mismatch. Needed with a cluster_key_path.
  std::string (*keys_mismatch)(std::string_view mine, std::string_view recorded) = nullptr;
  /// The cluster's token signing key record (etcd_store.hpp signing_key_key; empty: no check).
  /// With it, a lockd campaigns only once it has its own (set_signing_key) and only while the
  /// record is absent (its election creates it) or holds the same key: every leader of the
  /// cluster signs with the key its resources keep.
  std::string signing_key_path;
  /// The longest a single call may take (ns): every call's deadline is at most this far away.
  std::int64_t call_timeout_ns = 1'000'000'000;
};

/// Invalid_argument naming the problem: a lease of 0 or above kLeaderLeaseSMax, a clock-rate
/// bound outside [0, 0.1), a margin the lease cannot absorb (the serving window must stay above
/// half the lease, which leaves the keep-alive period L/4 room for three misses), no address.
Status validate(const LeadershipConfig& cfg);

/// The key id in a signing key record ("v=1 key_id=ID public=HEX": etcd_store.hpp
/// signing_key_value), "?" when it has none.
std::string signing_key_id_of(std::string_view record);

/// The serving window of a lease whose last acknowledged keep-alive (or grant) was sent at
/// `sent_ns`: the leader answers while now < this. (The inequality above, in one place.)
std::int64_t serve_until_ns(std::int64_t sent_ns, std::int64_t lease_s, double clock_rate_bound,
                            std::int64_t margin_ns) noexcept;

/// What the io side sees of the election.
struct LeadershipView {
  bool leading = false;
  std::int64_t revision = 0;       ///< R while leading (0 otherwise)
  std::int64_t serve_until_ns = 0; ///< while leading: the fence (the core's clock)
  std::int64_t serve_from_ns = 0;  ///< while leading: serving starts (its election + key check)
  std::string leader;              ///< the leader's advertised address ("" = none known)
  std::string last_error;          ///< the last etcd failure, for logs ("" = none)
  /// After a failed leadership: no campaign before this (0 = none), and how many failed in a
  /// row (step_down_backoff_ns).
  std::int64_t campaign_after_ns = 0;
  unsigned failed_in_a_row = 0;
};

/// Why the io side gives up its leadership.
enum class StepDown : std::uint8_t {
  fenced,  ///< the fence passed (no keep-alive acknowledged in time): campaign again at once
  failed,  ///< its store failed or refused a write, or the takeover's load failed: back off
};

/// The daemon's takeover rules, on the io side, once per loop turn:
/// - start loading the table of revision v.revision now: the election is won, serving may start
///   (past serve_from, before the fence), and it is not a revision this lockd gave up;
bool may_take_over(const LeadershipView& v, std::int64_t refused_revision, std::int64_t now_ns) noexcept;
/// - a load of `revision` finished at `now_ns`: serve it only if the election still leads that
///   revision within its fence (otherwise every write of it would be refused anyway);
bool load_still_leads(const LeadershipView& v, std::int64_t revision, std::int64_t now_ns) noexcept;
/// - the fence of the leadership `leading` (the revision served): v's fence while it leads that
///   revision, 0 (fenced at once) once it does not. A leader answers nothing at or past it.
std::int64_t fence_of(const LeadershipView& v, std::int64_t leading) noexcept;

/// A record the campaign's transaction compares (its mod revision, 0 = absent) and, with a
/// value, writes.
struct ElectionRecord {
  std::string key;
  std::int64_t mod_revision = 0;
  std::string value;  ///< "" = leave it
};

/// One call the core asks its driver to make. Every call but wait has a deadline (`until_ns`):
/// the driver answers timeout past it.
struct ElectionCall {
  enum class Kind : std::uint8_t {
    wait,             ///< no call: resume at until_ns, or earlier once interrupted()
    lease_grant,      ///< grant a lease of ttl_s -> ElectionReply::lease_id
    keep_alive_open,  ///< open a keep-alive stream
    keep_alive,       ///< refresh lease_id on the stream -> ok, not_found (expired), or an error
    lease_revoke,     ///< revoke lease_id (best effort; its keys go with it)
    read_key,         ///< a linearizable read of `key` -> found, value, create / mod revision
    /// The election: if `key` does not exist and every record's mod revision is still the one
    /// given, put `key` = value attached to lease_id (and every record that has a value);
    /// else read `key`. -> won, revision (the transaction's), and the key as read when lost.
    campaign,
    /// If `key`'s create revision is guard_revision, put records[0].key = records[0].value.
    write_record,
    next_endpoint,    ///< move the client to the next member (no reply)
    done,             ///< the core has stopped (after stop(): its last call was the revoke)
  };
  Kind kind = Kind::wait;
  std::int64_t until_ns = 0;
  std::string key;
  std::string value;
  std::int64_t lease_id = 0;
  std::int64_t ttl_s = 0;
  std::vector<ElectionRecord> records;
  std::int64_t guard_revision = 0;
};

struct ElectionReply {
  Status status;  ///< not ok: the call failed (timeout, io_error, not_found for a lease etcd lacks)
  std::int64_t lease_id = 0;
  bool found = false;  ///< read_key, and campaign lost: the key exists
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  bool won = false;           ///< campaign
  std::int64_t revision = 0;  ///< campaign won: the election key's create revision
};

class LeadershipCore {
 public:
  using Clock = std::function<std::int64_t()>;
  /// `now` is the clock every time of the core is on (production: boottime_ns); `interrupt`
  /// runs (on the io side, outside the core's lock) when a wait should end early; `wake` runs
  /// (on the driver's side) after every change of the view. `jitter_seed` seeds the backoff's
  /// jitter. The configuration must validate(). The core starts suspended on its first call.
  LeadershipCore(LeadershipConfig cfg, Clock now, std::uint64_t jitter_seed, std::function<void()> interrupt,
                 std::function<void()> wake);
  ~LeadershipCore();
  LeadershipCore(const LeadershipCore&) = delete;
  LeadershipCore& operator=(const LeadershipCore&) = delete;

  // ---- the driver ----
  /// The call the core waits for (kind done once it has stopped).
  const ElectionCall& pending() const noexcept { return pending_; }
  /// The reply to pending() (ignored for wait and next_endpoint): runs the core to its next call.
  void resume(ElectionReply reply);
  /// A wait should end now: stop() was called, the io side gave up the revision it leads, or a
  /// leader has a reloaded key record to write.
  bool interrupted() const;

  // ---- the io side (any thread) ----
  LeadershipView view() const;
  /// True while this lockd leads with revision `revision` and `now_ns` is inside the fence
  /// (and past serve_from_ns).
  bool serving(std::int64_t revision, std::int64_t now_ns) const;
  /// The io side gives up revision `revision` (its store rejected or failed a write, the
  /// takeover failed, or the fence passed): the core revokes the lease and campaigns again,
  /// after a backoff when `why` is failed. No-op for another revision.
  void step_down(std::int64_t revision, StepDown why);
  /// A key rotation (SIGHUP): this lockd's cluster key record from now on.
  void set_cluster_keys(std::string value);
  /// This lockd's token signing key record (etcd_store.hpp signing_key_value): with a
  /// signing_key_path, no campaign before it is set.
  void set_signing_key(std::string value);
  /// Stops at the next wait: a leader revokes its lease so that another lockd takes over at once.
  void stop();
  const LeadershipConfig& config() const noexcept { return cfg_; }

  struct Task;  ///< the coroutine type (leadership_core.cpp)

 private:
  struct Await;
  Task run();
  Task campaign(bool& won);
  /// One record the campaign holds to (the cluster keys, the signing key) at `path`: read; a
  /// refusal (`why_not` of the value as recorded, "" = none) or a failed read is published and
  /// clears `may_lead`; otherwise `election` compares the record's revision and writes `mine`
  /// where the record is absent or differs.
  Task campaign_record(const std::string& path, const std::string& mine,
                       std::function<std::string(std::string_view)> why_not, LeadershipView& v,
                       ElectionCall& election, bool& may_lead);
  Await call(ElectionCall c);
  void publish(const LeadershipView& v);
  void interrupt();

  LeadershipConfig cfg_;
  Clock now_;
  std::function<void()> interrupt_;
  std::function<void()> wake_;
  std::string election_;
  // The coroutine's state (driver side only).
  ElectionCall pending_;
  ElectionReply reply_;
  std::coroutine_handle<> resume_at_;
  std::coroutine_handle<> top_;
  std::int64_t lease_id_ = 0;
  std::int64_t last_ack_sent_ns_ = 0;
  std::int64_t won_ns_ = 0;             ///< when the current (or last) leadership was won
  std::int64_t last_key_check_ns_ = 0;  ///< a leader's last read of its election key
  std::uint64_t jitter_state_;          ///< the backoff's jitter (splitmix64)
  bool campaign_outcome_unknown_ = false;  ///< the last campaign's transaction may have been applied
  // Shared with the io side.
  mutable std::mutex mu_;
  LeadershipView view_;                        // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  std::int64_t step_down_ = 0;                 // guarded by mu_: a revision the io side gave up
  StepDown step_down_why_ = StepDown::failed;  // guarded by mu_
  std::string cluster_keys_;                   // guarded by mu_
  std::string signing_key_;                    // guarded by mu_
  bool keys_dirty_ = false;                    // guarded by mu_: a leader has a reloaded record to write
};

}  // namespace leasehold::lockd
