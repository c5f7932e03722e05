// leasehold/lease: LeaseTable, the name table state machine of lockd.
//
// What it is: one record per known name, in the four lock states of DESIGN.md "Lock states"
// (Free, Acquiring, Held, Transferring), with every transition of that table as a method that
// either applies the transition or returns a typed `Refusal` (never undefined behaviour).
//
// Pure: no I/O, no threads, no clock reads. Time is a parameter, `now_ns`, nanoseconds on
// CLOCK_BOOTTIME (DESIGN.md "Time"). The caller must pass a `now_ns` that never goes backwards
// and should call `advance(now_ns)` before applying operations at `now_ns`; operations never
// revive a record whose deadline has passed even if `advance` has not reclaimed it yet (they
// refuse with `Refusal::expired`).
//
// What it is optimised for: the heartbeat. A 64-entry batch `refresh` on a table of 1,000,000
// names touches one 8-byte index entry and one 64-byte record per entry (the batch prefetches
// all index lines, then all records, before processing any), and never touches the expiry
// structure: expiry timers are re-armed lazily when they come due (Varghese & Lauck's "lazy"
// timer discipline), so a refresh only moves the deadline in the record.
//
// Epochs (DESIGN.md "Vocabulary"): per name, strictly increasing at every grant, transfer begin
// and revoke, never reused, also across restarts. A Free record whose epoch was allocated by a
// transfer begin, revoke or reassign but not yet granted (`epoch_fresh`) is granted at that
// epoch (ownership model: Unowned(42, B) --Acquire(B)--> Owned(B, 42)); otherwise a grant takes
// epoch + 1. A plain Free record (no reservation, no pending lock-delay or revoke, epoch not
// fresh) is dropped from the table; an unknown name behaves as Free at the table's epoch high-water mark,
// so its next grant is above every epoch ever issued for it.
//
// Names: operations that may create a record (acquire, acquire_2pc, reassign) take the name
// text, validate it (`invalid_name`) and derive its NameId (name_id_of). The text itself is not
// kept (it would double the memory per name; lockd persists it); each record keeps a 32-bit
// fingerprint of the text from a hash independent of the NameId's SHA-1, and a name whose id
// matches a record with a different fingerprint is refused with `name_collision`.
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/lease/types.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

// ---- limits (TigerBeetle style: every bound is named) -------------------------------------

/// Largest name table a LeaseTable may be configured for (LeaseConfig::capacity).
inline constexpr std::size_t kLeaseCapacityMax = std::size_t{1} << 24;
/// Most entries in one refresh batch (a wire datagram carries far fewer; lockd may coalesce).
inline constexpr std::size_t kRefreshBatchMax = 256;
/// Most distinct workers a table tracks at once (interned to a 16-bit index in each record).
inline constexpr std::size_t kWorkersMax = 65535;
/// Default bound on expiries `advance` reports per call (the caller loops while it is reached).
inline constexpr std::size_t kAdvanceBatchMax = 4096;
/// Largest TTL, acquiring TTL, lock-delay or worker liveness TTL accepted (one day).
inline constexpr std::int64_t kLeaseTtlNsMax = std::int64_t{86400} * 1'000'000'000;
/// `expiry_ns` of a Held lease that never expires by TTL (preemptible mode).
inline constexpr std::int64_t kNoExpiry = std::numeric_limits<std::int64_t>::max();

// ---- configuration ------------------------------------------------------------------------

/// How a Held name is taken away from a holder that stopped (DESIGN.md "Lock states").
enum class LockMode : std::uint8_t {
  /// Held leases expire at `expiry_ns` unless refreshed (Gray & Cheriton leases). `preempt`
  /// is refused with wrong_mode.
  lease = 0,
  /// Held names do not expire by TTL; liveness is tracked per worker (`worker_heartbeat`,
  /// and every refresh counts as one) and `preempt` frees a name whose worker's liveness
  /// lapsed or whose live worker reports the sandbox not running. One-phase `acquire` is
  /// refused with wrong_mode: acquisition must be 2-phase (acquire_2pc + commit) so a name
  /// cannot be preempted between acquisition and sandbox creation (the "Preemptible locks"
  /// section of the sandbox-names design).
  preemptible = 1,
};

