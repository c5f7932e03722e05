// leasehold/supervisor: leasehold-supervisor, one per worker (DESIGN.md "The supervisor").
//
// Assembles the parts:
//   io thread (the caller of run()): one EventLoop (io_uring) with the UDP channel to lockd
//     (LockdLink: heartbeats, acquire/commit/release, lockd's IsRunning questions), the
//     control socket (ControlServer, polled through the ring), one pidfd poll per sandbox,
//     a signalfd (SIGTERM/SIGINT: clean shutdown; SIGCHLD: reap re-parented orphans — the
//     supervisor is a child subreaper), and the heartbeat cadence (a periodic timer).
//     It owns the HeartbeatSchedule, extends valid_until in the shm table and in the rt
//     thread's per-slot deadline, and applies kill decisions.
//   rt thread (RtKillSwitch): the deadline wheel and the kill-switch.
// The sandbox logic below (creation flows, stops, exits, heartbeat answers, lockd's requests) is
// SupervisorCore's (supervisor_core.hpp), which reaches the parts above only through the ports
// (ports.hpp); Supervisor itself keeps start-up, signals, the worker lock, key reloads, the
// control socket's plumbing and the status and list answers.
//
// Creation flows (control socket, see control.hpp for the JSON):
//   run {name}      lease mode: claim a slot → acquire from lockd → publish slot → create the
//                   child in its cgroup leaf, unable to exec until released (prepare_sandbox) →
//                   arm the rt deadline (target: leaf + pidfd) → if that deadline has not passed,
//                   release the child to exec (release_sandbox); else it never runs (answered
//                   `killswitch`). So the kill-switch watches the command from its first
//                   instruction whatever happens to the io thread meanwhile. A refused acquire
//                   starts nothing (holder + epoch returned).
//                   preemptible mode: claim a slot → 2-phase acquire (lockd: Acquiring, which it
//                   never preempts) → kill-switch check → start the sandbox with its epoch NOT
//                   published (its check says "not valid") under the worker's kill deadline,
//                   armed before its exec as in lease mode →
//                   Commit{worker} (lockd: Held on this worker) → publish the epoch → answer.
//                   So whenever lockd has the name Held here, the sandbox already runs and
//                   IsRunning says so; a failed Commit stops the sandbox and gives the name back.
//   run {}          an unnamed sandbox: claimed slot, no epoch, no deadline.
//   name            acquire for a running unnamed sandbox, then publish + arm (preemptible:
//                   2-phase acquire → Commit → publish; it runs throughout).
//   expect-commit   the name is Acquiring for `sandbox` at `epoch` (acquired by a control plane);
//                   lease mode: the next heartbeat tick sends Commit{worker} and the sandbox
//                   starts once lockd granted it; preemptible mode: the next tick starts it
//                   unpublished, then commits, as for run.
// The other control ops - list, status, release, kill and logs (a sandbox's output, from its log
// file) - are served also while the supervisor shuts down; the three above are refused then.
// list, release, kill and logs act only on the caller's own sandboxes (root: on any).
// IsRunning (lockd asks before preempting): "running" for a sandbox that was started and has not
// exited (also while its Commit is in flight or it is being killed), for the name and epoch of its
// grant; "not running" before it was started and after it exited. Each sandbox is in one phase
// (sandbox_phase.hpp: the phases, their legal transitions and which answer IsRunning "running").
// Exit (pidfd readable): reap → disarm the rt thread → free the slot (cooldown) → remove the
// cgroup leaf → release the name to lockd.
//
// Preemptible mode: the worker-liveness heartbeat keeps every committed lease, and carries a
// rotating window of them (at most kWorkerBeatEntriesMax names per beat); lockd's answer lists
// those no longer held by their sandbox on this worker (revoked, preempted, transferred away),
// which are killed at once. When worker liveness lapses the kill-switch kills every named
// sandbox (also those whose Commit is in flight) and named creation is refused until a liveness
// beat sent after it is acknowledged. Creation and the kill-switch are serialised on
// the io thread; a create that races the rt thread's kill cannot run unwatched, because the child
// is in its cgroup leaf and its slot is armed before it is allowed to exec. A start that fails after
// the arm (exec failed, deadline passed, rt queue full) closes the gate; the child's exit, like any
// exit, disarms, reaps, frees the slot, removes the leaf, gives the name back and answers the error.
// Ablation for the attack tests: LEASEHOLD_ABLATE=arm-after-exec (the child execs first, then is
// armed); test hook: LEASEHOLD_TEST_STALL_AFTER_SPAWN_MS (the io thread sleeps right after arming).
#pragma once

#include "leasehold/lease/result.hpp"
#include "leasehold/metrics/exchange.hpp"
#include "leasehold/supervisor/config.hpp"

#include <functional>
#include <memory>
#include <string>

namespace leasehold {

class Supervisor {
 public:
  /// Validates the config, loads the key, probes io_uring, creates the shm table (refused while
  /// a live writer owns it), starts the rt thread, opens the control socket and checks that
  /// lockd answers. On failure nothing is left behind and the Status says what and why:
  /// invalid_argument (a flag or the key file's kind), permission_denied (a directory, socket or
  /// key path a sandbox could reach), unsupported (io_uring, isolation, bwrap), busy (another
  /// live supervisor has this worker id), io_error, refused (lockd unreachable, in another mode,
  /// or with a shorter TTL).
  static Result<std::unique_ptr<Supervisor>> create(SupervisorConfig config);
  ~Supervisor();

  /// Runs until SIGTERM/SIGINT (then a clean shutdown). Returns the process exit code.
  /// Tells systemd READY=1 when it starts serving (and STOPPING=1, WATCHDOG=1: io/service_notify.hpp).
  int run();

  /// Called on the io thread at each SIGHUP, after the key file was read again: the program's
  /// re-read of its configuration (supervisor/main.cpp: the log level). Set it before run().
  void set_reload_hook(std::function<void()> hook);

  /// Publishes a snapshot for /metrics and /healthz into `exchange` whenever its HTTP side asks
  /// (the io loop polls its eventfd; DESIGN.md "Observability"). Before run(); `exchange`
  /// outlives the supervisor.
  void serve_metrics(metrics::SnapshotExchange& exchange);

  /// The start-up summary (worker id, shm path, control socket, cgroup mode, rt mode, pause
  /// budget, ...), several lines.
  std::string summary() const;

  struct Impl;

 private:
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold
