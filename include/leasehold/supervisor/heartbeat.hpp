// leasehold/supervisor: the heartbeat schedule — which leases to refresh, when, and what an
// answer does to them. Pure: no I/O, no clock reads; time is a parameter (ns, CLOCK_BOOTTIME).
//
// The rule (DESIGN.md "Time"): a lease is valid locally until
//   valid_until = send time of the last *acknowledged* refresh + kill_after,
// measured from the send time because lockd's expiry is `its receive time + ttl` and the
// receive time is never earlier than our send time. Consequences implemented here:
//   - an answer extends a lease from the send time of the request it answers (a late answer
//     to an old request never extends from a newer send), and only if that moves valid_until
//     forward;
//   - a lease whose valid_until has passed is dead: no answer brings it back (the rt thread
//     is killing it); answers for it say `kill`;
//   - `lost{holder, epoch}` and `unknown` kill at once (mutex-violation recovery, DESIGN.md
//     "Vocabulary");
//   - every request's deadline is capped at the earliest valid_until among its entries: an
//     answer after that could not extend anything.
// Preemptible mode: a lease committed to this worker (`worker_refreshed`) is not refreshed
// on its own; the worker-liveness heartbeat carries it. When worker liveness lapses the
// worker-wide kill-switch is engaged: every worker-refreshed lease is dead and named creation
// is refused until a liveness heartbeat *sent after* the kill-switch is acknowledged
// (the blog's "kill-switch synchronisation").
//
// Invariants, checked with LEASEHOLD_ASSERT (an abort: a broken one could let a kill land after
// lockd's expiry): every `now_ns` passed in is >= the one before (the boot clock never goes
// back); an answer's request was sent no later than the answer's `now_ns`; a lease's and the
// worker's valid_until never move back (the one replacement is the hand-over of a committed
// lease to worker liveness, mark_worker_refreshed, once per grant); only a beat sent after the
// kill-switch engaged clears it.
//
// Bounds: at most `leases_max` leases (the shm slot count); one round per interval.
#pragma once

#include "leasehold/lease/shard.hpp"
#include "leasehold/lease/types.hpp"

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace leasehold {

/// One lease as the heartbeat sees it.
struct HeartbeatLease {
  NameId name;
  SandboxId sandbox;
  Epoch epoch = 0;
  std::uint32_t slot = 0;
  std::uint64_t last_acked_send_ns = 0;
  std::uint64_t valid_until_ns = 0;
  bool worker_refreshed = false;  ///< preemptible mode: kept by worker liveness
  /// Preemptible mode: the sandbox runs (its epoch not yet published) and its Commit is in
  /// flight; lockd still has the name Acquiring, so worker beats do not carry it yet.
  bool commit_pending = false;
};

/// One request (= one datagram after encoding) of a heartbeat round.
struct RefreshRequest {
  std::uint64_t send_ns = 0;
  std::uint64_t deadline_ns = 0;  ///< min valid_until of the entries: no retry past it
  std::vector<RefreshEntry> entries;
};

/// A heartbeat round: refresh requests plus, in preemptible mode, a worker-liveness beat.
struct HeartbeatRound {
  std::vector<RefreshRequest> requests;
  bool worker_liveness = false;
  std::uint64_t worker_liveness_deadline_ns = 0;
  /// Preemptible mode: the names the worker beat carries (committed, not lapsed), a window of
  /// at most `entries_per_request` that moves on every round (in sandbox id order, wrapping),
  /// so with N such leases each is carried at least every ceil(N / entries_per_request) rounds.
  std::vector<RefreshEntry> worker_held;
};


/// What the io thread must do after an answer.
struct HeartbeatAction {
  enum class Kind : std::uint8_t {
    none,    ///< nothing changes (stale answer, unknown sandbox)
    extend,  ///< write valid_until_ns into the slot and re-arm the rt thread's deadline
    kill,    ///< kill the sandbox at once (lost / unknown / lease already lapsed)
  };
  Kind kind = Kind::none;
  SandboxId sandbox;
  std::uint32_t slot = 0;
  std::uint64_t valid_until_ns = 0;
  RefreshStatus cause = RefreshStatus::refreshed;
  SandboxId holder;       ///< with cause == lost
  Epoch holder_epoch = 0;  ///< with cause == lost
  bool lapsed = false;    ///< kill because valid_until had already passed
};

/// The time an acknowledgement extends a lease from: the send time of the request lockd answered
/// (lockd's expiry counts from its receive time, never earlier than that send), whatever the
/// answer's arrival `answer_ns`. Every valid_until of a lease here (and of a grant, supervisor.cpp)
/// is this plus kill_after.
std::uint64_t lease_measured_from_ns(std::uint64_t request_send_ns, std::uint64_t answer_ns) noexcept;

class HeartbeatSchedule {
 public:
  /// `kill_after_ns` > 0, `interval_ns` > 0, `leases_max` > 0.
  HeartbeatSchedule(std::uint64_t kill_after_ns, std::uint64_t interval_ns,
                    std::uint32_t leases_max, bool preemptible);

  /// Adds a lease granted by a request sent at `grant_send_ns` (the grant is the first
  /// acknowledgement): valid_until = grant_send_ns + kill_after. Returns false if the sandbox
  /// is already present or leases_max is reached.
  bool add(const NameId& name, const SandboxId& sandbox, Epoch epoch, std::uint32_t slot,
           std::uint64_t grant_send_ns);
  /// Preemptible mode: the lease was committed to this worker; from now on the worker-liveness
  /// heartbeat keeps it (its valid_until follows the worker's). Returns false if absent; aborts
  /// if the lease was handed over already.
  bool mark_worker_refreshed(const SandboxId& sandbox);
  /// Preemptible mode: marks the lease's Commit as in flight (true) or acknowledged (false).
  /// Returns false if absent.
  bool set_commit_pending(const SandboxId& sandbox, bool pending);
  /// Forgets a lease (sandbox exited or its name was released). Returns false if absent.
  bool remove(const SandboxId& sandbox);

  const HeartbeatLease* find(const SandboxId& sandbox) const;
  std::size_t size() const noexcept { return leases_.size(); }

  /// When the next round is due (0 before the first round: due at once).
  std::uint64_t next_round_ns() const noexcept { return next_round_ns_; }
  /// A cluster of `shards` shards (1..kShardsMax; lease/shard.hpp): from now on each refresh
  /// request of a round holds names of one shard only, since only that shard's leader answers it.
  void set_shards(unsigned shards);
  unsigned shards() const noexcept { return shards_; }
  /// Builds the round due at `now_ns`: every live per-sandbox lease, split into requests of at
  /// most `entries_per_request` (> 0) entries, each of one shard, and in preemptible mode the worker beat's window
  /// of committed names (HeartbeatRound::worker_held); the next round is due at now + interval.
  HeartbeatRound begin_round(std::uint64_t now_ns, std::size_t entries_per_request);

  /// Applies lockd's answer for `sandbox` to a refresh request sent at `request_send_ns`,
  /// arriving at `now_ns`.
  HeartbeatAction on_refresh_answer(const SandboxId& sandbox, Epoch epoch, RefreshStatus result,
                                    const SandboxId& holder, Epoch holder_epoch,
                                    std::uint64_t request_send_ns, std::uint64_t now_ns);

  /// Preemptible mode: the worker-liveness heartbeat sent at `request_send_ns` was
  /// acknowledged at `now_ns`. Returns the leases to extend (kind extend), empty if stale or if
  /// it was sent before the kill-switch engaged.
  std::vector<HeartbeatAction> on_worker_liveness_ack(std::uint64_t request_send_ns,
                                                      std::uint64_t now_ns);
  /// Preemptible mode: engages the worker-wide kill-switch at `now_ns` if worker liveness has
  /// lapsed. Returns the leases to kill (once; later calls return nothing new).
  std::vector<HeartbeatAction> check_worker_liveness(std::uint64_t now_ns);

  /// Whether a named sandbox may be created now. Lease mode: always. Preemptible mode: only
  /// while worker liveness is valid and the kill-switch is not engaged.
  bool may_create_named(std::uint64_t now_ns) const noexcept;
  /// Preemptible: the valid_until a newly committed lease gets (the worker's).
  std::uint64_t worker_valid_until_ns() const noexcept { return worker_valid_until_ns_; }
  bool killswitch_engaged() const noexcept { return killswitch_engaged_; }
  /// Starts worker liveness as if acknowledged by a request sent at `send_ns` (the first
  /// successful liveness beat, or a registration answered by lockd). Aborts if liveness had
  /// started with a later deadline, or if the kill-switch engaged after `send_ns`.
  void start_worker_liveness(std::uint64_t send_ns);

  std::uint64_t kill_after_ns() const noexcept { return kill_after_ns_; }

  /// Every lease, for listings (unordered).
  std::vector<HeartbeatLease> leases() const;

 private:
  HeartbeatAction kill_action(const HeartbeatLease& l, RefreshStatus cause, bool lapsed) const;
  /// Aborts (LEASEHOLD_ASSERT) if `now_ns` is below the `now` of an earlier call; records it.
  void observe_now(std::uint64_t now_ns) noexcept;
  /// Moves a deadline to `to_ns`; aborts (LEASEHOLD_ASSERT) if that would move it back.
  static void move_forward(std::uint64_t& valid_until_ns, std::uint64_t to_ns) noexcept;

  std::uint64_t kill_after_ns_;
  std::uint64_t interval_ns_;
  std::uint32_t leases_max_;
  bool preemptible_;
  unsigned shards_ = 1;
  std::uint64_t next_round_ns_ = 0;
  std::uint64_t last_now_ns_ = 0;  ///< the latest `now_ns` passed in (observe_now)
  std::unordered_map<SandboxId, HeartbeatLease> leases_;
  SandboxId worker_window_after_;  ///< the last sandbox of the previous worker_held window
  // Preemptible mode: the worker's own lease.
  bool worker_live_ = false;
  std::uint64_t worker_last_acked_send_ns_ = 0;
  std::uint64_t worker_valid_until_ns_ = 0;
  bool killswitch_engaged_ = false;
  std::uint64_t killswitch_at_ns_ = 0;
};

}  // namespace leasehold
