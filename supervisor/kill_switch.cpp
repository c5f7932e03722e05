// leasehold/supervisor: the kill-switch (see kill_switch.hpp). No allocation, no logging, no locks.
#include "leasehold/supervisor/kill_switch.hpp"

#include "leasehold/supervisor/cgroup.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace leasehold {

int KillSwitch::pidfd_signal(int pidfd, int sig) noexcept {
  if (pidfd < 0) return -EBADF;
  return ::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0 ? 0 : -errno;
}

int KillSwitch::pidfd_exited(int pidfd) noexcept {
  if (pidfd < 0) return -EBADF;
  pollfd p{pidfd, POLLIN, 0};
  const int r = ::poll(&p, 1, 0);
  if (r < 0) return -errno;
  if (r > 0 && (p.revents & POLLNVAL) != 0) return -EBADF;
  return r > 0 ? 1 : 0;
}

KillRecord KillSwitch::kill(const KillTarget& target, std::uint64_t deadline_ns) noexcept {
  KillRecord rec;
  rec.deadline_ns = deadline_ns;
  if (target.cgroup_kill_fd >= 0) {
    const int r = cgroup_kill_fd(target.cgroup_kill_fd);
    if (r == 0) {
      // Through both: a first process that left the leaf (a legacy, unisolated sandbox can)
      // still dies, and for an isolated sandbox — the init of its pid namespace — the kernel
      // then kills every process of the namespace, inside the leaf or not.
      if (target.pidfd >= 0) pidfd_signal(target.pidfd, SIGKILL);
      rec.path = KillPath::cgroup_kill;
      rec.issued_ns = now_ns();
      return rec;
    }
    rec.error = r;  // fall through to signals
  }
  bool delivered = false;
  if (target.pidfd >= 0) {
    const int r = pidfd_signal(target.pidfd, SIGKILL);
    if (r == 0 || r == -ESRCH) {
      delivered = true;
    } else {
      rec.error = r;
    }
  }
  if (target.pgid > 0) {
    if (::kill(-target.pgid, SIGKILL) == 0 || errno == ESRCH) {
      delivered = true;
    } else {
      rec.error = -errno;
    }
  }
  rec.issued_ns = now_ns();
  if (delivered) {
    rec.path = KillPath::signals;
    rec.error = 0;
  } else if (rec.error == 0) {
    rec.error = -EBADF;  // nothing to kill with
  }
  return rec;
}

int KillSwitch::confirm_dead(const KillTarget& target) noexcept {
  // Dead only when every part that exists says so: the leaf `populated 0` and the pidfd
  // readable (a process that left its leaf empties the leaf while it still runs).
  int leaf = -EBADF;
  if (target.cgroup_events_fd >= 0) {
    const int populated = cgroup_populated_fd(target.cgroup_events_fd);
    if (populated >= 0) leaf = populated == 0 ? 1 : 0;
  }
  if (target.pidfd < 0) return leaf;
  const int first = pidfd_exited(target.pidfd);
  if (leaf < 0) return first;
  if (first < 0) return first;
  return leaf == 1 && first == 1 ? 1 : 0;
}

}  // namespace leasehold
