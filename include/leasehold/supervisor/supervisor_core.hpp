// leasehold/supervisor: the sandbox logic of one supervisor, without syscalls (issue 16's
// "cores without syscalls"; DESIGN.md "The supervisor", "creation flows").
//
// SupervisorCore holds every sandbox of the worker and decides what happens to it:
//   creation flows   run, name, expect-commit (control requests): claim a slot, acquire (lease
//                    mode) or 2-phase acquire + Commit (preemptible), publish, create the child
//                    stopped at its gate, arm the rt deadline, release it to exec
//   stops            release and kill requests, heartbeat answers (lost, unknown, lapsed, a short
//                    ttl), the worker-wide kill-switch, lockd's revocations, a failed Commit,
//                    shutdown
//   exits            the host's exit event → disarm → reap → free the slot → give back the name
//                    (or confirm a revoked grant's kill)
//   lockd's requests IsRunning, Revoked, and answers that came after their call gave up
// It talks to the world only through the ports (ports.hpp: SandboxHost, LockdPort, RtPort,
// ControlPort, SlotTable) and a few hooks (logging, new ids, the command check, timers), and it
// reads no clock: every entry point takes `now_ns` (CLOCK_BOOTTIME in production), a LockdPort
// answer brings its own (LockdReply::now_ns). So the same code runs in leasehold-supervisor
// (Supervisor::Impl: start-up, signals, the worker lock, key reloads, the control socket, status)
// and under the simulator (sim/) with simulated ports. Single-threaded.
#pragma once

#include "leasehold/lease/types.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/heartbeat.hpp"
#include "leasehold/supervisor/ports.hpp"
#include "leasehold/supervisor/sandbox_table.hpp"
#include "leasehold/wire/protocol.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace leasehold {

/// What the sandbox logic needs of the supervisor's configuration.
struct SupervisorCoreConfig {
  WorkerId worker;
  SupervisorMode mode = SupervisorMode::lease;
  std::uint64_t ttl_ms = 0;                 ///< --ttl-ms (the kill-switch is timed for it)
  std::uint64_t kill_after_ms = 0;
  std::uint64_t heartbeat_interval_ms = 0;
  std::uint32_t slots = 0;
  /// The rt thread takes commands within this long (--rt-command-poll-us): an arm queued now is
  /// in its wheel by now + rt_command_poll_ns. A named sandbox may exec only while its kill
  /// deadline is further away than that, so the wheel, not a late arm, times its kill.
  std::uint64_t rt_command_poll_ns = kDefaultRtCommandPollNs;
  /// lockd's lease TTL (its maximum), from its stats at start-up (set_lockd_ttl_ms).
  std::uint64_t lockd_ttl_ms = 0;
  bool synthetic = false;         ///< leases without processes (performance mode)
  bool isolation = true;          ///< reported in a run's answer
  bool unsafe_kill = false;       ///< no unescapable kill on this worker
  bool allow_unsafe_kill = false;
  /// The supervisor's own uid: with root the only caller an expect-commit is taken from (it
  /// claims lockd's 2-phase reservation by its sandbox id and epoch, which refusals show).
  uid_t operator_uid = 0;
  std::string cgroup_reason;      ///< why the kill is what it is (named in the unsafe-kill refusal)
  ShutdownPolicy on_shutdown = ShutdownPolicy::kill;
  /// --stop-grace-ms: a release, a kill on request and a shutdown send SIGTERM first and kill
  /// (revoke + cgroup.kill) only if the sandbox has not exited this long after (0: at once). The
  /// kill-switch, lockd's revocations and the other kills never wait.
  std::uint64_t stop_grace_ms = 0;
  /// LEASEHOLD_ABLATE=shared-tokens (attack tests only): every grant's token to every sandbox.
  bool shared_tokens = false;
};

/// A sandbox gone recently, as its owner remembers it (the record `logs` reads).
struct GoneSandbox {
  SandboxId id;
  std::optional<std::string> name;
  uid_t owner = static_cast<uid_t>(-1);
  int exit_status = -1;  ///< as Sandbox::exit_code
  std::string reason;    ///< why it ended ("exited", or what killed or stopped it)
};

/// The shell's exit code for a sandbox's exit status (Sandbox::exit_code: an exit code 0..255,
/// or -N when killed by signal N): the code itself, or 128 + N.
constexpr int shell_exit_code(int exit_status) noexcept { return exit_status >= 0 ? exit_status : 128 - exit_status; }

/// What the core asks of its owner that is not a port.
struct SupervisorCoreHooks {
  /// One event line ("event=... k=v"), without time or prefix. Null: dropped.
  std::function<void(const std::string&)> log;
  /// A new sandbox id (random in production). Required.
  std::function<SandboxId()> new_sandbox_id;
  /// Whether argv[0] of a run or expect-commit resolves to an executable: ok, or why not (the
  /// message goes to the client as exec_failed). Null: every command resolves.
  std::function<Status(const ControlRequest&)> command_resolves;
  /// A sandbox is forgotten after its exit (its log file may be kept for `logs`). Its
  /// exit_code and kill_reason are final then.
  std::function<void(const Sandbox&)> gone;
  /// The record of a sandbox gone recently (what `gone` kept), for a `wait` that came after its
  /// exit. Null, or nullopt: not known (a `wait` for it is answered not_found).
  std::function<std::optional<GoneSandbox>(const SandboxId&)> recently_gone;
  /// Disarms are pending: call check_disarms() again soon (the rt thread applies commands every
  /// tick). Null: the owner polls disarms_pending().
  std::function<void()> disarm_pending;
  /// Shutting down, and something it waits for may have finished (quiescent()).
  std::function<void()> shutdown_progress;
};

class SupervisorCore {
 public:
  struct Counters {
    std::uint64_t heartbeat_datagrams = 0;
    std::uint64_t heartbeat_failures = 0;
    std::uint64_t refreshed = 0;
    std::uint64_t lost = 0;
    std::uint64_t unknown = 0;
    std::uint64_t kills_deadline = 0;
    std::uint64_t kills_request = 0;
    std::uint64_t worker_killswitch = 0;
    std::uint64_t spawned = 0;
    std::uint64_t spawn_failures = 0;
    std::uint64_t exited = 0;
    std::uint64_t acquire_refused = 0;
    std::uint64_t creates_refused_killswitch = 0;
    std::uint64_t names_released = 0;
    std::uint64_t late_grants_released = 0;
    std::uint64_t worker_beats_acked = 0;
    std::uint64_t reused_ids_refused = 0;  ///< expect-commit of a sandbox id that ran here recently
    std::uint64_t tombstones_evicted = 0;  ///< dropped before their time: kTombstonesMax reached
    std::uint64_t slots_quarantined = 0;   ///< kept revoked: a process of the sandbox outlived it
    std::uint64_t slots_released_from_quarantine = 0;  ///< freed once their leaf was empty
    std::uint64_t stops_graceful = 0;       ///< asked to stop with SIGTERM, and exited within the grace period
    std::uint64_t stops_grace_expired = 0;  ///< still running at the grace deadline: killed
    std::uint64_t waits_refused = 0;        ///< `wait` refused busy: kControlWaitsMax (per uid) reached
    std::uint64_t runs_queued = 0;          ///< runs that waited in lockd's FIFO for their name
    std::uint64_t queue_grants = 0;         ///< of those, granted the name (then started)
    std::uint64_t queue_timeouts = 0;       ///< of those, given up at their queue_timeout_ms
    std::uint64_t places_renewed = 0;       ///< waiters' places kept by a heartbeat entry
    std::uint64_t places_lost = 0;          ///< heartbeat entries finding no place (a Wait follows)
  };
  /// Deadline of an armed sandbox that has no lease (unnamed): never due.
  static constexpr std::uint64_t kNoDeadlineNs = std::uint64_t{1} << 62;
  static constexpr std::int64_t kAcquireTimeoutNs = 3'000'000'000;  ///< lockd round trip for acquire/commit
  static constexpr std::int64_t kReleaseTimeoutNs = 2'000'000'000;
  static constexpr std::size_t kPendingCommitsMax = 4096;
  /// Sandbox ids remembered as used (see tombstone_ns); about 40 bytes each.
  static constexpr std::size_t kTombstonesMax = 65536;
  /// How long a sandbox id that ran here under a grant, or whose grant this worker gave back
  /// (unnamed ones have nothing to revive and are not remembered), is refused by
  /// expect-commit after it is gone: 2 x lockd's TTL + the release call's timeout. A Release of
  /// its grant may still be on its way to lockd; a Commit of the same {name, sandbox, epoch}
  /// that overtook it would revive the grant at lockd (Commit is idempotent), and the late
  /// Release would then free the name under a sandbox that believes it holds it. After this
  /// long lockd has applied or expired that grant, and a Commit of it is refused there.
  std::uint64_t tombstone_ns() const noexcept;

  SupervisorCore(SupervisorCoreConfig config, SupervisorCoreHooks hooks, SandboxHost& host, LockdPort& lockd,
                 RtPort& rt, ControlPort& control, SlotTable& table);
  ~SupervisorCore();
  SupervisorCore(const SupervisorCore&) = delete;
  SupervisorCore& operator=(const SupervisorCore&) = delete;

  void set_lockd_ttl_ms(std::uint64_t ms) noexcept { cfg_.lockd_ttl_ms = ms; }
  const SupervisorCoreConfig& config() const noexcept { return cfg_; }

  // ---- events ------------------------------------------------------------------------------
  /// A control request: run, name, expect-commit (refused while shutting down), release, kill,
  /// wait.
  /// Other ops (list, status, logs) are the owner's: answered `internal` here.
  void on_request(ControlClientId client, ControlRequest req, std::uint64_t now_ns);
  /// The heartbeat cadence: pending commits, the worker-wide kill-switch, heartbeats, worker beat.
  void on_heartbeat_tick(std::uint64_t now_ns);
  /// The host reported the sandbox's first process exited (or, synthetic, its kill).
  void on_exit(const SandboxId& id, std::uint64_t now_ns);
  /// One kill record of the rt thread.
  void on_rt_kill(const RtKillEvent& e, std::uint64_t now_ns);
  /// Kills the sandboxes asked to stop whose grace period is over (also from on_heartbeat_tick;
  /// an owner with a finer timer calls it more often).
  void check_stops(std::uint64_t now_ns);
  /// A control connection closed: an answer owed to it by `wait` is dropped (and its wait no
  /// longer counts against kControlWaitsMax).
  void on_client_closed(ControlClientId client);
  /// `wait` requests not answered yet.
  std::size_t waits() const noexcept { return waits_.size(); }
  /// Reaps the exited sandboxes whose disarm the rt thread applied.
  void check_disarms(std::uint64_t now_ns);
  bool disarms_pending() const noexcept { return !disarming_.empty(); }
  /// lockd asks before it preempts: does the sandbox of this grant run here?
  bool is_running(const wire::IsRunning& q) const;
  /// lockd pushed a revocation; true if a sandbox of that grant runs or is being placed here.
  bool on_revoked(const wire::Revoked& q, std::uint64_t now_ns);
  /// An answer of lockd's to a call that already gave up.
  void on_late_answer(const wire::Body& answer, std::uint64_t now_ns);
  /// SIGTERM/SIGINT: answers pending commits, then kills (or, policy keep, lets go of) every
  /// started sandbox. Idempotent.
  void begin_shutdown(const char* why, std::uint64_t now_ns);
  /// Shutting down and nothing is left to wait for: no started sandbox, no release in flight.
  bool quiescent() const;
  bool shutting_down() const noexcept { return shutting_down_; }
  std::size_t releases_in_flight() const noexcept { return releases_in_flight_; }

  // ---- state -------------------------------------------------------------------------------
  const SandboxTable& sandboxes() const noexcept { return sandboxes_; }
  HeartbeatSchedule& heartbeat() noexcept { return hb_; }
  const HeartbeatSchedule& heartbeat() const noexcept { return hb_; }
  Counters& counters() noexcept { return counters_; }
  const Counters& counters() const noexcept { return counters_; }
  std::size_t pending_commits() const noexcept { return pending_commits_.size(); }
  /// A run waiting in lockd's FIFO: the name, and its place as lockd last answered it (position,
  /// waiters; 0, 0 before the first answer). nullopt: `id` is not waiting.
  struct QueuePlace {
    std::string name;
    std::uint32_t position = 0;
    std::uint32_t waiters = 0;
  };
  std::optional<QueuePlace> queue_place(const SandboxId& id) const;

 private:
  struct PendingCommit {
    ControlClientId client;
    ControlRequest request;
  };
  void log_event(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  Sandbox* find(const SandboxId& id) { return sandboxes_.find(id); }
  /// Answers client `c` (one request in progress per connection: any answer ends its wait). A
  /// queued run whose client left after lockd granted its name is stopped once it has started.
  void reply(ControlClientId c, const std::string& line);
  void progress();  // shutting down: tell the owner something finished
  void do_run(ControlClientId client, ControlRequest req);
  void do_name(ControlClientId client, ControlRequest req);
  void do_expect_commit(ControlClientId client, ControlRequest req);
  void do_release(ControlClientId client, const ControlRequest& req);
  void do_kill(ControlClientId client, const ControlRequest& req);
  void do_wait(ControlClientId client, const ControlRequest& req);
  /// A release, kill request or shutdown: SIGTERM and a grace period of `grace_ms` (capped by
  /// --stop-grace-ms) when it runs its command and has a process, else kill_sandbox at once.
  void stop_sandbox(Sandbox& s, const std::string& reason, std::uint64_t grace_ms);
  /// The grace a request asks for: its grace_ms, at most --stop-grace-ms (the default).
  std::uint64_t grace_of(const ControlRequest& req) const noexcept;
  bool may_act_on(ControlClientId client, const ControlRequest& req, const Sandbox& s);
  bool may_act_on(ControlClientId client, const ControlRequest& req, uid_t owner, const SandboxId& id);
  bool refuse_unsafe_kill(ControlClientId client, const ControlRequest& req);
  std::string ttl_refusal(const std::optional<std::uint64_t>& ttl_ms) const;
  /// Answers (and returns true) when a named create may not go on: a ttl_ms out of range, or the
  /// name held by a sandbox of this worker.
  bool refuse_name_here(ControlClientId client, const ControlRequest& req);
  bool gate_named_creation(ControlClientId client, const nlohmann::json& id);
  shm::TableErrc publish_grant(Sandbox& s, NameId name_id, const std::string& name, Epoch epoch,
                               std::uint64_t valid_until, const wire::GrantTokenBytes& token);
  void acquire_name(const SandboxId& sb, ControlClientId client, ControlRequest req);
  void on_granted(const SandboxId& sb, ControlClientId client, ControlRequest req, const wire::Grant& g,
                  std::int64_t send_ns);
  /// A run waiting in lockd's FIFO for its name (ControlRequest::queue).
  struct QueuedRun {
    SandboxId sandbox;
    ControlClientId client = 0;
    ControlRequest request;
    std::uint64_t deadline_ns = 0;   ///< give up then (0: never)
    std::uint64_t joined_ns = 0;
    std::int64_t last_send_ns = 0;   ///< the latest Wait's first send: a pushed grant's lease counts from it
    bool in_flight = false;          ///< a Wait is outstanding
    std::uint32_t position = 0;      ///< lockd's last Queued answer (0: not placed yet)
    std::uint32_t waiters = 0;
    SandboxId holder;                ///< the name's holder and epoch as that answer had them
    Epoch epoch = 0;
    std::uint32_t ticks = 0;         ///< heartbeat ticks while placed (every kWaitEveryTicks-th sends a Wait)
  };
  /// A placed run's place is renewed in the heartbeats; every this many ticks a Wait instead,
  /// whose answer tells its position (waiters ahead of it may have left without the holder
  /// changing, which the renewal's answer would not show).
  static constexpr std::uint32_t kWaitEveryTicks = 8;
  /// Why a `wait` (or a queued run, or a run to be waited for) of `uid` cannot be taken now
  /// (kControlWaitsMax in all, kControlWaitsPerUidMax per uid and kControlWaitsMax −
  /// kControlWaitsReserved for all uids but root and the supervisor's); "" when it can.
  std::string wait_refusal(uid_t uid) const;
  /// Sends (again) the Wait of a queued run; its answer is a place, or the 2-phase grant.
  void send_wait(const SandboxId& sb);
  /// lockd granted a queued run its name (2-phase, Acquiring): start it as a 2-phase acquire does
  /// in this mode (preemptible: start, then commit; lease: commit, then start).
  void on_queue_grant(const SandboxId& sb, const wire::Grant& g, std::int64_t send_ns);
  /// lockd's answer `a` to the heartbeat entry (epoch 0) that renewed a queued run's place,
  /// sent at `send_ns`: kept (`queued`; a changed holder or epoch asks for the new place with
  /// a Wait), or not in the FIFO (a Wait re-joins, or gets the grant whose push was lost).
  void on_place_renewed(const SandboxId& sb, const wire::HeartbeatAckEntry& a, std::int64_t send_ns);
  /// Leaves lockd's FIFO for a queued run given up (Release with epoch 0) and forgets it.
  void leave_queue(std::vector<QueuedRun>::iterator it);
  /// Lease mode: Commit the Acquiring grant of `req.name` at `epoch`, then on_granted (start).
  void commit_then_start(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch);
  void commit_now(const PendingCommit& pc);
  void on_acquiring(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch,
                    std::int64_t acquire_send_ns);
  void send_commit(const SandboxId& sb, ControlClientId client, ControlRequest req, Epoch epoch);
  void on_committed(const SandboxId& sb, ControlClientId client, const ControlRequest& req, const wire::Grant& g);
  void commit_failed(const SandboxId& sb, ControlClientId client, const ControlRequest& req, Epoch epoch,
                     ControlError code, const std::string& message,
                     nlohmann::json extra = nlohmann::json::object());
  void spawn(Sandbox& s, ControlClientId client, const ControlRequest& req);
  void give_back_name(Sandbox& s, ControlClientId client, const ControlRequest& req, Epoch epoch,
                      ControlError code, const std::string& message);
  void abandon(const SandboxId& sb, ControlClientId client, const nlohmann::json& id, ControlError code,
               const std::string& message, nlohmann::json extra = nlohmann::json::object());
  void release_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb, Epoch epoch,
                        std::function<void(bool, std::string)> done);
  void confirm_kill_to_lockd(const NameId& name_id, const std::string& name, const SandboxId& sb, Epoch epoch);
  void kill_sandbox(Sandbox& s, const std::string& reason);
  void exited(const SandboxId& id);
  void finish_exit(SandboxId id);  // by value: a caller may pass the id of the record it erases
  /// Remembers `id` as used until now + tombstone_ns(); buried() says whether it still is.
  /// Aborts unless the shm table and the sandbox table name the same sandbox for `slot`
  /// (SandboxTable::check_slot with SlotTable::owner; `left`: see there). O(1); called where a
  /// slot is bound to a sandbox and where it is let go.
  void check_slot(std::uint32_t slot, const SandboxId& left = {}) const;
  void bury(const SandboxId& id);
  bool buried(const SandboxId& id);
  /// Frees the quarantined slots whose leaf is empty now (each heartbeat tick).
  void release_quarantined();
  void apply(const HeartbeatAction& a);
  void send_worker_beat(std::uint64_t deadline_ns, std::vector<RefreshEntry> held);
  std::int64_t now_i() const noexcept { return static_cast<std::int64_t>(now_); }

  SupervisorCoreConfig cfg_;
  SupervisorCoreHooks hooks_;
  SandboxHost& host_;
  LockdPort& lockd_;
  RtPort& rt_;
  ControlPort& control_;
  SlotTable& table_;
  SandboxTable sandboxes_;  // by id, by slot and by name
  HeartbeatSchedule hb_;
  std::vector<wire::HeartbeatEntry> hb_entries_;  ///< the heartbeat datagram being sent; reused
  std::deque<PendingCommit> pending_commits_;
  std::vector<QueuedRun> queued_;  ///< runs waiting in lockd's FIFO (each also counts in waits_)
  /// Queued runs granted their name and not answered yet, by client; `true` once that client
  /// left (the run is then stopped as soon as its answer says it started).
  std::unordered_map<ControlClientId, std::pair<SandboxId, bool>> starting_;
  std::unordered_map<SandboxId, std::uint64_t> tombstones_;           ///< id -> refused until (ns)
  std::deque<std::pair<SandboxId, std::uint64_t>> tombstone_order_;  ///< oldest first
  struct Quarantined {  ///< a slot held for a populated leaf, and the grant its survivor ran under
    SandboxId id;
    std::uint32_t slot = 0;
    NameId name_id;  ///< nil: it was unnamed
    Epoch epoch = 0;
  };
  std::vector<Quarantined> quarantined_;
  std::vector<SandboxId> disarming_;
  std::vector<SandboxId> stopping_;  ///< sent SIGTERM, killed at their stop_deadline_ns (check_stops)
  /// Unanswered `wait` requests: the client and its uid (to bound them per uid).
  std::unordered_map<ControlClientId, uid_t> waits_;
  /// Gone named sandboxes whose Release is in flight, and the `wait`s that came meanwhile:
  /// answered with the others when lockd answers (a wait ends once the name is given back).
  struct Releasing {
    uid_t owner = static_cast<uid_t>(-1);
    std::vector<std::pair<ControlClientId, nlohmann::json>> waiters;
  };
  std::unordered_map<SandboxId, Releasing> releasing_;
  bool shutting_down_ = false;
  std::size_t releases_in_flight_ = 0;
  Counters counters_;
  /// The time of the event being handled (the entry point's now_ns, or a lockd answer's).
  std::uint64_t now_ = 0;
};

}  // namespace leasehold
