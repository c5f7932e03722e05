// leasehold/lockd: the lock service — the name table behind an authenticated datagram endpoint.
//
// LockService is a core without syscalls: it never reads a clock, opens a file or a socket, or
// starts a thread. Its driver delivers datagrams (on_datagram) and ticks it (tick), each with
// the turn's `now_ns`; it sends through a DatagramPort (io/ports.hpp) and makes ownership
// changes durable through a DurabilityPort (durability.hpp). It authenticates and decodes
// datagrams (wire/replay.hpp), applies them to the pure LeaseTable (lease/), and answers.
// Production driver: LockdDaemon (daemon.hpp: the io_uring loop, a UDP socket, the SQLite
// StoreThread, the log on stderr); the simulator drives the same class on simulated time.
//
// The durability rule (DESIGN.md "lockd"): every ownership change — grant, 2-phase acquire,
// commit, release, transfer begin/complete/accept, revoke, reassign, preempt, expiry — gets a
// change sequence number and goes into the next store batch. An answer that depends on the
// table while some change is not yet durable is held back until the store reports "durable up
// to" that change, so nobody ever learns of a grant (or an epoch) that a crash could undo.
// Heartbeat answers are exempt: a refresh is in memory only (that is why refreshes are cheap),
// and a holder can only refresh a grant it has been told of, which was durable first.
//
// Expiry is driven by LeaseTable::advance() every kTickNs and before every datagram is served
// (so a request that queued behind a stall meets the expiries that fell due meanwhile); expiries
// are ownership changes too.
//
// Preemptible mode: a 2-phase acquire of a name held on a lapsed worker preempts it; on a live
// worker, lockd asks the worker (IsRunning to the worker's last heartbeat address) and
// preempts when it answers "not running". The acquirer is refused `held` meanwhile and retries.
// A worker heartbeat carries names the worker believes it holds; its answer lists those that
// are not held by that sandbox at that epoch on that worker any more (revoked, preempted,
// transferred away, unknown after a restart), and the supervisor kills them. Nothing per worker
// is remembered for it, so a lost answer or a lockd restart loses nothing: the next beat that
// carries the name asks again.
//
// The restart rule (DESIGN.md "Time", "lockd": a restart never shortens a lease and never
// extends a dead holder's lease without bound). A restart cannot know which holders are alive,
// so it restores every Held lease as refreshed at the restart - but only for what is left of a
// TTL counted from the incarnation after the one in which lockd last acknowledged the lease's
// worker. Durable facts (StoreMarks, O(workers) + O(restarts) rows, never O(refreshes)):
//   lived/<n>  a lower bound of how long incarnation n served (written with every store batch,
//              and while leases are held at least every lived-checkpoint interval,
//              lived_checkpoint_interval_ns: ttl/4 clamped to [10 ms, 100 ms]);
//   seen/<w>   the last incarnation that acknowledged worker w: a refreshed heartbeat entry or a
//              worker heartbeat answered to w, or a grant / commit / transfer accept to w.
//              The first such answer to w in an incarnation is held back until its mark is
//              durable (the grants are durable anyway), later ones go out at once.
// At restart (incarnation K), a Held lease on worker w with a = seen/w (K-1 when w has no
// mark) gets  left = TTL - sum(lived/j for a < j < K)  (preemptible mode: the worker liveness
// TTL, for the worker's liveness), expiring at once when that is <= 0.
// Why no live holder is expired before its kill-switch fired: every acknowledgement w's
// supervisor holds was sent by an incarnation <= a (a later one would have made a later mark
// durable first), so it measures from a send s before incarnation a+1 started, and kills by
// s + kill_after + margins < s + TTL (the start-up safety condition). Incarnations a+1..K-1
// served at least sum(lived) between them, so now >= s + sum(lived) and the restored expiry
// now + TTL - sum(lived) >= s + TTL: no earlier than the expiry of an ordinary refresh that
// lockd received at s. The bound for a holder that died: its name is free once lockd has
// served a TTL in total since the incarnation after the worker's last acknowledgement, plus
// at most one lived-checkpoint interval (and that checkpoint's commit) lost per crash; so a
// lockd restarting more often than the TTL frees it too, as long as each incarnation serves
// longer than that. The interval is short (at most 100 ms) because a crash loses it whole: with
// ttl/4, leaders failing over every 600 ms under a 3 s TTL added nothing each and kept a dead
// holder's name for ever; 100 ms costs at most ten small commits a second, and only while
// leases are held and no batch of changes carried the mark anyway. The same
// rule serves a failover: the new lockd sums durations measured by the old ones, never
// compares their clocks.
//
// Revoke (DESIGN.md "lockd"): the table keeps a revoked name unavailable (lock-delay) until the
// revoked holder's worker confirms the kill (KillConfirmed) or the old grant would have ended.
// lockd pushes the revocation to that worker at once (Revoked, to the address its heartbeats
// come from, or before its first heartbeat that of its first acquire or commit), retried every kRevokePushRetryNs until the worker answers or the revoke is no
// longer pending; its heartbeat answers say `lost` as well, whichever arrives first.
//
// Bounds: the pending store batch (kStoreBatchChangesMax), answers held for durability
// (kDeferredAnswersMax), outstanding IsRunning questions, remembered worker addresses
// (--max-workers), names (--max-names). Past a bound a request is answered Error{overloaded}
// before it changes anything.
#pragma once

