// leasehold/supervisor: the phase of one sandbox on its supervisor (DESIGN.md "creation flows").
//
// One enum holds where a sandbox is in its life; every change goes through advance(), which
// aborts the process on a transition the table below does not allow (a supervisor that lost
// track of a sandbox's phase could answer IsRunning wrongly or start a command unwatched).
//
//   reserved ──► acquiring ──► gated ──► running ◄──► committing
//      │             │           │          │              │
//      └─────────────┴───────────┼──────────┼──► (synthetic: no process, no gate)
//                                ▼          ▼              ▼
//                             aborted    killing ◄─────────┘
//                                │          │
//                                ▼          │
//                             aborting      │
//                                │          │
//                                └──► exited ◄
//
//   phase       what holds                                     IsRunning  list "state"
//   reserved    slot claimed; an expect-commit waits for the   no         acquiring
//               next heartbeat tick; an unnamed run's spawn
//   acquiring   its Acquire (lease-mode expect-commit: its     no         acquiring
//               Commit) is in flight; no process yet
//   gated       child created in its leaf, armed, stopped at   no         acquiring
//               its gate before exec (inside one spawn call)
//   aborted     the gate closed before exec (start failed,     no         acquiring
//               the deadline passed, rt queue full): its
//               command never ran; waits for the child's exit
//   aborting    aborted, and a kill was asked meanwhile        no         acquiring
//   committing  preemptible: runs its command with its epoch   "running"  committing
//               unpublished; its Commit is in flight
//   running     runs its command (named and published, or      "running"  running
//               unnamed); a name may be being acquired for it
//   killing     it ran and a kill was asked (control kill or   "running"  killing
//               release, heartbeat answer, revoke, shutdown,
//               a failed Commit); not yet exited
//   exited      its pidfd reported the exit; waits for the rt  no         exited
//               thread's disarm, then is reaped and forgotten
//
// IsRunning (lockd asks before it preempts) is answered "running" for exactly the phases in
// which the command may have executed and has not been seen to exit (conservative: killing
// counts), for the name_id and epoch of its grant (preemptible: the acquiring one).
//
// What the heartbeats carry is the HeartbeatSchedule's (heartbeat.hpp), keyed by the phase:
//   lease-mode heartbeat   the lease from its grant (acquiring → gated) until the exit, a kill
//                          decision of a heartbeat answer, or a revoke removes it: phases gated,
//                          aborted, aborting, running, killing.
//   worker beat            (preemptible) committed leases only: running and killing sandboxes
//                          whose Commit lockd acknowledged. A committing sandbox is kept by worker
//                          liveness (the worker-wide kill-switch covers it) but not carried, since
//                          lockd still has the name Acquiring.
// Facts that are not phases stay with the sandbox: `pending_name` (the name its Commit is for,
// set from committing until the Commit's answer, also when killed meanwhile), `armed` (the rt
// thread has its slot), `rt_killed` (the rt thread killed it), `revoked` (lockd revoked its grant).
#pragma once

#include "leasehold/lease/assert.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace leasehold {

enum class SandboxPhase : std::uint8_t {
  reserved,
  acquiring,
  gated,
  aborted,
  aborting,
  committing,
  running,
  killing,
  exited,
};
inline constexpr std::size_t kSandboxPhaseCount = 9;

/// One row of the phase table: its name, the `state` the control socket's list shows, whether
/// IsRunning answers "running", and the phases it may advance to (bit i: SandboxPhase i).
struct SandboxPhaseRow {
  SandboxPhase phase;
  const char* name;
  const char* list_state;
  bool answers_running;
  std::uint16_t next;
};

namespace phase_detail {
constexpr std::uint16_t bit(SandboxPhase p) { return static_cast<std::uint16_t>(1u << static_cast<unsigned>(p)); }
template <typename... P>
constexpr std::uint16_t bits(P... p) { return static_cast<std::uint16_t>((0u | ... | bit(p))); }
using P = SandboxPhase;
}  // namespace phase_detail

inline constexpr std::array<SandboxPhaseRow, kSandboxPhaseCount> kSandboxPhases = {{
    // reserved: acquire sent; child created; or (synthetic) started at once.
    {SandboxPhase::reserved, "reserved", "acquiring", false,
     phase_detail::bits(phase_detail::P::acquiring, phase_detail::P::gated, phase_detail::P::running,
                        phase_detail::P::committing)},
    {SandboxPhase::acquiring, "acquiring", "acquiring", false,
     phase_detail::bits(phase_detail::P::gated, phase_detail::P::running, phase_detail::P::committing)},
    // gated: released to exec (its Commit next, if pending), or the start was abandoned.
    {SandboxPhase::gated, "gated", "acquiring", false,
     phase_detail::bits(phase_detail::P::running, phase_detail::P::committing, phase_detail::P::aborted)},
    {SandboxPhase::aborted, "aborted", "acquiring", false,
     phase_detail::bits(phase_detail::P::aborting, phase_detail::P::exited)},
    {SandboxPhase::aborting, "aborting", "acquiring", false, phase_detail::bits(phase_detail::P::exited)},
    // committing: acknowledged (or, naming a running sandbox, refused: it runs on unnamed).
    {SandboxPhase::committing, "committing", "committing", true,
     phase_detail::bits(phase_detail::P::running, phase_detail::P::killing, phase_detail::P::exited)},
    // running: naming it in preemptible mode commits it again.
    {SandboxPhase::running, "running", "running", true,
     phase_detail::bits(phase_detail::P::committing, phase_detail::P::killing, phase_detail::P::exited)},
    {SandboxPhase::killing, "killing", "killing", true, phase_detail::bits(phase_detail::P::exited)},
    {SandboxPhase::exited, "exited", "exited", false, 0},
}};

constexpr bool sandbox_phase_table_in_order() {
  for (std::size_t i = 0; i < kSandboxPhaseCount; ++i)
    if (static_cast<std::size_t>(kSandboxPhases[i].phase) != i) return false;
  return true;
}
static_assert(sandbox_phase_table_in_order(), "kSandboxPhases rows must be in SandboxPhase order");
static_assert(static_cast<std::size_t>(SandboxPhase::exited) + 1 == kSandboxPhaseCount);

constexpr const SandboxPhaseRow& phase_row(SandboxPhase p) { return kSandboxPhases[static_cast<std::size_t>(p)]; }
constexpr const char* to_string(SandboxPhase p) { return phase_row(p).name; }
/// IsRunning's answer for a sandbox in phase `p` whose grant matches the question.
constexpr bool answers_running(SandboxPhase p) { return phase_row(p).answers_running; }
constexpr bool may_advance(SandboxPhase from, SandboxPhase to) {
  return (phase_row(from).next & phase_detail::bit(to)) != 0;
}
/// Nothing asked of the host yet: no process, no deadline (a failure forgets the sandbox).
constexpr bool before_spawn(SandboxPhase p) { return p == SandboxPhase::reserved || p == SandboxPhase::acquiring; }
/// Its command runs and no kill was asked: it may be named, killed, committed.
constexpr bool runs_unkilled(SandboxPhase p) { return p == SandboxPhase::running || p == SandboxPhase::committing; }
/// Its command has not started and it has not exited: no IsRunning "running", no control kill.
constexpr bool never_started(SandboxPhase p) {
  return p == SandboxPhase::reserved || p == SandboxPhase::acquiring || p == SandboxPhase::gated ||
         p == SandboxPhase::aborted || p == SandboxPhase::aborting;
}
/// A kill was asked and it has not exited yet.
constexpr bool kill_asked(SandboxPhase p) { return p == SandboxPhase::aborting || p == SandboxPhase::killing; }
/// A kill was asked (or it is gone): a further kill request changes nothing.
constexpr bool kill_asked_or_gone(SandboxPhase p) {
  return p == SandboxPhase::aborting || p == SandboxPhase::killing || p == SandboxPhase::exited;
}

/// Moves `phase` to `to`; an illegal transition is a supervisor bug: it prints both names and
/// aborts (LEASEHOLD_ASSERT).
inline void advance(SandboxPhase& phase, SandboxPhase to) {
  if (!may_advance(phase, to)) [[unlikely]]
    std::fprintf(stderr, "leasehold-supervisor: illegal sandbox phase transition %s -> %s\n", to_string(phase),
                 to_string(to));
  LEASEHOLD_ASSERT(may_advance(phase, to));
  phase = to;
}

}  // namespace leasehold