/// A LeaseTable's parameters. Durations are nanoseconds; all must be in (0, kLeaseTtlNsMax],
/// except lock_delay_ns which may be 0 (no lock-delay). See `validate_config`.
struct LeaseConfig {
  std::int64_t default_ttl_ns = 10'000'000'000;     ///< TTL when a request passes ttl_ns <= 0
  std::int64_t max_ttl_ns = 60'000'000'000;         ///< largest TTL a request may ask for;
                                                    ///< also the TTL given at restart
  std::int64_t acquiring_ttl_ns = 5'000'000'000;    ///< Acquiring deadline = acquire time + this
  std::int64_t lock_delay_ns = 0;                   ///< Chubby §2.4 lock-delay after an expiry
                                                    ///< or preemption; 0 disables it
  LockMode mode = LockMode::lease;
  std::int64_t worker_liveness_ttl_ns = 10'000'000'000;  ///< a worker is live until its last
                                                         ///< heartbeat + this
  std::size_t capacity = 1'000'000;                 ///< most records (names); table_full beyond
  /// A reservation (Free reserved for one sandbox: transfer complete, reassign) lapses this
  /// long after the name became grantable to its owner; the name is then plain Free at the
  /// same epoch (a fresh epoch stays fresh).
  std::int64_t reservation_ttl_ns = 30'000'000'000;
  /// Ablation for the attack tests only: a transfer is completed as soon as asked, without
  /// waiting for the old holder's kill confirmation or its lease's end (the old behaviour).
  bool ablate_transfer_guard = false;
};

/// Checks a LeaseConfig: ok, or invalid_argument with a message naming the field, its value
/// and the allowed range.
Status validate_config(const LeaseConfig& config);

// ---- state views --------------------------------------------------------------------------

/// A value view of one name's state. Fields not meaningful in `phase` are zero / nil.
struct LockState {
  LockPhase phase = LockPhase::free;
  Epoch epoch = 0;              ///< current epoch (Transferring: new_epoch)
  Epoch old_epoch = 0;          ///< Transferring: the outgoing holder's epoch (= epoch - 1)
  SandboxId owner;              ///< Held / Acquiring: the owner; Transferring: `from`
  SandboxId to;                 ///< Transferring: the intended owner
  SandboxId reserved_for;       ///< Free: only this sandbox may acquire (nil: anyone)
  /// Free reserved / Transferring: the worker `reserved_for` / `to` runs on; only it may
  /// acquire the name for that sandbox (nil: any worker, a reservation made without one).
  WorkerId reserved_worker;
  WorkerId worker;              ///< Held: the worker whose supervisor holds the lease;
                                ///< Acquiring: the worker it is bound to (nil: none)
  std::int64_t expiry_ns = 0;   ///< Held: lease expiry (kNoExpiry in preemptible mode)
  std::int64_t deadline_ns = 0; ///< Acquiring: commit deadline
  /// Free: acquire refused with lock_delay before this (an expiry's or preemption's lock-delay,
  /// or a pending revoke's bound). Transferring with revoke_pending: transfer-complete refused
  /// with lock_delay before this (the transfer guard's bound). 0: none.
  std::int64_t lock_delay_until_ns = 0;
  /// Free, reserved: when the reservation lapses. 0 while a lock-delay is pending (the
  /// reservation TTL starts when the name becomes grantable) or when not reserved.
  std::int64_t reservation_until_ns = 0;
  /// Free: a revoke is pending: the name is not grantable until the revoked holder's worker
  /// confirms the kill (`confirm_kill`) or lock_delay_until_ns passes, whichever is first.
  /// Transferring: the transfer guard is pending: the transfer cannot complete (so nobody, not
  /// even `to`, can be granted the name) until the same happens for the outgoing grant.
  bool revoke_pending = false;
  Epoch revoked_epoch = 0;      ///< revoke_pending: the revoked grant's epoch (0: unknown;
                                ///< Transferring: old_epoch)
  WorkerId revoked_worker;      ///< revoke_pending: the worker whose confirmation lifts it (nil:
                                ///< none can; only the bound ends it)
  bool epoch_fresh = false;     ///< Free: `epoch` was allocated but not granted yet
  bool known = false;           ///< the table has a record (false: Free at the high-water mark)
  friend bool operator==(const LockState&, const LockState&) = default;
};

/// The epoch a fence compares against: `epoch` (which is new_epoch while Transferring, so the
/// outgoing holder is stale from the moment a transfer begins).
inline Epoch current_epoch(const LockState& s) noexcept { return s.epoch; }

/// DESIGN.md "Lock states": true only in Held with owner == sandbox and epoch == current.
/// Nobody may mutate while Acquiring, Transferring or Free.
inline bool may_mutate(const LockState& s, SandboxId sandbox, Epoch epoch) noexcept {
  return s.phase == LockPhase::held && !sandbox.is_nil() && s.owner == sandbox && s.epoch == epoch;
}

/// As above, and the lease has not expired at now_ns (now_ns < expiry_ns).
inline bool may_mutate(const LockState& s, SandboxId sandbox, Epoch epoch,
                       std::int64_t now_ns) noexcept {
  return may_mutate(s, sandbox, epoch) && now_ns < s.expiry_ns;
}

/// DESIGN.md "fencing": valid_fence(e) := e >= current_epoch. A resource server keeps the
/// highest epoch it has seen instead of asking lockd; see FenceGate (lease/fence.hpp).
inline bool valid_fence(const LockState& s, Epoch epoch) noexcept {
  return epoch >= current_epoch(s);
}

/// Whether `token` confers authority in state `s` (the state of token.name): a token is a
/// capability that exists forever; it authorizes only while it is exactly the current grant
/// (ownership model "Capability tokens"). Stale tokens are inert.
inline bool token_authorized(const LockState& s, const Token& token) noexcept {
  return may_mutate(s, token.holder, token.epoch);
}

// ---- transition outcomes ------------------------------------------------------------------

/// The answer of a single-name transition. On success `refusal == none` and `state` is the
/// state after the transition; on refusal nothing changed and `state` is the current state
/// (so a refused acquire reports the holder, worker, epoch and expiry). `token` is set by
/// grants (acquire, acquire_2pc, commit): {name, granted epoch, sandbox}; otherwise empty.
struct Outcome {
  Refusal refusal = Refusal::none;
  NameId name;
  LockState state;
  Token token;
  bool ok() const noexcept { return refusal == Refusal::none; }
};

struct RefreshAnswer {
  RefreshStatus status = RefreshStatus::unknown;
  Epoch epoch = 0;              ///< lost: the current epoch; refreshed: the entry's epoch
  SandboxId holder;             ///< lost: the current holder (nil if none: free, expired,
                                ///< transferring); refreshed: the entry's sandbox
  std::int64_t expiry_ns = 0;   ///< refreshed: the new expiry
};

/// What an `Expiry` reports.
enum class ExpiryKind : std::uint8_t {
  lease = 0,         ///< Held past its expiry -> Free
  acquiring = 1,     ///< Acquiring past its commit deadline -> Free
  revoke_bound = 2,  ///< Free with a pending revoke: its bound passed unconfirmed; grantable
                     ///< now. Transferring: the transfer guard's bound passed; completable now
  reservation = 3,   ///< Free reserved: the reservation lapsed; plain Free at the same epoch
};

/// One reclaimed deadline reported by `advance`: a Held lease that expired, an Acquiring
/// record whose commit deadline passed, a pending revoke whose bound passed, or a reservation
/// that lapsed.
struct Expiry {
  NameId name;
  LockPhase was = LockPhase::held;  ///< held, acquiring, free (revoke_bound, reservation), or
                                    ///< transferring (revoke_bound: the transfer guard's)
  SandboxId holder;                 ///< held/acquiring: the holder; reservation: the reservee
  WorkerId worker;                  ///< held: its worker; revoke_bound: the revoked worker
  Epoch epoch = 0;                  ///< unchanged by expiry
  std::int64_t deadline_ns = 0;     ///< the deadline that passed
  ExpiryKind kind = ExpiryKind::lease;
};