#include "leasehold/io/ports.hpp"
#include "leasehold/wire/protocol.hpp"
#include "leasehold/wire/replay.hpp"
#include "leasehold/wire/token.hpp"
#include "leasehold/lease/lease_table.hpp"
#include "leasehold/lockd/config.hpp"
#include "leasehold/lockd/durability.hpp"
#include "leasehold/lockd/store.hpp"
#include "leasehold/metrics/exposition.hpp"

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace leasehold::lockd {

inline constexpr std::int64_t kTickNs = 2'000'000;            ///< expiry / housekeeping cadence
inline constexpr std::size_t kDeferredAnswersMax = 65'536;    ///< answers waiting for durability
inline constexpr std::size_t kChangesPerRequestMax = 4;       ///< preempt + grant, with margin
inline constexpr std::size_t kIsRunningOutstandingMax = 1024; ///< open questions to workers
inline constexpr std::int64_t kIsRunningTimeoutNs = 1'000'000'000;
inline constexpr std::size_t kExpiriesPerTickMax = 4096;
inline constexpr std::int64_t kRevokePushRetryNs = 100'000'000;  ///< Revoked resent this often
inline constexpr std::size_t kRevokePushesMax = 65'536;          ///< revocations being pushed
/// Waiters (wire::Wait): at most this many in one name's FIFO, of one worker (so that one
/// worker's key cannot take every place), and in all FIFOs together; a Wait past a bound is
/// answered Error{overloaded} naming it.
inline constexpr std::size_t kWaitersPerNameMax = 1024;
inline constexpr std::size_t kWaitersPerWorkerMax = 4096;
inline constexpr std::size_t kWaitersMax = 65'536;

/// Restored expiries are spread over this fraction of the TTL (1/8): a restart or a takeover
/// restores every Held lease at one instant, and without it all of them would expire (or be
/// refreshed) together.
inline constexpr std::int64_t kRestoreSpreadDivisor = 8;
/// How much later than the restart rule's expiry the restored lease of `name` expires: a
/// deterministic fraction of [0, ttl_ns / kRestoreSpreadDivisor) by the name's id. Only ever
/// added: a restored lease is never shorter than the rule makes it, so no holder loses time
/// it relies on; a dead holder's name is freed at most ttl_ns / kRestoreSpreadDivisor later.
std::int64_t restored_expiry_spread_ns(NameId name, std::int64_t ttl_ns) noexcept;

/// The restart rule's lived-checkpoint interval for a TTL (ns): how often, while leases are held
/// and no batch of changes carried one, lockd makes a `lived/<incarnation>` mark durable.
/// ttl_ns / 4 clamped to [10 ms, 100 ms]: a crash (or a lost leadership) loses at most this and
/// the checkpoint's commit of the served time a dead holder's name is freed after.
constexpr std::int64_t lived_checkpoint_interval_ns(std::int64_t ttl_ns) noexcept {
  constexpr std::int64_t kMin = 10'000'000, kMax = 100'000'000;
  const std::int64_t q = ttl_ns / 4;
  return q < kMin ? kMin : (q > kMax ? kMax : q);
}

/// Counters of one lockd (stats answer, tests). Monotonic since start unless noted.
struct ServiceCounters {
  std::array<std::uint64_t, 32> refusals{};  ///< by Refusal value
  std::uint64_t grants = 0;
  std::uint64_t refresh_entries = 0;
  std::uint64_t refresh_refreshed = 0;
  std::uint64_t refresh_lost = 0;
  std::uint64_t refresh_unknown = 0;
  std::uint64_t heartbeats = 0;             ///< heartbeat datagrams
  std::uint64_t expiries = 0;
  std::uint64_t preemptions = 0;
  std::uint64_t is_running_sent = 0;
  std::uint64_t is_running_answers = 0;
  std::uint64_t worker_beat_names = 0;      ///< names carried by worker heartbeats
  std::uint64_t worker_beat_not_held = 0;   ///< of those, answered "no longer yours"

  std::uint64_t overloaded = 0;             ///< requests answered Error{overloaded}
  std::uint64_t answers_deferred = 0;
  std::uint64_t answers_resent = 0;
  std::uint64_t sends_failed = 0;
  std::uint64_t encode_failed = 0;
  std::uint64_t key_rejected_notices = 0;   ///< key-rejected notices sent (rate-limited)
  std::uint64_t unexpected_messages = 0;    ///< answers nobody asked for, is_running to lockd
  std::uint64_t forbidden = 0;              ///< requests refused: the key gives no power over it
  std::uint64_t key_reloads = 0;              ///< SIGHUP: a new key set in force
  std::uint64_t key_reloads_refused = 0;   ///< SIGHUP: the key set did not load; the old one stays
  std::uint64_t answers_unsigned = 0;       ///< answers dropped: no key to sign them with
  std::uint64_t refreshes_per_s = 0;        ///< per second over the last 10 s, rounded up (gauge)
  std::uint64_t revokes = 0;                ///< revokes applied
  std::uint64_t revoke_pushes_sent = 0;     ///< Revoked datagrams sent (with retries)
  std::uint64_t revoke_pushes_acked = 0;    ///< Revoked answered by the worker
  std::uint64_t revoke_ended_kill_confirmed = 0;  ///< pending revokes and transfer guards lifted
                                                  ///< by KillConfirmed (or its worker's Release)
  std::uint64_t revoke_ended_lease_expired = 0;   ///< pending revokes whose bound passed
  std::uint64_t kill_confirms_refused = 0;  ///< KillConfirmed from another worker / epoch
  std::uint64_t reservations_lapsed = 0;
  std::uint64_t not_leader_answers = 0;     ///< requests answered not_leader (a follower on etcd)
  std::uint64_t other_shard_answers = 0;    ///< of those, for a name of another shard (--shards > 1)
  std::uint64_t mixed_shard_refused = 0;    ///< heartbeats refused: their names were of several shards
  std::uint64_t tokens_signed = 0;          ///< grant answers carrying a signed token
  std::uint64_t token_sign_failures = 0;    ///< grants answered without one: OpenSSL failed
  std::uint64_t waits_queued = 0;           ///< Waits that joined a FIFO of waiters
  std::uint64_t waiters_granted = 0;        ///< waiters granted the name (2-phase) from a FIFO
  std::uint64_t waiters_lapsed = 0;         ///< waiters dropped: no Wait re-sent within their TTL
  std::uint64_t waiters_left = 0;           ///< waiters that left (Release with epoch 0)
  std::uint64_t waiter_renewals = 0;        ///< heartbeat entries at epoch 0 (a waiter's place)
  std::uint64_t waiters_refused = 0;        ///< waiters passed over: the table refused them the name
  std::uint64_t waits_refused_full = 0;     ///< Waits refused: a FIFO or all of them at their bound
};

/// What the daemon read from the store before the service starts (Store::load()).
struct RestoredTable {
  StoredTable stored;
  std::uint64_t incarnation = 1;  ///< the store's open count (1 = fresh store)
};

/// The service's own identity on the wire, drawn by its driver (production: RAND_bytes and
/// wire::seq_seed(); the simulator: from its seed).
struct ServiceSeeds {
  WorkerId instance;           ///< lockd's sender id (not nil)
  std::uint64_t first_seq = 1; ///< the first seq lockd's own datagrams carry (1 .. 2^63-1)
  /// Wall-clock ns (CLOCK_REALTIME domain) for the informational issued_at of grant tokens;
  /// nothing is timed by it. Empty: CLOCK_REALTIME (production); a simulator passes its own.
  std::function<std::int64_t()> wall_ns;
};

class LockService {
 public:
  /// Rebuilds the table from `restored` at `now_ns` (every held lease refreshed at `now_ns`,
  /// capped by the restart rule above). No I/O: `net` and `store` are used from the first
  /// on_datagram / tick on (both must outlive the service). Throws std::runtime_error naming
  /// the cause on a bad key set or a store whose rows do not rebuild a table.
  /// `keys`: the cluster key(s) (worker keys are derived from them per sender) and admin keys
  /// (wire/auth.hpp); at least one cluster key, the first one signs lockd's own datagrams. A
  /// datagram authenticates only with the key derived for the worker it claims to be, or with an
  /// admin key.
  LockService(const LockdConfig& cfg, const std::vector<wire::WireKey>& keys, const RestoredTable& restored,
              DatagramPort& net, DurabilityPort& store, std::int64_t now_ns, const ServiceSeeds& seeds);
  /// Replaces the keys (a rotation, on SIGHUP): from the next datagram on, tags under any of
  /// `keys` are accepted and tags under a key no longer among them are dropped (counted
  /// reject_unknown_key). Worker keys are derived again as needed; leases, replay windows and
  /// cached answers stay. Errors (then the old keys stay): as ClusterKeyring::replace.
  /// Logs event=keys_reloaded with the loaded key ids.
  Status reload_keys(const std::vector<wire::WireKey>& keys, std::int64_t now_ns);
  LockService(const LockService&) = delete;
  LockService& operator=(const LockService&) = delete;

  /// lockd on etcd (leadership.hpp), a lockd that does not lead: from now on every request is
  /// answered Error{not_leader, `leader`} (the leader's ADDR:PORT, "" while none is known) and
  /// changes nothing; Stats is still answered (this lockd's own counters). The daemon builds a
  /// follower as a service with an empty table and a store that takes nothing.
  void set_not_leader(std::string leader) { not_leader_ = std::move(leader); }
  /// lockd on etcd: a follower that won the election and is loading the table (Stats shows
  /// `takeover_loading` 1); it answers not_leader meanwhile.
  void set_loading(bool loading) noexcept { loading_ = loading; }
  bool follower() const noexcept { return not_leader_.has_value(); }
  /// lockd on etcd with several shards (cfg.shards > 1): the advertised addresses of every
  /// shard's leader ("" = none known; one per shard; ShardLeaders). A request for a name of
  /// another shard than cfg.shard is answered Error{not_leader, that shard's leader} (never
  /// `self`, this lockd's own advertised address: then no hint), before anything else, by a
  /// leader and a follower alike; it changes nothing and is not cached. A heartbeat whose names
  /// are of several shards is refused whole with Error{unsupported} (wire/shard_route.hpp).
  void set_shard_leaders(std::vector<std::string> leaders, std::string self) {
    shard_leaders_ = std::move(leaders);
    self_address_ = std::move(self);
  }

  /// The key that signs every grant's fencing token (wire/token.hpp); nullptr: grants carry no
  /// token. Set before serving.
  void set_token_signer(std::shared_ptr<const token::TokenSigner> signer) { signer_ = std::move(signer); }

  /// One datagram from `from`, received at `now_ns` (the turn's clock reading). Answers go out
  /// through the DatagramPort, now or (ownership changes) after they are durable. Ignored once
  /// failed().
  void on_datagram(std::span<const std::uint8_t> bytes, const SocketAddress& from, std::int64_t now_ns);
  /// Housekeeping at `now_ns`: applies the verdicts the DurabilityPort has, expiry and the
  /// periodic work when due (at most once per kTickNs), submits the pending changes and marks,
  /// sends the answers that became durable. Returns the time (ns) at which it next has
  /// time-driven work (an expiry, a push, a question timeout, a checkpoint; >= now_ns + kTickNs
  /// after periodic work ran): a simulator jumps there. A driver may call earlier, and calls
  /// again after every on_datagram and every durability verdict (their work is not timed).
  /// Once failed() it does nothing and returns now_ns.
  std::int64_t tick(std::int64_t now_ns);
  /// True once a verdict was not `durable` (the store failed or rejected a change): nothing
  /// that depended on that change or a later one was answered; the driver stops (lockd exits 1)
  /// and a restart recovers from the store. failure() says why.
  bool failed() const noexcept { return failed_; }
  std::string failure() const { return failure_; }
  /// Orderly stop: from now on the next tick submits everything pending with how long this
  /// incarnation served. drained() once all of it is durable and its answers were sent.
  void begin_drain();
  bool drained() const noexcept;
  /// How long the driver may wait (ns) before the next tick, at most kTickNs.
  std::int64_t wait_ns(std::int64_t now_ns) const noexcept;
  /// Moves the log lines ready to write (one logfmt line per durable ownership change, the
  /// restore and key reload events) into `out`. The driver writes them (production: stderr).
  void take_log(std::string& out);
  /// The driver's count of log lines its writer dropped (stderr not read), for the stats answer
  /// (`log_lines_dropped`).
  void set_log_lines_dropped(std::uint64_t n) noexcept { log_lines_dropped_ = n; }

  const ServiceCounters& counters() const noexcept { return counters_; }
  /// Every counter and gauge of this lockd, named once (DESIGN.md "Observability"): appended to
  /// `out` in the order the Stats answer gives them (configuration first). /metrics exports
  /// them all; the Stats answer is built from the same list (stats_answer).
  void metric_samples(std::vector<metrics::Sample>& out) const;
  /// metric_samples() as a StatsAnswer: in order, a reason as key "<name>_<reason>" and only
  /// when not zero, as many as fit one datagram (a key that does not fit is passed over).
  /// With `first` (a paged Stats request): the counters of that list from index `first` on, in
  /// a row, as many as fit; empty past the end.
  wire::StatsAnswer stats_answer(std::optional<std::uint16_t> first = std::nullopt) const;
  /// Whether this lockd serves requests now: not when its store failed, while it loads the table
  /// of a won election, or as a follower of a cluster. `why` (if given): "serving", or the reason.
  bool serving(std::string* why = nullptr) const;
  /// At most one log line event=datagram_rejected (a datagram under a wrong key) per this long.
  static constexpr std::int64_t kKeyRejectLogIntervalNs = 1'000'000'000;
  const LeaseTable& table() const noexcept { return table_; }
  /// Store open count (1 = fresh store): an incarnation number for logs and tests.
  std::uint64_t incarnation() const noexcept { return incarnation_; }
  /// Highest change seq the DurabilityPort reported durable (every seq up to it is).
  std::uint64_t durable_seq() const noexcept { return durable_seq_; }

 private:
  /// Who sent a request, as its key proves it (answers are signed with the same key).
  struct Caller {
    WorkerId id;
    std::uint16_t key_id = 0;
    wire::Authority authority = wire::Authority::none;
  };
  struct Deferred {
    std::uint64_t seq = 0;  ///< sent once every seq up to it is durable
    SocketAddress to;
    Caller caller;
    std::uint64_t request_id = 0;
    wire::RequestKey key;
    wire::Body body;
    bool cache = true;      ///< false: a heartbeat answer (never cached)
  };
  struct Push {  ///< a Revoked being pushed to the revoked holder's worker
    WorkerId worker;
    Epoch epoch = 0;      ///< the revoked grant's
    Epoch new_epoch = 0;
    std::uint64_t request_id = 0;
    std::int64_t next_send_ns = 0;
  };
  /// One sandbox waiting for a name (wire::Wait), in its name's FIFO.
  struct Waiter {
    SandboxId sandbox;
    WorkerId worker;              ///< the worker it will run on; the grant is bound to it
    Caller caller;                ///< whose key seals the Grant pushed to it
    SocketAddress from;           ///< its latest Wait's source address
    std::uint64_t request_id = 0; ///< its latest Wait's request id (the pushed Grant answers it)
    std::int64_t lapse_ns = 0;    ///< its place is dropped at this time unless a Wait is re-sent
  };
  struct WaitQueue {
    std::string name;              ///< the name's text (a grant creates the record from it)
    std::deque<Waiter> waiters;    ///< first = next to be granted
    std::int64_t wake_ns = 0;      ///< armed in queue_wakes_ for this time (0: none)
  };
  struct Question {  ///< an IsRunning sent to a worker
    NameId name;
    SandboxId sandbox;
    Epoch epoch = 0;
    std::int64_t deadline_ns = 0;
    WorkerId worker;  ///< asked; only its answer counts
  };
  void rebuild(const RestoredTable& restored, std::int64_t now_ns);
  /// Applies the verdicts the store has; false once a change was not durable.
  bool apply_verdicts();
  void dispatch(wire::Message& m, const wire::RequestKey& key, const SocketAddress& from,
                std::int64_t now_ns);
  /// Refusal::forbidden if a worker's key gives no power over what `m` asks (another worker's
  /// name, or acting as another worker); none otherwise. Admin keys may do everything.
  Refusal authorize(const Caller& caller, const wire::Message& m) const;
  void send_now(const SocketAddress& to, std::uint64_t request_id, const wire::RequestKey* key,
                const wire::Body& body);
  /// Answers now, or after the pending changes are durable (see the durability rule).
  void answer_gated(const SocketAddress& to, std::uint64_t request_id, const wire::RequestKey& key,
                    wire::Body body);
  /// Seals with the key of `caller_` (the request being answered) or, for lockd's own requests
  /// to a worker, with that worker's key.
  bool seal_for(const Caller& to, std::uint64_t request_id, const wire::Body& body, wire::Datagram& out);
  /// lockd's own request to a worker (IsRunning): signed with that worker's key, not cached.
  void send_to_worker(const WorkerId& worker, const SocketAddress& to, std::uint64_t request_id,
                      const wire::Body& body);
  bool overloaded() const noexcept;

  // request handlers: return the answer body
  wire::Body on_acquire(const wire::Acquire& a, std::int64_t now_ns);
  wire::Body on_commit(const wire::Commit& c, std::int64_t now_ns);
  /// A Wait: granted now (2-phase) when the name is grantable and nobody waits; else the
  /// sandbox joins (or keeps its place in) the name's FIFO and the answer is Queued.
  wire::Body on_wait(const wire::Wait& w, const SocketAddress& from, std::uint64_t request_id,
                     std::int64_t now_ns);
  /// A Release with epoch 0: `sandbox` leaves the FIFO of `name` (and gives back a grant it
  /// got from it and has not committed). Only the waiter's own worker may.
  wire::Body leave_queue(const wire::Release& r, WorkerId worker, std::int64_t now_ns);
  /// Grants `name` to the first waiter whose place has not lapsed, if the table lets it have
  /// the name now (2-phase: Acquiring, a new epoch), and pushes that Grant to it once durable;
  /// drops lapsed waiters met on the way; arms a wake-up for when it may succeed.
  void serve_queue(NameId name, std::int64_t now_ns);
  /// The answer to a heartbeat entry at epoch 0 from `worker`: `queued` with the time its
  /// place is now kept when `sandbox` waits for `name` on that worker (its place is renewed by
  /// ttl_ns), else `lost` with the name's holder and epoch (the supervisor then sends a Wait,
  /// which re-joins the FIFO or answers the grant it was pushed).
  wire::HeartbeatAckEntry renew_waiter(NameId name, const SandboxId& sandbox, WorkerId worker,
                                       const SocketAddress& from, std::int64_t ttl_ns, std::int64_t now_ns);
  /// serve_queue for every FIFO whose wake-up is due.
  void serve_due_queues(std::int64_t now_ns);
  /// Drops the lapsed places of one FIFO, wherever they stand in it (counted waiters_lapsed).
  void drop_lapsed(WaitQueue& q, std::int64_t now_ns);
  /// Drops every lapsed place from every FIFO (those behind a live waiter included), before a
  /// Wait is refused at a bound that counts only live places. O(waiters).
  void drop_lapsed_waiters(std::int64_t now_ns);
  /// Counts `w` out of waiters_ and waiters_of_ (it is leaving its FIFO).
  void forget_waiter(const Waiter& w);
  wire::Queued queued_answer(NameId name, std::size_t position, const WaitQueue& q, std::int64_t now_ns) const;
  void on_heartbeat(const wire::Heartbeat& h, WorkerId worker, const SocketAddress& from,
                    std::uint64_t request_id, std::int64_t now_ns);
  /// Preemptible mode: the answer to a worker heartbeat (liveness already counted), listing the
  /// names it carries that this worker's sandboxes no longer hold.
  wire::WorkerAck worker_ack(const wire::WorkerHeartbeat& w, std::int64_t now_ns);
  /// `worker`: the worker the request speaks for (nil for an admin key): a Release of a revoked
  /// or transferred-away grant from its own worker is that worker's kill confirmation.
  wire::Body on_release(const wire::Release& r, WorkerId worker, std::int64_t now_ns);
  wire::Body on_transfer_begin(const wire::TransferBegin& t, std::int64_t now_ns);
  wire::Body on_transfer_complete(const wire::TransferComplete& t, std::int64_t now_ns);
  wire::Body on_transfer_accept(const wire::TransferAccept& t, std::int64_t now_ns);
  wire::Body on_revoke(const wire::Revoke& r, std::int64_t now_ns);
  wire::Body on_reassign(const wire::Reassign& r, std::int64_t now_ns);
  wire::Body on_list(const wire::List& l, std::int64_t now_ns) const;
  wire::Body on_show(const wire::Show& s, std::int64_t now_ns) const;
  /// Sandboxes in `name`'s FIFO (lapsed places not yet dropped included, as in Queued).
  std::uint32_t waiters_for(NameId name) const;
  void on_running_answer(const wire::RunningAnswer& a, std::uint64_t request_id, std::int64_t now_ns);
  wire::Body on_kill_confirmed(const wire::KillConfirmed& k, WorkerId worker, std::int64_t now_ns);
  void on_revoked_ack(const wire::RevokedAck& a, std::uint64_t request_id);
  /// Starts pushing the pending revoke of `id` (state `s`) to its revoked worker.
  void push_revoke(NameId id, const LockState& s, std::int64_t now_ns);
  /// Sends the pushes that are due; drops those whose revoke is no longer pending.
  void send_pushes(std::int64_t now_ns);
  void note_revoke_end(NameId id, Epoch epoch, wire::RevokeEnd how);

  /// Preemptible mode, an acquire refused `held`: preempt now (lapsed worker) or ask the worker.
  bool try_preempt(NameId id, const LockState& s, std::int64_t now_ns);
  void ask_is_running(NameId id, const LockState& s, std::int64_t now_ns);

  wire::Body deny(const Outcome& o);
  /// The Grant answer of `o` (every grant path answers through here). Its token carries every
  /// field but the signature (all zero): signing (Ed25519, tens of microseconds) waits until
  /// the turn's batch is with the store (sign_deferred), so it runs while the commit does;
  /// seal_for signs whatever is still unsigned when it goes out.
  wire::Body grant(const Outcome& o, std::int64_t now_ns);
  /// Signs `body`'s token if it is a Grant whose token is not signed yet (a failure leaves the
  /// Grant without a token, counted). Returns whether it changed `body`.
  bool sign_grant(wire::Body& body);
  /// Signs the tokens of the answers deferred since the last call (deferred_unsigned_).
  void sign_deferred();
  wire::NameRecord record_of(NameId id, const LockState& s, std::int64_t now_ns) const;
  const std::string& text_of(NameId id) const;

  /// Queues the durable form of `s` (the state of `id` after a change) and logs it.
  void record_change(NameId id, const LockState& s, const char* event, std::int64_t now_ns,
                     const char* extra = nullptr);
  void expire(std::int64_t now_ns);
  /// The restart rule: the change seq after which an acknowledgement of `worker` may be sent
  /// (its seen mark for this incarnation is then durable); queues the mark the first time.
  std::uint64_t note_seen(WorkerId worker);
  /// Sends a heartbeat or worker heartbeat answer now, or once `seq` is durable.
  void answer_after(std::uint64_t seq, const SocketAddress& to, std::uint64_t request_id, wire::Body body);
  /// As answer_after, sealed for `as` instead of the request being served (a pushed Grant).
  void answer_as_after(const Caller& as, std::uint64_t seq, const SocketAddress& to, std::uint64_t request_id,
                       wire::Body body);
  /// Hands the pending changes and marks to the store thread (if it takes them); with
  /// `checkpoint` also when nothing changed (then only how long this incarnation served).
  void submit_pending(std::int64_t now_ns, bool checkpoint);
  void housekeeping(std::int64_t now_ns);
  /// What tick() returns: when the next time-driven work is due (>= next_tick_ns_).
  std::int64_t next_tick_wanted_ns() const noexcept;
  /// Moves the change lines whose change is durable into the ready log.
  void flush_log(std::uint64_t durable_seq);

  LockdConfig cfg_;
  std::shared_ptr<const token::TokenSigner> signer_;
  DatagramPort& net_;
  DurabilityPort& store_;
  LeaseTable table_;
  wire::ClusterKeyring* keys_;  ///< owned by receiver_
  wire::Receiver receiver_;
  wire::Sender sender_;
  /// The request being handled (set per datagram; a deferred answer restores its own).
  Caller caller_;
  std::uint64_t incarnation_ = 0;
  std::int64_t now_ns_ = 0;  ///< the clock reading of the call being served
  std::function<std::int64_t()> wall_ns_;  ///< ServiceSeeds::wall_ns

  // Ownership changes not yet handed to the store, and their sequence numbers. Every change and
  // every first seen mark takes a seq, and so does a lived checkpoint or the drain at stop (those
  // two carry only marks; no answer waits for them).
  std::vector<StoredName> pending_;
  std::uint64_t change_seq_ = 0;     ///< last seq allocated
  std::uint64_t depend_seq_ = 0;     ///< last seq of a change or mark an answer may depend on
  std::uint64_t submitted_seq_ = 0;  ///< last seq handed to the store
  std::uint64_t durable_seq_ = 0;    ///< every seq up to it is durable
  std::deque<std::uint64_t> in_flight_;  ///< last seq of each batch submitted, not yet durable
  std::vector<DurabilityVerdict> verdicts_;  ///< scratch for poll()
  bool failed_ = false;
  std::string failure_;
  /// A datagram dropped for its key (unknown_key: no such key id for its sender; bad_tag: the
  /// tag does not check, a wrong key or altered bytes): one log line event=datagram_rejected
  /// naming the source address, the sender and the key id it claims, at most one per
  /// kKeyRejectLogIntervalNs; the line says how many went unlogged since the previous one.
  /// Under the same bound (one limiter: a flood of forgeries gets one line and one notice a
  /// second), a request is also answered with the unauthenticated key-rejected notice
  /// (wire::KeyRejected, 47 bytes, never more than the datagram that caused it) to its source.
  void log_key_reject(wire::DecodeError reason, std::span<const std::uint8_t> bytes, const SocketAddress& from,
                      std::int64_t now_ns);
  std::int64_t key_reject_logged_ns_ = 0;   ///< when the last such line was written (0: never)
  std::uint64_t key_rejects_unlogged_ = 0;  ///< rejections for a key since that line, not logged
  std::optional<std::string> not_leader_;  ///< set: a follower (set_not_leader)
  bool loading_ = false;                   ///< set_loading
  std::vector<std::string> shard_leaders_;  ///< set_shard_leaders
  std::string self_address_;                ///< set_shard_leaders
  std::deque<Deferred> deferred_;
  /// Answers at the back of deferred_ that sign_deferred() has not seen yet.
  std::size_t deferred_unsigned_ = 0;

  // The restart rule (see the top of this file).
  std::int64_t started_ns_ = 0;
  std::int64_t lived_interval_ns_ = 0;
  std::int64_t next_lived_ns_ = 0;
  StoreMarks marks_;                                       ///< not yet handed to the store
  std::unordered_map<WorkerId, std::uint64_t> seen_seq_;   ///< worker -> seq of its mark here

  /// Text of every name the table knows (a superset: dropped records are pruned lazily),
  /// ordered by NameId so a list page is a lower_bound and a short walk.
  std::map<NameId, std::string> names_;
  std::unordered_map<WorkerId, SocketAddress> worker_addresses_;
  /// The key id each worker last used (authenticated), so lockd's own requests to it (Revoked,
  /// IsRunning) use a key it has during a rotation. Bounded by cfg_.max_workers.
  std::unordered_map<WorkerId, std::uint16_t> worker_key_ids_;
  std::unordered_map<std::uint64_t, Question> questions_;  ///< by IsRunning request id
  std::unordered_set<NameId> asked_;                        ///< names with an open question
  std::unordered_map<NameId, Push> pushes_;                 ///< pending revokes being pushed
  std::unordered_map<std::uint64_t, NameId> push_ids_;      ///< Revoked request id -> name
  /// How the lock-delay of each name's latest revoke ended, with the epoch it produced
  /// (informational, for `show` / `revoke --wait`; cleared past kRevokePushesMax entries).
  std::unordered_map<NameId, std::pair<Epoch, wire::RevokeEnd>> revoke_ended_;
  std::uint64_t next_request_id_ = 1;
  /// FIFOs of waiters by name (only names someone waits for), their wake-ups (time, name; an
  /// entry whose time is not its queue's wake_ns is stale) and the number of waiters in all.
  std::unordered_map<NameId, WaitQueue> queues_;
  std::priority_queue<std::pair<std::int64_t, NameId>, std::vector<std::pair<std::int64_t, NameId>>,
                      std::greater<>> queue_wakes_;
  std::size_t waiters_ = 0;
  std::unordered_map<WorkerId, std::size_t> waiters_of_;  ///< waiters by the worker they run on

  std::vector<Expiry> expired_;
  std::int64_t next_tick_ns_ = 0;      ///< expiry and housekeeping not before (kTickNs cadence)
  std::int64_t next_push_ns_ = kNoExpiry;      ///< earliest Revoked push due
  std::int64_t next_question_ns_ = kNoExpiry;  ///< earliest IsRunning deadline
  /// refreshes_per_s over the last kRateWindows one-second windows (refreshes, window length).
  static constexpr std::size_t kRateWindows = 10;
  std::array<std::uint64_t, kRateWindows> rate_refreshes_{};
  std::array<std::int64_t, kRateWindows> rate_spans_ns_{};
  std::size_t rate_next_ = 0;
  std::int64_t rate_window_start_ns_ = 0;
  std::uint64_t rate_window_refreshes_ = 0;
  std::string log_;  ///< lines ready to write (durable changes)
  std::uint64_t log_lines_dropped_ = 0;  ///< set by the driver (set_log_lines_dropped)
  /// Change lines waiting for their change to be durable: a line is logged only for a change
  /// that happened, so the log never shows a grant that a crash or a store failure undid.
  std::deque<std::pair<std::uint64_t, std::string>> log_pending_;
  ServiceCounters counters_;
};

}  // namespace leasehold::lockd
