// leasehold/sim: one supervisor in the simulated world, running the supervisor's own code:
// SupervisorCore (supervisor/supervisor_core.hpp: the creation flows, the 2-phase acquire and
// commit, heartbeat answers, the worker-wide kill-switch, exits, revocations, late answers) and
// RtCore (supervisor/rt_core.hpp: the rt thread's deadline wheel, lazy re-arm, revoke-then-kill),
// over a real memfd shm table written through ShmSlotTable. The node supplies the ports:
//   SandboxHost  a sandbox is created at its gate and runs (the world's process) once released;
//                its kill goes to the world, its exit comes back as on_sandbox_exit
//   LockdPort    datagrams sealed with the worker's key, retried with a fresh seq until the
//                deadline (LockdLink's protocol), answers authenticated; late answers, IsRunning
//                and Revoked go to the core
//   RtPort       the rt thread's commands, applied at its next wake-up (within this step)
//   ControlPort  the workload's control requests: run with a name (in the seeds that queue,
//                most of them queued runs, waiting in lockd's FIFO, some with a queue timeout,
//                some whose client closes its connection while they wait), and the control
//                plane's 2-phase acquire followed by expect-commit; the operator's unnamed run
//                and name (a transfer's receiver)
// So an ablation of supervisor_core.cpp or heartbeat.cpp (supervisor/daemon.cmake) is an
// ablation of what this node runs. Preemptible mode (SimConfig::preemptible()): the node starts
// with the daemon's start-up worker beat; the core does the rest.
//
// No I/O beyond the memfd: datagrams go out through SupervisorEnv, time comes in as `now_ns`
// (this worker's own clock, ns, > 0), processes are the world's.
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/sim/rng.hpp"
#include "leasehold/sim/world.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace leasehold::sim {

/// What a supervisor asks of the world.
class SupervisorEnv {
 public:
  virtual ~SupervisorEnv() = default;
  /// A datagram to lockd.
  virtual void send_to_lockd(std::uint32_t worker, std::span<const std::uint8_t> bytes) = 0;
  /// Starts the sandbox process (lease mode: its epoch is published before this call;
  /// preemptible: it is published once the Commit is acknowledged).
  virtual void spawn(std::uint32_t worker, SandboxId sandbox, NameId name, Epoch epoch) = 0;
  /// Kills the sandbox process (its slot was revoked before this call); `why` for the trace.
  virtual void kill(std::uint32_t worker, SandboxId sandbox, std::string_view why) = 0;
  /// SIGTERM to the sandbox process (release, kill or shutdown with a grace period): its slot
  /// stays valid; it may exit by itself, or be killed at the grace deadline.
  virtual void terminate(std::uint32_t worker, SandboxId sandbox) = 0;
  /// A line for the trace: what happened, with two numbers.
  virtual void note(std::uint32_t worker, std::string_view what, std::uint64_t a, std::uint64_t b) = 0;
  /// lockd on etcd: a lockd answered not_leader naming `leader` ("" = none known); the worker's
  /// next datagrams go to that lockd (or, with none named, the next one), as LockdLink follows
  /// the hint. One lockd: never called.
  virtual void redirect(std::uint32_t worker, std::string_view leader) = 0;
};

class SupervisorNode {
 public:
  /// `names`: the name texts the workload draws from. `now_ns`: this worker's clock.
  SupervisorNode(const SimConfig& cfg, std::uint32_t index, WorkerId id, const wire::WireKey& key,
                 std::span<const std::string> names, Rng rng, SupervisorEnv& env, std::int64_t now_ns);
  ~SupervisorNode();
  SupervisorNode(const SupervisorNode&) = delete;
  SupervisorNode& operator=(const SupervisorNode&) = delete;

  /// A datagram from lockd.
  void on_datagram(std::span<const std::uint8_t> bytes, std::int64_t now_ns);
  /// The sandbox's process is gone (pidfd readable).
  void on_sandbox_exit(SandboxId sandbox, std::int64_t now_ns);
  /// Runs what is due at now_ns (rt wheel, heartbeat round, retries, workload); returns the
  /// next time (this worker's clock) it wants to run.
  std::int64_t tick(std::int64_t now_ns);

  /// The operator's `leasehold run -- CMD` on this worker (no name, so no lockd): the id of
  /// the unnamed sandbox it started, or nil if the supervisor refused (table full, ...).
  SandboxId run_unnamed(std::int64_t now_ns);
  /// The operator's `leasehold name SANDBOX NAME` on this worker (a transfer's receiver takes
  /// the name reserved for it); answered later, like any named create.
  void name_sandbox(SandboxId sandbox, const std::string& name, std::int64_t now_ns);

  /// The shm check of a sandbox runtime (leasehold_check_deadline: TableReader::
  /// check_deadline_at on its LEASEHOLD_SLOT and LEASEHOLD_EPOCH): published, not revoked,
  /// now_ns < valid_until, the writer's heartbeat fresh. Sets *name / *epoch when it passes.
  bool check_deadline(SandboxId sandbox, std::int64_t now_ns, NameId* name, Epoch* epoch) const;

  /// This worker's id.
  WorkerId id() const noexcept;

  /// The supervisor's counts of queued runs (SupervisorCore::Counters).
  struct QueuedRuns {
    std::uint64_t queued = 0;     ///< runs_queued
    std::uint64_t granted = 0;    ///< queue_grants
    std::uint64_t timed_out = 0;  ///< queue_timeouts
  };
  QueuedRuns queued_runs() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold::sim