/// A durable record (DESIGN.md "lockd": only ownership changes and the epoch high-water mark
/// are durable; times are not, they are re-derived at restart). lockd also persists the text.
struct DurableRecord {
  NameId name;
  std::uint32_t name_fingerprint = 0;  ///< name_fingerprint_of(text)
  LockPhase phase = LockPhase::free;
  Epoch epoch = 0;          ///< current epoch (Transferring: new_epoch)
  SandboxId owner;          ///< Held / Acquiring owner; Transferring from
  SandboxId to;             ///< Transferring to; Free: reserved_for
  WorkerId worker;          ///< Held; Free with a pending revoke: revoked_worker;
                            ///< Transferring: the outgoing holder's worker (guard)
  WorkerId to_worker;       ///< Transferring / Free reserved: the worker of `to` (nil: any)
  bool epoch_fresh = false; ///< Free: epoch allocated, not granted
  /// Held, restore only: how long the restored lease (preemptible: its worker's liveness) may
  /// run from the restart, capped at the TTL; -1 = a full TTL; 0 = it expires at once. Not
  /// durable itself: lockd derives it from its restart marks (lockd/service.hpp, restart rule).
  std::int64_t restore_left_ns = -1;
  /// Held, restore only, lease mode: added to the restored expiry (never taken from it), so
  /// that the leases a restart or a takeover restores do not all fall due at one instant
  /// (lockd/service.hpp, restored_expiry_spread_ns). 0: none; a negative value counts as 0.
  std::int64_t restore_spread_ns = 0;
  /// Free: non-zero while a revoke is pending (the revoked grant's epoch). Its bound is not
  /// durable: a restored pending revoke waits a full max_ttl_ns (+ lock_delay_ns) from the
  /// restart (preemptible mode, with a worker: worker_liveness_ttl_ns + lock_delay_ns), or
  /// its worker's confirmation. A restored Transferring record gets its transfer guard back
  /// the same way (`worker`: the outgoing holder's worker, nil: only the bound lifts it).
  Epoch revoked_epoch = 0;
  friend bool operator==(const DurableRecord&, const DurableRecord&) = default;
};

/// Everything a restart needs: the records and the epoch high-water mark (the largest epoch
/// ever allocated in the table, including burned ones of dropped records).
struct DurableSnapshot {
  std::vector<DurableRecord> records;
  Epoch epoch_high_water = 0;
};

/// The 32-bit fingerprint of a name's text kept in each record for collision detection
/// (FNV-1a, independent of the SHA-1 behind name_id_of).
std::uint32_t name_fingerprint_of(std::string_view name) noexcept;

// ---- the table ----------------------------------------------------------------------------

/// The name table of lockd. Not thread-safe (lockd runs it on one thread). Move-only.
/// Memory: a 64-byte record per name (an array of `capacity` records), 8-byte index entries at
/// load factor <= 1/2 (16..32 bytes per name of capacity) and 24 bytes per pending timer;
/// pages are committed only when first touched. `memory_bytes()` reports the total reserved.
class LeaseTable {
 public:
  /// Throws std::invalid_argument with validate_config's message if `config` is invalid.
  explicit LeaseTable(const LeaseConfig& config);
  ~LeaseTable();
  LeaseTable(LeaseTable&&) noexcept;
  LeaseTable& operator=(LeaseTable&&) noexcept;
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  const LeaseConfig& config() const noexcept;

  // -- acquisition (DESIGN.md "Lock states": Acquire, Acquire (2-phase), Commit) --

  /// Lease-mode acquire: Free -> Held{sandbox, worker, epoch, expiry = now_ns + ttl}. The
  /// epoch is epoch + 1, or the fresh epoch of a reserved/revoked Free record. ttl_ns <= 0
  /// means config.default_ttl_ns. Idempotent: if `sandbox` already holds the name through
  /// `worker` the same token is returned and nothing changes.
  /// Refusals: invalid_name, bad_request (nil sandbox/worker, ttl_ns > max_ttl_ns),
  /// wrong_mode (preemptible mode), name_collision, held, acquiring, transferring, reserved,
  /// lock_delay, expired (Held past expiry, not yet reclaimed by advance), table_full,
  /// epoch_exhausted, forbidden (the sandbox holds it, is bound to it or has it reserved
  /// through another worker: a sandbox id is no secret, the worker it runs on is the check).
  Outcome acquire(std::string_view name, SandboxId sandbox, WorkerId worker, std::int64_t now_ns,
                  std::int64_t ttl_ns = 0);

  /// 2-phase acquire: Free -> Acquiring{sandbox, worker, epoch, deadline = now_ns +
  /// acquiring_ttl}. The epoch is allocated here (+1 at acquire). `worker` (nil: none named,
  /// e.g. an operator's acquire that any worker may commit) is the worker the record is bound
  /// to: LockState::worker shows it, and lockd lets only that worker commit or abort it.
  /// Idempotent for the same sandbox while Acquiring (the first acquire's worker stays). Not
  /// preemptible. Refusals as `acquire`, minus wrong_mode.
  Outcome acquire_2pc(std::string_view name, SandboxId sandbox, std::int64_t now_ns,
                      WorkerId worker = {});

