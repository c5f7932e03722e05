// leasehold/supervisor: the ports the supervisor's sandbox logic drives (DESIGN.md "The
// supervisor", issue 16's "cores without syscalls").
//
// The sandbox logic (creation flows, the 2-phase acquire and commit, heartbeat answers, kill
// decisions, exits, revocations) talks to the outside only through these interfaces:
//
//   SandboxHost   creates a sandbox stopped at its gate, releases it to exec, abandons, kills
//                 and reaps it; its exit comes back as a call (the exit handler given to the
//                 host). Production: OsSandboxHost (os_sandbox_host.hpp: cgroup leaf, pipes,
//                 log file, token channel, clone3, pidfd poll).
//   LockdPort     one request to lockd with a deadline; the callback runs once with the answer
//                 or the failure. Production: LockdLink (lockd_link.hpp).
//   RtPort        the rt thread's commands (arm, disarm, kill now) and the per-slot deadline it
//                 re-reads (lazy re-arm); its kill records come back as RtKillEvents the daemon
//                 pops. Production: RtThreadPort (rt_thread_port.hpp: RtThread + the deadlines).
//   ControlPort   one answer line to a control client. Production: ControlServer (control.hpp).
//   SlotTable     the supervisor's writes to its shm table (claim, publish, extend, revoke, free,
//                 the heartbeat statistics). Production: ShmSlotTable (over shm::TableWriter).
//
// Every time is CLOCK_BOOTTIME ns (`_ns`) as the daemon read it; an error is a ControlError
// (control_error.hpp) and a message naming the problem.
#pragma once

#include "leasehold/io/client.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/control_error.hpp"
#include "leasehold/supervisor/kill_switch.hpp"
#include "leasehold/supervisor/rt_thread.hpp"
#include "leasehold/wire/protocol.hpp"

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace leasehold {

/// Identifies one control connection for a delayed answer. Never reused within a process.
using ControlClientId = std::uint64_t;

/// Why a port could not do what was asked: the control error to answer with, and why.
struct PortError {
  ControlError code = ControlError::internal;
  std::string message;
};

// ---- SandboxHost ---------------------------------------------------------------------------

/// What the host needs to create one sandbox.
struct SandboxSpec {
  SandboxId id;
  std::uint32_t slot = 0;                ///< its slot in the shm table (LEASEHOLD_SLOT)
  Epoch epoch = 0;                       ///< LEASEHOLD_EPOCH (0: unnamed)
  std::optional<std::string> name;       ///< LEASEHOLD_NAME, once the name is published
  std::vector<std::string> argv;         ///< non-empty
  std::vector<std::string> env;          ///< "K=V"
  std::string cwd;                       ///< its working directory ("" = "/")
  uid_t caller_uid = static_cast<uid_t>(-1);  ///< who asked (its isolation derives from it)
  gid_t caller_gid = static_cast<gid_t>(-1);
  /// PR_SET_PDEATHSIG(SIGKILL): it dies with the supervisor. False only for a sandbox started
  /// unnamed under --on-shutdown keep, which is then never named (a named process must not
  /// outlive the kill-switch that watches its lease).
  bool die_with_supervisor = true;
};

/// A created sandbox.
struct HostedSandbox {
  pid_t pid = -1;
  uid_t uid = static_cast<uid_t>(-1);  ///< the host uid it runs as
  std::string log_path;                ///< its stdout and stderr
  std::string cgroup_path;             ///< its cgroup leaf ("" without one)
  /// True: stopped at its gate until release() (its command has not run). False: it exec'd
  /// already (the LEASEHOLD_ABLATE=arm-after-exec order); release() and abandon() are no-ops.
  bool at_gate = true;
};

/// A reaped sandbox.
struct ReapedSandbox {
  int exit_code = -1;            ///< its exit status, or -signal; -1 if it could not be read
  bool still_populated = false;  ///< a process of it still runs in its cgroup leaf
};

/// Where sandboxes run. Single-threaded (the io thread); ids are those given to create().
class SandboxHost {
 public:
  virtual ~SandboxHost() = default;
  /// Called once per created sandbox when its first process exited (not yet reaped: reap()
  /// after the rt thread let go of its kill target).
  using ExitHandler = std::function<void(const SandboxId&)>;

  /// The sandbox's own token channel (only it inherits it). Before create().
  virtual std::optional<PortError> open_tokens(const SandboxId& id) = 0;
  /// Puts a grant's signed token into `id`'s channel; ok when `id` has no channel.
  virtual shm::TableErrc publish_token(const SandboxId& id, Epoch epoch, std::span<const std::uint8_t> token) = 0;
  virtual void clear_tokens(const SandboxId& id) = 0;
  /// Creates the sandbox's process stopped at its gate (see HostedSandbox::at_gate). On an
  /// error nothing of it is left but its token channel (forget() drops that).
  virtual std::optional<PortError> create(const SandboxSpec& spec, HostedSandbox& out) = 0;
  /// What the kill-switch kills for `id` (all -1 / 0 when it has no process).
  virtual KillTarget kill_target(const SandboxId& id) const = 0;
  /// Lets it exec, unless `exec_by_ns` (0: no limit) has passed when it would: the last instant
  /// its kill deadline leaves the rt thread time to take its arm (killswitch: its command never
  /// ran). An error when it did not run its command (it exits; its exit is reported). Not at its
  /// gate: nothing to do.
  virtual std::optional<PortError> release(const SandboxId& id, std::uint64_t exec_by_ns) = 0;
  /// Closes its gate: it exits without running its command.
  virtual void abandon(const SandboxId& id) = 0;
  /// Kills it from the calling thread (the rt thread did not or cannot).
  virtual void kill(const SandboxId& id, std::uint64_t now_ns) = 0;
  /// Asks it to stop: SIGTERM to every process of it (every pid in its cgroup leaf, not just the
  /// first: a PID namespace's init gets a signal from outside its namespace only if it handles
  /// it, so a command run as that init without a handler would otherwise never hear of it).
  /// Nothing is revoked or disarmed: a kill follows if it has not exited in time.
  virtual void terminate(const SandboxId& id) = 0;
  /// Reaps its first process, removes its leaf and forgets it - unless the leaf is still
  /// populated (ReapedSandbox::still_populated): then the leaf is kept (killed again) until
  /// leaf_emptied() sees it empty.
  virtual ReapedSandbox reap(const SandboxId& id) = 0;
  /// After a reap that left its leaf populated: kills the leaf again and true once it is empty
  /// (the leaf removed and the sandbox forgotten then). True if nothing of it is left.
  virtual bool leaf_emptied(const SandboxId& id) = 0;
  /// Forgets it without reaping (it runs on, unwatched; a populated leaf stays).
  virtual void forget(const SandboxId& id) = 0;
};

// ---- LockdPort ---------------------------------------------------------------------------

/// Answer of one call. `body` is set when status == answered and the answer authenticated
/// and decoded; `problem` says what went wrong otherwise.
struct LockdReply {
  RequestStatus status = RequestStatus::deadline_passed;
  std::optional<wire::Body> body;
  std::int64_t first_send_ns = 0;  ///< the first attempt's send: a lease is measured from it
  std::uint32_t attempts = 0;
  std::string problem;
  std::uint16_t key_id = 0;  ///< answered: the key id the answer was authenticated with
  /// When the callback runs (the caller's "now" for what it does with the answer).
  std::int64_t now_ns = 0;
  bool ok() const noexcept { return body.has_value(); }
};
using LockdCallback = std::function<void(LockdReply)>;

/// Requests to lockd. lockd's own requests (IsRunning, Revoked) and answers that came after
/// their call gave up reach the sandbox logic as calls of their own.
class LockdPort {
 public:
  virtual ~LockdPort() = default;
  /// Sends `body` (retried until `deadline_ns`); `on_done` runs exactly once, later, on the
  /// caller's thread.
  virtual void call(const wire::Body& body, std::int64_t deadline_ns, LockdCallback on_done) = 0;
  /// call() of the Heartbeat {ttl_cap_ms, entries} (at most kHeartbeatEntriesMax entries, one
  /// shard's). This default builds that Heartbeat; LockdLink encodes the entries straight into
  /// the call's datagram (wire::encode_heartbeat()).
  virtual void call_heartbeat(std::span<const wire::HeartbeatEntry> entries, std::uint32_t ttl_cap_ms,
                              std::int64_t deadline_ns, LockdCallback on_done) {
    wire::Heartbeat h;
    h.ttl_cap_ms = ttl_cap_ms;
    h.entries.assign(entries.begin(), entries.end());
    call(h, deadline_ns, std::move(on_done));
  }
};

// ---- RtPort ------------------------------------------------------------------------------

/// One kill the rt thread reports.
struct RtKillEvent {
  std::uint32_t slot = 0;
  KillRecord record;
};

/// The rt thread: it kills a slot's target at the slot's deadline whatever the caller does.
class RtPort {
 public:
  virtual ~RtPort() = default;
  /// Sets the slot's deadline (0: none) and files it with `target`; refused when the queue is
  /// full or the thread stopped.
  virtual RtSubmitted arm(std::uint32_t slot, std::uint64_t valid_until_ns, const KillTarget& target) = 0;
  /// Moves an armed slot's deadline (0: none) without a command: the thread re-reads it when
  /// the old one comes due (lazy re-arm).
  virtual void set_deadline(std::uint32_t slot, std::uint64_t valid_until_ns) = 0;
  virtual RtSubmitted disarm(std::uint32_t slot) = 0;
  virtual RtSubmitted kill_now(std::uint32_t slot) = 0;
  /// Whether the thread applied the command of `seq` (from arm/disarm/kill_now).
  virtual bool applied(std::uint64_t seq) const = 0;
  /// Stops the thread: it lets go of every target; later commands are refused.
  virtual void stop() = 0;
};

// ---- ControlPort -------------------------------------------------------------------------

/// Answers to control clients.
class ControlPort {
 public:
  virtual ~ControlPort() = default;
  /// Sends one answer line (control_ok / control_error) to `client`; dropped if it is gone.
  virtual void reply(ControlClientId client, const std::string& line) = 0;
  /// Sends a progress line (is_control_progress) to `client` before its answer; the request
  /// stays in progress. Dropped if the client is gone, or by a port that has no such lines.
  virtual void progress(ControlClientId, const std::string&) {}
  /// True when `client` has closed its connection, whether or not the event loop has seen the
  /// close yet (a long synchronous step, such as a spawn, may run between the close and its
  /// event). A port that cannot tell says false.
  virtual bool client_gone(ControlClientId) const { return false; }
};

// ---- SlotTable ---------------------------------------------------------------------------

/// The shm table as the sandbox logic writes it (shm/table.hpp: TableWriter, whose io-thread
/// calls these are). Single-threaded (the io thread).
class SlotTable {
 public:
  virtual ~SlotTable() = default;
  /// Takes a free slot for `sandbox`. Errors: as shm::TableWriter::claim (busy when no slot is
  /// free, the message saying why).
  virtual Result<shm::ClaimedSlot> claim(const SandboxId& sandbox, std::uint64_t now_ns) = 0;
  virtual shm::TableErrc publish(std::uint32_t slot, const NameId& name, const std::string& name_text, Epoch epoch,
                                 std::uint64_t valid_until_ns) = 0;
  virtual shm::TableErrc extend(std::uint32_t slot, std::uint64_t valid_until_ns) = 0;
  /// Every check of the slot fails from now on (sticky until free()).
  virtual void revoke(std::uint32_t slot) = 0;
  virtual void free(std::uint32_t slot, std::uint64_t now_ns) = 0;
  /// The sandbox `slot` was claimed for, until it is freed (nil: free, cooling or out of
  /// range). O(1): the sandbox logic cross-checks it with its own table at every bind and unbind.
  virtual SandboxId owner(std::uint32_t slot) const = 0;
  virtual void record_heartbeat_rtt_ns(std::uint64_t ns) = 0;
  virtual void record_heartbeat_failure() = 0;
};

}  // namespace leasehold
