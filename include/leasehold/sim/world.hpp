// leasehold/sim: a deterministic simulator of one lockd (restarts included), N supervisors with
// their sandboxes and a fenced resource, on simulated time, every fault drawn from one seed.
//
// Modelled on TigerBeetle's VOPR and FoundationDB's simulator: the world is single-threaded and
// makes no syscall on a simulated path (no sockets, files, threads or clock reads). Time is an
// event queue ordered by (simulated ns, insertion sequence); it jumps to the next event and never
// steps through idle time. Each node has its own clock (a rate error within ρ drawn per node),
// may be paused (the pause-probe's fault: a paused node's events wait until it resumes, its clock
// keeps counting, as CLOCK_BOOTTIME does), and talks to the others through a network with
// per-path delay, loss, duplication, reordering and partitions, and (half the seeds) an on-path
// attacker that replays captured datagrams and delivers tampered copies. lockd's durability port is a
// simulated disk with latency; a lockd crash (half of them timed to hit a batch in flight) loses
// the batch not yet durable, and the next incarnation starts from what was. Sandboxes are processes that take k ticks to die after a
// kill; while running and while the shm check (`check_deadline`: epoch published and now <
// valid_until on the worker's clock) passes, they write to a fenced resource with their epoch.
//
// After every event the named invariants (sim/invariants.hpp) are checked; the first violation
// ends the run and is reported with the seed.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lease/timing.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace leasehold::sim {

inline constexpr std::int64_t kMs = 1'000'000;
inline constexpr std::int64_t kS = 1'000'000'000;

/// One run's parameters. Durations are ns of simulated (true) time unless a field says otherwise.
struct SimConfig {
  std::uint64_t seed = 1;
  std::int64_t duration_ns = 120 * kS;  ///< simulated time of a run
  std::int64_t heal_ns = 90 * kS;       ///< no fault starts after this; all have ended by heal + 5 s
  std::uint32_t supervisors = 3;
  std::uint32_t names = 3;
  std::uint32_t sandboxes_per_worker_max = 2;

  /// The timing of DESIGN.md "Time", as the inputs of the safety inequality (lease/timing.hpp):
  /// lockd's lease TTL (and max TTL) 1 s, the supervisor's kill_after 800 ms, the wheel's
  /// granularity 1 ms, the kill-latency budget 50 ms (a killed sandbox dies within it), and the
  /// clock-rate bound ρ = 1e-3 (each node's rate error is drawn within it).
  timing::Inputs timing{1000 * kMs, 800 * kMs, 1 * kMs, 50 * kMs, timing::kPpb / 1000};
  std::int64_t heartbeat_interval_ns = 150 * kMs;
  std::int64_t retry_interval_ns = 40 * kMs;        ///< a request is resent this often until its deadline
  std::int64_t acquire_timeout_ns = 400 * kMs;
  std::int64_t sandbox_tick_ns = 5 * kMs;           ///< a killed sandbox dies after k of these
  std::int64_t write_interval_ns = 50 * kMs;        ///< a sandbox's write cadence
  /// Liveness: after heal_ns, every name is granted again within this bound.
  std::int64_t liveness_bound_ns = 28 * kS;
  std::int64_t sandbox_lifetime_max_ns = 20 * kS;

  /// The share of acquires that are 2-phase (acquire, schedule the sandbox within the acquiring
  /// TTL, commit; the lease then counts from the commit's send).
  double two_phase_share = 0.3;
  /// A hostile worker (authenticated with its own worker key) heartbeats every name with made-up
  /// sandboxes and epochs: a worker's key must give no power over other workers' names.
  bool hostile_worker = true;

  /// The share of seeds run in preemptible mode (lockd and every supervisor `--mode
  /// preemptible`, DESIGN.md "Preemptible mode"): 2-phase acquires only, the sandbox started
  /// before its Commit, liveness per worker (worker beats, the worker-wide kill-switch), and
  /// lockd asking IsRunning before it preempts a live worker's name. preemptible() draws it.
  double preemptible_share = 0.3;
  /// The share of seeds whose workers queue for names (queues() draws it): in those, a share
  /// (queued_run_share) of the named runs are queued runs (`run` with `"queue": true`, DESIGN.md
  /// "Queued runs"), some with a queue timeout and some whose client closes its connection while
  /// the run waits. They wait in lockd's FIFO of waiters for the few names every worker draws
  /// from, and are granted there when the holder releases, its lease expires, the operator
  /// revokes it, or a waiter ahead lapses (its worker cut off or paused for longer than its TTL).
  double queue_share = 0.3;
  double queued_run_share = 0.7;
  /// A worker's queued runs that wait in lockd's FIFO at once, at most (a run drawn to queue
  /// while this many wait is an ordinary named run). They do not count against
  /// sandboxes_per_worker_max: they run nothing yet.
  std::uint32_t waiting_runs_per_worker_max = 1;