  /// Commit: Acquiring{sandbox, epoch} -> Held{sandbox, worker, epoch, now_ns + ttl}, epoch
  /// unchanged. Validity is re-checked at the moment of the grant: refused acquiring_expired
  /// if now_ns >= deadline. Idempotent if already Held by sandbox at epoch.
  /// Refusals: bad_request, unknown_name, not_acquiring, not_holder, stale_epoch,
  /// acquiring_expired, table_full (worker table).
  Outcome commit(NameId name, SandboxId sandbox, Epoch epoch, WorkerId worker, std::int64_t now_ns,
                 std::int64_t ttl_ns = 0);

  // -- heartbeat (DESIGN.md "lockd") --

  /// Refreshes a batch of leases held through `worker`: each entry that is Held by
  /// entry.sandbox at entry.epoch on `worker` and not expired at now_ns gets expiry =
  /// now_ns + ttl (idempotent under a fixed epoch: repeating it only moves the expiry). A
  /// lease with now_ns >= expiry is never refreshed back to life: it answers lost. The batch
  /// also counts as a heartbeat of `worker` (preemptible mode liveness).
  /// `answers.size()` must be >= `entries.size()`. Returns bad_request (nothing changed) if
  /// entries.size() > kRefreshBatchMax, answers is too small, worker is nil or ttl_ns >
  /// max_ttl_ns; otherwise none, with one answer per entry.
  Refusal refresh(WorkerId worker, std::span<const RefreshEntry> entries, std::int64_t now_ns,
                  std::span<RefreshAnswer> answers, std::int64_t ttl_ns = 0);

  /// A worker heartbeat without leases: `worker` is live until now_ns +
  /// worker_liveness_ttl_ns. Refusals: bad_request (nil), table_full (kWorkersMax workers).
  Refusal worker_heartbeat(WorkerId worker, std::int64_t now_ns);

  /// Whether `worker`'s liveness has not lapsed at now_ns.
  bool worker_alive(WorkerId worker, std::int64_t now_ns) const noexcept;

  // -- giving names back --

  /// Release by the holder: Held{sandbox, epoch} -> Free, epoch unchanged, no lock-delay
  /// (the holder cooperated). Also aborts a 2-phase acquisition: Acquiring{sandbox, epoch}
  /// -> Free (the epoch stays burned). Refusals: unknown_name, not_held, transferring,
  /// not_holder, stale_epoch, expired.
  Outcome release(NameId name, SandboxId sandbox, Epoch epoch, std::int64_t now_ns);

  /// Reclaims every deadline <= now_ns, in deadline order: Held past expiry -> Free (epoch
  /// unchanged; lock-delay until expiry + lock_delay_ns if configured), Acquiring past
  /// its deadline -> Free (its epoch stays burned), a pending revoke past its bound -> Free
  /// without it, a transfer guard past its bound -> lifted (still Transferring; completable),
  /// a lapsed reservation -> Free unreserved (all three epoch unchanged). Appends at
  /// most `limit` Expiry records to `expired` and returns how many it appended; call again
  /// while it returns `limit`. Also ends plain lock-delays (not reported): the record is
  /// dropped, or its reservation's TTL starts.
  std::size_t advance(std::int64_t now_ns, std::vector<Expiry>& expired,
                      std::size_t limit = kAdvanceBatchMax);

  // -- transfer (DESIGN.md: BeginTransfer / CompleteRelease / Acquire(by `to`)) --

  /// Held{from, epoch} -> Transferring{from, to, epoch, epoch + 1}: the new epoch is
  /// allocated here, so `from`'s token is fenced out at once. Nobody may mutate until `to`
  /// acquires. The transfer guard starts here (LockState::revoke_pending while Transferring):
  /// `from` may still run, so the transfer cannot complete until `from`'s worker confirms
  /// the kill of the grant at `epoch` (`confirm_kill`), or until the old grant would have
  /// ended by lockd's own rules, whichever is first: lease mode, its expiry + lock_delay_ns;
  /// preemptible mode, now_ns + worker_liveness_ttl_ns + lock_delay_ns (as `revoke`).
  /// Refusals: bad_request (nil/equal sandboxes), unknown_name, not_held,
  /// acquiring, transferring, not_holder, stale_epoch, expired, epoch_exhausted.
  /// `to_worker`: the worker `to` runs on; the reservation is for (to, to_worker) (nil: any
  /// worker, as for a reservation restored from a store that did not record one).
  Outcome begin_transfer(NameId name, SandboxId from, Epoch epoch, SandboxId to,
                         std::int64_t now_ns, WorkerId to_worker = {});

  /// Transferring{from, to, _, new_epoch} -> Free{new_epoch (fresh), reserved_for = to}:
  /// `from` confirms it stopped. `epoch` is the transfer's new epoch (begin_transfer's
  /// answer). Idempotent once done. Refused lock_delay while the transfer guard is pending
  /// (state.lock_delay_until_ns is its bound). Refusals: unknown_name, not_transferring,
  /// not_holder, stale_epoch, lock_delay. (`to` then calls acquire / acquire_2pc and gets new_epoch; others get
  /// `reserved` until the reservation lapses, config.reservation_ttl_ns after now_ns.)
  Outcome complete_release(NameId name, SandboxId from, Epoch epoch, std::int64_t now_ns);

  // -- coordinator actions (no cooperation of the holder needed) --

  /// Revoke: Held / Acquiring / Transferring -> Free{epoch + 1 (fresh)}, no reservation. The
  /// old holder's token is fenced out at once, but the name is not grantable (lock_delay)
  /// while the old holder may still run (Chubby's lock-delay): until its worker confirms the
  /// kill (`confirm_kill`), or until the old grant would have ended by lockd's own rules,
  /// whichever is first:
  ///  - Held, lease mode: its expiry + lock_delay_ns;
  ///  - Held, preemptible mode: now_ns + worker_liveness_ttl_ns + lock_delay_ns, fixed (it
  ///    does not move while that worker heartbeats: a worker that keeps beating but gets no
  ///    answer has its kill-switch fire within its TTL <= the liveness TTL of its last
  ///    acknowledged beat, which was sent before the revoke; an answer sent after the revoke
  ///    lists the name as not held, and its supervisor kills it at once);
  ///  - Acquiring: its commit deadline (no confirmation: no worker is known);
  ///  - Transferring: the transfer guard's bound, and its worker's confirmation, if the guard
  ///    is still pending; nothing if it was lifted (the old holder is dead).
  /// A bound already passed leaves no pending revoke. `expected_epoch` (0: any) must be the
  /// current epoch, so the caller knows the epoch the revoke produces (expected_epoch + 1)
  /// before it is applied. A Free name is refused not_held unless `force`: then it burns an
  /// epoch and keeps a pending lock-delay or revoke. Refusals: bad_request, unknown_name,
  /// stale_epoch, not_held, epoch_exhausted.
  Outcome revoke(NameId name, std::int64_t now_ns, Epoch expected_epoch = 0, bool force = false);

  /// The revoked holder's worker confirms that the sandbox of the revoked grant (`epoch`) is
  /// dead: lifts the pending revoke at once (a reservation's TTL starts now), or, Transferring,
  /// the transfer guard of the outgoing grant (`epoch` = old_epoch). Accepted only
  /// from that worker for that epoch. Idempotent: with no revoke pending, nothing changes and
  /// the answer is none. Refusals: unknown_name, not_holder (another worker, or a revoke no
  /// confirmation can lift), stale_epoch (a revoke of another epoch is pending).
  Outcome confirm_kill(NameId name, WorkerId worker, Epoch epoch, std::int64_t now_ns);

  /// Reassign: Free -> Free{epoch + 1 (fresh), reserved_for = to}. Creates the record if the
  /// name is unknown. A pending lock-delay or revoke is kept; the reservation's TTL starts when
  /// it ends (now_ns if none). Refusals: invalid_name, bad_request (nil), name_collision, not_free,
  /// expired, table_full, epoch_exhausted.
  /// `worker`: the worker `to` runs on (nil: any); see begin_transfer.
  Outcome reassign(std::string_view name, SandboxId to, std::int64_t now_ns, WorkerId worker = {});

