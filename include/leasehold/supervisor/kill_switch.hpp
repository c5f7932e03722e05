// leasehold/supervisor: the kill-switch — the rt-path kill of one sandbox.
//
// DESIGN.md "The supervisor" (rt thread, steps 2 and 3): write "1" to the sandbox's cgroup.kill
// (Linux 5.14; every process in the leaf gets SIGKILL) — fallback: pidfd_send_signal(SIGKILL)
// to the sandbox's first process (Linux 5.1) and kill(-pgid, SIGKILL) to its process group — then
// confirm death without blocking: `populated 0` in cgroup.events, or the pidfd readable.
//
// Everything the kill needs is in a `KillTarget` of fds opened in advance by the io thread, so this
// path does no path lookup, no allocation, no logging and takes no lock. It is noexcept throughout.
//
// Contract with the owner (the io thread): the fds stay open, and the sandbox's first process stays
// unreaped, for as long as the rt thread may use the target — i.e. until its disarm was applied
// (RtThread::applied). An unreaped process keeps its pid and process group id from being reused,
// which is what makes kill(-pgid) safe.
#pragma once

#include "leasehold/lease/clock.hpp"

#include <sys/types.h>

#include <cstdint>

namespace leasehold {

/// What the kill-switch needs of one sandbox; -1 / 0 for parts that do not exist.
struct KillTarget {
  int cgroup_kill_fd = -1;    ///< the leaf's cgroup.kill, open O_WRONLY (cgroup mode)
  int cgroup_events_fd = -1;  ///< the leaf's cgroup.events, open O_RDONLY (cgroup mode)
  int pidfd = -1;             ///< the sandbox's first process
  pid_t pgid = 0;             ///< its process group (== its pid; the child called setsid)
};

/// How a kill was delivered.
enum class KillPath : std::uint8_t {
  none = 0,     ///< nothing could be delivered (see KillRecord::error)
  cgroup_kill,  ///< cgroup.kill written
  signals,      ///< pidfd_send_signal and/or kill(-pgid)
};

/// One kill, timed on CLOCK_BOOTTIME (ns). deadline → issued is the kill-switch's reaction,
/// issued → confirmed the kernel's teardown; both go to the shm stats (issue 6).
struct KillRecord {
  std::uint64_t deadline_ns = 0;   ///< the deadline that came due (or the kill-now request time)
  std::uint64_t issued_ns = 0;     ///< after the kill was written/sent
  std::uint64_t confirmed_ns = 0;  ///< when death was observed; 0 if not (yet)
  int error = 0;                   ///< 0, or -errno of the failure that left the kill undelivered
  KillPath path = KillPath::none;
};

class KillSwitch {
 public:
  /// CLOCK_BOOTTIME now, in ns (DESIGN.md "Time"): boottime_ns() (lease/clock.hpp) as the
  /// supervisor's unsigned ns, the clock of every KillRecord.
  static std::uint64_t now_ns() noexcept { return static_cast<std::uint64_t>(boottime_ns()); }

  /// pidfd_send_signal(pidfd, sig) (glibc 2.36's wrapper lacks C++ linkage). 0 or -errno.
  static int pidfd_signal(int pidfd, int sig) noexcept;

  /// 1 if the pidfd's process has exited (pidfd readable; poll with timeout 0), 0 if running,
  /// -errno on error.
  static int pidfd_exited(int pidfd) noexcept;

  /// Kills the target: cgroup.kill when `cgroup_kill_fd` is set and the write succeeds, and then
  /// pidfd_send_signal(SIGKILL) as well (through both: the first process may have left its
  /// leaf); else (or if cgroup.kill fails) pidfd_send_signal(SIGKILL) and kill(-pgid, SIGKILL).
  /// A process that is already gone (ESRCH) counts as delivered. Returns the record with
  /// issued_ns set.
  static KillRecord kill(const KillTarget& target, std::uint64_t deadline_ns) noexcept;

  /// Non-blocking death check: 1 dead, 0 still alive, -errno if it cannot tell. Dead means
  /// every part of the target that exists agrees: `populated 0` of the leaf (cgroup mode) and
  /// the pidfd readable.
  static int confirm_dead(const KillTarget& target) noexcept;
};

}  // namespace leasehold