  /// preemptible mode: lockd's worker-liveness TTL (--worker-ttl-ms); 0 means timing.ttl_ns.
  std::int64_t worker_ttl_ns = 0;
  /// lockd's --lock-delay-ms: after an expiry or preemption the name stays unavailable this
  /// long. With draw_timing, half the seeds draw one (whole ms, up to the TTL).
  std::int64_t lock_delay_ns = 0;

  /// lockd on etcd (sim/cluster.hpp): this many lockd replicas of one shard on a simulated
  /// etcd, each running the production election (LeadershipCore) and the daemon's takeover
  /// and self-fencing rules, with their own faults: a replica killed and restarted, paused past
  /// its leadership lease and resumed (a deposed leader that keeps running), cut off etcd, and
  /// etcd's answers lost or slow. 1: one lockd on its disk.
  std::uint32_t lockd_replicas = 1;
  /// The replicas' leadership lease L (lockd's --leader-lease-s), whole seconds; 0: drawn per
  /// seed, 1 s or 2 s (lockd's default), from a stream of its own (with_drawn_timing).
  std::int64_t leader_lease_s = 0;

  bool faults = true;             ///< false: a reliable network, no pauses, crashes or skew
  /// With faults, each seed draws its timing (own streams, with_drawn_timing): the TTL from
  /// timing.ttl_ns up to twice it, ρ from 0 up to 5x timing.rho_ppb, the wheel granularity up
  /// to 10x, then its kill_after from timing.kill_after_ns up to the largest that leaves the
  /// safety inequality 1 ms of margin; a killed sandbox takes up to the whole kill-latency
  /// budget to die.
  bool draw_timing = true;
  /// A few seeds get one supervisor pause of 1.2x the safety margin or more (up to 3x the TTL),
  /// which may let a kill land after lockd's expiry; only its own worker's sandboxes are excused.
  bool over_budget_pauses = true;

  /// The safety inequality's margin in ns: ttl(1-ρ) - (kill_after(1+ρ) + wheel_granularity +
  /// kill_latency_budget) (timing::check_safety's margin_ns, rounded toward safety). The longest
  /// pause that cannot make a kill land after lockd's expiry, whatever the two clocks' rates; the
  /// pause budget (ttl − the same left side, DESIGN.md "Time") exceeds it by ttl·ρ. Every
  /// injected pause not meant to break the inequality stays below it.
  std::int64_t safety_margin_ns() const noexcept;
  /// Whether this run is in preemptible mode: drawn from the seed with preemptible_share (so
  /// `--seed N` replays the mode of seed N in a sweep), always for share 1, never for 0.
  bool preemptible() const noexcept;
  /// Whether this run's workers queue for names: drawn from the seed with queue_share (its own
  /// stream, as preemptible()), always for share 1, never for 0.
  bool queues() const noexcept;
  /// Ok, or invalid_argument saying what is wrong (names the field and the values), e.g. the
  /// safety condition.
  Status validate() const;
};

/// How often each fault and each interesting event happened in a run: X(field, description).
#define LEASEHOLD_SIM_FAULT_COUNTS(X)                                                       \
  X(datagrams_sent, "datagrams handed to the network")                                      \
  X(datagrams_delivered, "datagrams delivered (duplicates included)")                       \
  X(datagrams_lost, "datagrams the network lost")                                           \
  X(datagrams_duplicated, "datagrams delivered twice")                                      \
  X(datagrams_reordered, "delivered before one sent earlier on the same path")              \
  X(datagrams_delayed, "took the delay distribution's long tail")                           \
  X(datagrams_partitioned, "dropped by a partition")                                        \
  X(datagrams_to_down_lockd, "arrived while lockd was down")                                \
  X(datagrams_replayed, "old datagrams an on-path attacker delivered again")                 \
  X(datagrams_tampered, "copies with one bit flipped an on-path attacker delivered")         \
  X(partitions, "partitions started")                                                       \
  X(congestions, "congestion episodes started (one direction of a link much slower)")       \
  X(pauses, "node pauses (the pause-probe's fault)")                                        \
  X(pauses_over_budget, "supervisor pauses of 1.2x the safety margin or longer")            \
  X(events_deferred_by_pause, "events that waited for a paused node")                       \
  X(step_pauses, "pauses between a node's clock read and the effects of its step")         \
  X(lockd_crashes, "lockd crashes")                                                         \
  X(lockd_crashes_in_flight, "of those, timed to hit a disk batch in flight")               \
  X(lockd_restarts, "lockd restarts from the durable store")                                \
  X(batches_lost, "disk batches a crash lost before they were durable")                     \
  X(batches_durable, "disk batches made durable")                                           \
  X(disk_slow, "disk batches that took the slow path")                                      \
  X(disk_failures, "disk batches that failed (lockd stopped unanswered and restarted)")    \
  X(sandbox_stalls, "writes that stalled between the shm check and the resource")           \
  X(skewed_clocks, "nodes whose clock rate error is not zero")                              \
  X(grants, "Grant answers lockd sent (repeats included)")                                  \
  X(preemptible_runs, "runs in preemptible mode (SimConfig::preemptible())")                \
  X(is_running_asked, "IsRunning questions lockd sent a worker (preemptible mode)")         \
  X(lock_delay_refusals, "creates lockd refused while a name's lock-delay ran")            \
  X(hostile_forgeries, "forged requests the hostile worker sent about others' names")      \
  X(operator_revokes, "revokes the operator sent (cluster key), held names or not")          \
  X(operator_transfers, "graceful transfers the operator started (cluster key)")            \
  X(transfers_completed, "transfers lockd let complete (the old holder confirmed or its bound passed)") \
  X(queueing_runs, "runs in which the workers queue for names (SimConfig::queues())")       \
  X(queued_runs, "named runs that queued for their name (run with \"queue\": true)")        \
  X(queued_runs_granted, "queued runs granted their name (at once, or from lockd's FIFO)")  \
  X(queued_runs_timed_out, "queued runs given up at their queue timeout")                   \
  X(queued_clients_closed, "queued runs whose client closed its connection while it waited") \
  X(waiters_queued, "places lockd gave in its FIFOs of waiters (every incarnation)")        \
  X(waiters_granted, "waiters lockd granted their name from a FIFO (the hand-over)")        \
  X(waiters_granted_on_release, "of those, while lockd handled the holder's Release")       \
  X(waiters_granted_on_kill_confirmed, "of those, while lockd handled a revoked holder's kill confirmation") \
  X(waiters_lapsed, "places in lockd's FIFOs that lapsed (no Wait within their TTL)")       \
  X(sandboxes_started, "sandboxes started")                                                 \
  X(kills, "kill-switch kills (lapsed lease, lost / unknown answer)")                       \
  X(writes_accepted, "writes the fenced resource accepted")                                 \
  X(writes_rejected, "writes the fenced resource rejected (stale epoch)")                   \
  X(replica_crashes, "lockd replicas killed (lockd on etcd)")                               \
  X(replica_long_pauses, "lockd replicas paused past their leadership lease")                \
  X(etcd_cuts, "lockd replicas cut off etcd for a while")                                  \
  X(etcd_calls_lost, "election calls or their answers etcd's path lost")                  \
  X(takeovers, "leaderships taken over (a won election whose table loaded)")               \
  X(batches_rejected, "leader writes etcd refused: the election key had moved on")          \
  X(batches_unanswered, "leader writes etcd decided whose answer a cut lost (then retried)") \
  X(leases_expired, "leadership leases etcd expired")

struct FaultCounts {
#define LEASEHOLD_SIM_FIELD(name, text) std::uint64_t name = 0;
  LEASEHOLD_SIM_FAULT_COUNTS(LEASEHOLD_SIM_FIELD)
#undef LEASEHOLD_SIM_FIELD
  FaultCounts& operator+=(const FaultCounts& o) noexcept {
#define LEASEHOLD_SIM_ADD(name, text) name += o.name;
    LEASEHOLD_SIM_FAULT_COUNTS(LEASEHOLD_SIM_ADD)
#undef LEASEHOLD_SIM_ADD
    return *this;
  }
};

struct Violation {
  std::string invariant;  ///< the function's name: single_holder, kill_before_expiry, ...
  std::int64_t at_ns = 0; ///< simulated time of the step that broke it
  std::string detail;
};

struct RunResult {
  std::uint64_t seed = 0;
  std::optional<Violation> violation;
  std::uint64_t trace_hash = 0;  ///< FNV-1a over every trace line of the run
  std::uint64_t events = 0;
  std::int64_t simulated_ns = 0;
  FaultCounts counts;
};

/// Receives the readable trace, one line (no newline) per step.
using TraceFn = std::function<void(std::string_view)>;

/// Runs one seed. `trace` (may be empty) gets every line; the hash is computed either way.
/// `cfg` as seed cfg.seed runs it: with faults and draw_timing, its TTL (whole ms, from
/// cfg.timing.ttl_ns to twice it), clock-rate bound ρ (0 to 5x cfg's) and wheel granularity (1x
/// to 10x cfg's) drawn from the seed (one stream), then its kill_after (another) uniformly from
/// cfg.timing.kill_after_ns up to the largest that leaves the safety inequality
/// (lease/timing.hpp) 1 ms of margin, so a seed can run with almost no slack and an error in
/// any of the inequality's terms shows. The configured TTL, ρ and granularity stay where their
/// draw would leave the configured kill_after unsafe. Half the seeds also draw a lock-delay
/// (whole ms, 1 ms up to the TTL; a third stream). Otherwise `cfg`.
SimConfig with_drawn_timing(SimConfig cfg);

/// Throws std::invalid_argument with validate()'s message for a bad config.
RunResult run_seed(const SimConfig& cfg, const TraceFn& trace = {});

/// The ablation this binary was built with ("" for none): the LEASEHOLD_SIM_ABLATE_* set.
std::string_view ablation_name() noexcept;

}  // namespace leasehold::sim