  /// Preempt (preemptible mode only): Held{holder, epoch} -> Free, epoch unchanged (the next
  /// grant takes epoch + 1), lock-delay as for an expiry. Allowed when the worker's
  /// liveness lapsed at now_ns, or when the caller asked the live worker and it reported the
  /// sandbox not running (`worker_reports_not_running`). `holder` and `epoch` are what the
  /// caller observed, so a preemption decided against an older grant cannot free a newer one.
  /// Refusals: wrong_mode, unknown_name, not_held, acquiring (never while Acquiring),
  /// transferring, not_holder, stale_epoch, worker_alive.
  Outcome preempt(NameId name, SandboxId holder, Epoch epoch, bool worker_reports_not_running,
                  std::int64_t now_ns);

  // -- queries --

  /// The state of `name`; an unknown name is Free at the high-water mark (known = false).
  LockState state(NameId name) const noexcept;
  /// may_mutate(state(name), sandbox, epoch, now_ns).
  bool may_mutate(NameId name, SandboxId sandbox, Epoch epoch, std::int64_t now_ns) const noexcept;
  /// token_authorized on the token's name, and not expired at now_ns.
  bool token_authorized(const Token& token, std::int64_t now_ns) const noexcept;
  /// valid_fence(state(name), epoch).
  bool valid_fence(NameId name, Epoch epoch) const noexcept;

  std::size_t size() const noexcept;      ///< records in the table
  std::size_t held() const noexcept;      ///< records in Held
  /// The earliest time (ns) `advance` may have something to do, kNoExpiry if nothing is armed.
  /// May be earlier than the next real expiry (a refreshed lease's old entry), never later.
  std::int64_t next_due_ns() const noexcept;
  /// The simulator ablation this build of the table was compiled with ("" in every production
  /// build; "refresh_owner" or "acquiring_expiry" in the leasehold_lockd_sim_ablate_* targets,
  /// lockd/CMakeLists.txt). A simulator checks it to know the ablated code is the one linked.
  static std::string_view sim_ablation() noexcept;
  /// The largest epoch ever allocated (durable; epochs continue above it after restart).
  Epoch epoch_high_water() const noexcept;
  /// Bytes of memory the table owns (slots, timers, worker table), for capacity planning.
  std::size_t memory_bytes() const noexcept;
  /// Calls `fn` for every record (unspecified order). `fn` must not modify the table.
  void for_each(const std::function<void(NameId, const LockState&)>& fn) const;

  // -- restart (DESIGN.md "Time": after a lockd restart) --

  /// The durable content: every record except Acquiring ones, and the high-water mark,
  /// as of the last `advance` (a Held lease past expiry that advance has not reclaimed yet
  /// is still exported as Held, as lockd's store would still have it).
  DurableSnapshot export_durable() const;
  /// As above, but as of now_ns: a Held lease with now_ns >= expiry is exported as expired
  /// (not at all: a plain Free name is the same as an unknown one), so a restart from this
  /// snapshot cannot revive it. A store written incrementally has the first form's window:
  /// a lease that expired just before a crash, whose Free record was not yet durable, is
  /// held again for one TTL after restart. That costs availability, not exclusivity: the
  /// holder's supervisor killed the sandbox before lockd's expiry (DESIGN.md "Time").
  DurableSnapshot export_durable(std::int64_t now_ns) const;

  /// Replaces the content of this (empty) table with `snapshot` at restart time now_ns:
  /// every Held lease counts as refreshed at now_ns (expiry = now_ns + max_ttl_ns, so a
  /// lease is never shortened; its worker counts as live from now_ns for its liveness TTL),
  /// except that a record's restore_left_ns >= 0 caps both at now_ns + restore_left_ns (the
  /// caller's proof that no holder can still rely on more); Acquiring records are
  /// dropped (their epochs stay burned); epochs continue above max(high-water, any record
  /// epoch). Lock-delays are not durable; a pending revoke, and a Transferring record's
  /// transfer guard, wait a full max_ttl_ns + lock_delay_ns from now_ns (preemptible mode,
  /// with a worker: worker_liveness_ttl_ns + lock_delay_ns), or the worker's confirmation; a
  /// reservation gets a fresh reservation_ttl_ns. Ok, or corrupt naming the bad record (the
  /// table is then left empty), or invalid_argument for a table that is not empty or a
  /// negative now_ns.
  Status restore(const DurableSnapshot& snapshot, std::int64_t now_ns);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold
