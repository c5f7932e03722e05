// leasehold/sim: one supervisor in the simulated world, built from the real supervisor logic:
// HeartbeatSchedule (supervisor/heartbeat.hpp: valid_until = send of the last acknowledged
// refresh + kill_after; lost / unknown kill at once), the DeadlineWheel the rt thread fires kill
// deadlines from (supervisor/deadline_wheel.hpp, round down, lazy re-arm), and the wire protocol
// of LockdLink (io/replay.hpp Sender: every retry a fresh seq; answers authenticated with the
// worker's own key; a lease measured from the first attempt's send).
//
// What the daemon around them does is reproduced here in its order: create a named sandbox
// (acquire, then spawn with the epoch published in its shm slot; or a 2-phase acquire, the
// sandbox scheduled, then commit), heartbeat rounds, the rt
// thread's kill (revoke the slot, then kill the process), release after a sandbox's exit, and
// release of a grant that came back after its call gave up. Preemptible mode (SimConfig::
// preemptible()): every create is 2-phase, the sandbox starts unpublished under the worker's
// kill deadline before its Commit goes out and is published on the Held answer; worker beats
// carry liveness (HeartbeatSchedule's worker-wide kill-switch); lockd's IsRunning is answered.
// This is a replica of Supervisor::Impl's order, not that code: an ablation of supervisor.cpp
// is not seen here until the node drives the supervisor's own core.
//
// No I/O: datagrams go out through SupervisorEnv, time comes in as `now_ns` (this worker's own
// clock, ns), spawn and kill go to the world's sandbox host.
#pragma once

#include "leasehold/wire/auth.hpp"
#include "leasehold/lease/types.hpp"
#include "leasehold/sim/rng.hpp"
#include "leasehold/sim/world.hpp"

#include <cstdint>
#include <memory>
#include <span>
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
  /// A line for the trace: what happened, with two numbers.
  virtual void note(std::uint32_t worker, std::string_view what, std::uint64_t a, std::uint64_t b) = 0;
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

  /// The shm check of a sandbox runtime (leasehold_check_deadline): its slot has an epoch
  /// published and now_ns < valid_until. Sets *name / *epoch when it passes.
  bool check_deadline(SandboxId sandbox, std::int64_t now_ns, NameId* name, Epoch* epoch) const;

  /// This worker's id.
  WorkerId id() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace leasehold::sim
