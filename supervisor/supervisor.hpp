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
//
// Creation flows (control socket, see control.hpp for the JSON):
//   run {name}      claim a slot → acquire from lockd (preemptible: 2-phase acquire + commit)
//                   → cgroup leaf + child blocked before exec → publish slot, arm deadline →
//                   release the child. A refused acquire starts nothing (holder + epoch returned).
//   run {}          an unnamed sandbox: claimed slot, no epoch, no deadline.
//   name            acquire for a running unnamed sandbox, then publish + arm.
//   expect-commit   the name is Acquiring for `sandbox` at `epoch` (acquired by a control plane);
//                   the next heartbeat tick sends Commit{worker}; the sandbox starts only once
//                   lockd granted it.
// Exit (pidfd readable): reap → disarm the rt thread → free the slot (cooldown) → remove the
// cgroup leaf → release the name to lockd.
//
// Preemptible mode: the worker-liveness heartbeat carries every committed lease; when worker
// liveness lapses the kill-switch kills every named sandbox and named creation is refused until
// a liveness beat sent after it is acknowledged. Creation and the kill-switch are serialised on
// the io thread; a create that races the rt thread's kill still cannot run unwatched, because the
// child is in its cgroup and its slot is armed before it is allowed to exec.
#pragma once

#include "supervisor/config.hpp"

#include <memory>
#include <string>

namespace leasehold {

class Supervisor {
 public:
  /// Validates the config, loads the key, probes io_uring, creates the shm table (refused while
  /// a live writer owns it), starts the rt thread, opens the control socket and checks that
  /// lockd answers. Returns nullptr with `error` set (and nothing left behind) on failure.
  static std::unique_ptr<Supervisor> create(SupervisorConfig config, std::string& error);
  ~Supervisor();

  /// Runs until SIGTERM/SIGINT (then a clean shutdown). Returns the process exit code.
  int run();

  /// The start-up summary (worker id, shm path, control socket, cgroup mode, rt mode, pause
  /// budget, ...), several lines.
  std::string summary() const;

  struct Impl;

 private:
  explicit Supervisor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold
