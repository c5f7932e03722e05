// leasehold/supervisor: spawn (see spawn.hpp).
#include "leasehold/supervisor/spawn.hpp"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace leasehold {
namespace {

// What the child reports through the pipe when a step before exec (or exec itself) fails.
enum class ChildStep : int {
  setsid = 1, pdeathsig, parent_gone, stdio, signals, exec, chdir,
  // isolation
  dumpable, mount_private, mount_proc, hide, cgroup_ns, nproc, rt_limits, capabilities, setgroups, setgid, setuid,
  no_new_privs, seccomp,
  gate  // waiting at the gate (prepare_sandbox) for the byte that lets it exec
};

struct ChildReport {
  int step;
  int err;
};

// The kernel's struct sigaction for rt_sigaction on x86-64/arm64 (SIG_DFL needs no restorer).
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  unsigned long mask;
};

// Everything the child needs, prepared by the parent (the child must not allocate).
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  int report_fd;          // the child's end of the socket pair: reports out, the gate byte in
  int report_peer_fd;     // the parent's end, closed in the child (so a parent gone is EOF)
  bool gated;             // stop before exec until the parent sends one byte (prepare_sandbox)
  pid_t parent;
  bool die_with_parent;
  int stdio[3];
  int inherit_fd;                 // -1: none; else placed at kInheritedFd
  int tokens_fd;                  // -1: none; else placed at kTokensFd
  const char* working_directory;  // nullptr: stay
  // isolation (isolated == false: none of these are used)
  bool isolated;
  int sync_fd;            // read end: the parent writes one byte once the id maps are set, and
                          // holds the write end until the child execs (so a hang-up means the
                          // parent died: the check after PR_SET_PDEATHSIG)
  int sync_write_fd;      // the parent's end, closed in the child
  int ready_fd;           // write end: one byte once the child is dumpable (-1: not needed)
  int ready_read_fd;      // the parent's end, closed in the child
  bool make_dumpable;     // a non-root parent must be able to open /proc/<child>/uid_map
  bool drop_groups;       // setgroups(0) (setgroups is "allow": root parent)
  uid_t uid;
  gid_t gid;
  const char* const* hide_dirs;   // nullptr-terminated
  const char* const* hide_files;  // nullptr-terminated
  std::uint64_t nproc_max;
  bool zero_rt_limits;            // RLIMIT_RTPRIO and RLIMIT_NICE to 0
  const sock_fprog* seccomp;      // nullptr: none
};

// Raw mount(2): the child must not call into libc wrappers a sanitizer intercepts.
long raw_mount(const char* src, const char* target, const char* type, unsigned long flags, const char* data) {
  return syscall(SYS_mount, src, target, type, flags, data);
}

// MSG_NOSIGNAL: the parent may have closed its end (it gave up at the gate), and the child's
// SIGPIPE is back at its default by then.
void child_report(const ChildPlan& p, ChildStep step, long err) {
  const ChildReport r{static_cast<int>(step), static_cast<int>(err)};
  syscall(SYS_sendto, p.report_fd, &r, sizeof r, MSG_NOSIGNAL, nullptr, 0);
}

[[noreturn]] void child_fail(const ChildPlan& p, ChildStep step, long err) {
  child_report(p, step, err);
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

// Raw system calls return -1 and set errno through syscall(); errno is thread-local and the
// child has one thread, so reading it is safe.
// Isolation steps, in the order the header comment gives; runs with every capability of the new
// user namespace, which the last steps drop.
void child_isolate(const ChildPlan& p) {
  // Wait for the id maps (or EOF: the parent gave up or died).
  char go = 0;
  long n;
  do {
    n = syscall(SYS_read, p.sync_fd, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) child_fail(p, ChildStep::parent_gone, ESRCH);

  if (raw_mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) child_fail(p, ChildStep::mount_private, errno);
  if (raw_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) < 0)
    child_fail(p, ChildStep::mount_proc, errno);
  // Files first: one inside a hidden directory must be covered before the directory is.
  for (const char* const* f = p.hide_files; *f != nullptr; ++f)
    if (raw_mount("/dev/null", *f, nullptr, MS_BIND, nullptr) < 0) child_fail(p, ChildStep::hide, errno);
  for (const char* const* d = p.hide_dirs; *d != nullptr; ++d)
    if (raw_mount("none", *d, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555") < 0)
      child_fail(p, ChildStep::hide, errno);
  // Already in the leaf (CLONE_INTO_CGROUP): the new cgroup namespace is rooted there.
  if (syscall(SYS_unshare, CLONE_NEWCGROUP) < 0) child_fail(p, ChildStep::cgroup_ns, errno);
  if (p.nproc_max != 0) {
    const rlimit lim{p.nproc_max, p.nproc_max};
    if (syscall(SYS_prlimit64, 0, RLIMIT_NPROC, &lim, nullptr) < 0) child_fail(p, ChildStep::nproc, errno);
  }
  if (p.zero_rt_limits) {
    const rlimit none{0, 0};
    if (syscall(SYS_prlimit64, 0, RLIMIT_RTPRIO, &none, nullptr) < 0 ||
        syscall(SYS_prlimit64, 0, RLIMIT_NICE, &none, nullptr) < 0)
      child_fail(p, ChildStep::rt_limits, errno);
  }
  for (int cap = 0; cap < 64; ++cap) {
    if (syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
      child_fail(p, ChildStep::capabilities, errno);
  }
  if (syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
    child_fail(p, ChildStep::capabilities, errno);
  if (p.drop_groups && syscall(SYS_setgroups, 0, nullptr) < 0) child_fail(p, ChildStep::setgroups, errno);
  if (syscall(SYS_setresgid, p.gid, p.gid, p.gid) < 0) child_fail(p, ChildStep::setgid, errno);
  if (syscall(SYS_setresuid, p.uid, p.uid, p.uid) < 0) child_fail(p, ChildStep::setuid, errno);
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2] = {};
  if (syscall(SYS_capset, &hdr, none) < 0) child_fail(p, ChildStep::capabilities, errno);
  if (syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(p, ChildStep::no_new_privs, errno);
  if (p.die_with_parent) {
    // Only now: the kernel clears the parent-death signal on every change of credentials
    // (setresgid/setresuid above), and in a new pid namespace nothing else kills the sandbox
    // when the supervisor dies. The parent holds the sync pipe's write end until we reach our
    // gate or exec; its files are closed before the kernel reparents its children, so if it
    // died before the prctl took effect the pipe has hung up by now.
    if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) child_fail(p, ChildStep::pdeathsig, errno);
    pollfd pfd{p.sync_fd, POLLIN, 0};
    const timespec no_wait{0, 0};
    long r;
    do {
      r = syscall(SYS_ppoll, &pfd, 1, &no_wait, nullptr, 0);
    } while (r < 0 && errno == EINTR);
    if (r != 0) child_fail(p, ChildStep::parent_gone, r < 0 ? errno : ESRCH);
  }
  syscall(SYS_close, p.sync_fd);
}

// Waits for the parent's byte (it may be there already); EOF (the parent closed its end or died)
// or anything else ends the child without exec.
void child_gate(const ChildPlan& p) {
  char go = 0;
  long n;
  do {
    n = syscall(SYS_read, p.report_fd, &go, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) child_fail(p, ChildStep::gate, n < 0 ? errno : ESRCH);
}

[[noreturn]] void child_main(const ChildPlan& p) {
  syscall(SYS_close, p.report_peer_fd);
  if (p.isolated) {
    syscall(SYS_close, p.sync_write_fd);
    if (p.make_dumpable) {
      // The parent opens /proc/<child>/uid_map only after this byte: a non-dumpable child's
      // /proc files belong to root, and the parent is not dumpable (the key).
      syscall(SYS_close, p.ready_read_fd);
      if (syscall(SYS_prctl, PR_SET_DUMPABLE, 1, 0, 0, 0) < 0) child_fail(p, ChildStep::dumpable, errno);
      const char ready = 1;
      if (syscall(SYS_write, p.ready_fd, &ready, 1) != 1) child_fail(p, ChildStep::dumpable, errno);
      syscall(SYS_close, p.ready_fd);
    }
  }
  if (syscall(SYS_setsid) < 0) child_fail(p, ChildStep::setsid, errno);
  // Isolated: the parent-death signal is set after the credential change (child_isolate).
  if (p.die_with_parent && !p.isolated) {
    if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) child_fail(p, ChildStep::pdeathsig, errno);
    // The supervisor may have died between clone3 and prctl: then nobody would kill us.
    if (syscall(SYS_getppid) != p.parent) child_fail(p, ChildStep::parent_gone, ESRCH);
  }
  if (p.isolated) child_isolate(p);
  for (int i = 0; i < 3; ++i) {
    if (p.stdio[i] >= 0 && syscall(SYS_dup2, p.stdio[i], i) < 0) child_fail(p, ChildStep::stdio, errno);
  }
  if (p.working_directory != nullptr && syscall(SYS_chdir, p.working_directory) < 0) {
    child_fail(p, ChildStep::chdir, errno);
  }
  // Nothing but 0..2 (and the report pipe, already CLOEXEC) crosses exec. Best effort: old
  // kernels (< 5.11) lack CLOSE_RANGE_CLOEXEC, and the supervisor opens everything CLOEXEC anyway.
  syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
  // The token channel out of the way first when it sits where the table goes.
  long tokens_fd = p.tokens_fd;
  if (tokens_fd == kInheritedFd && p.inherit_fd >= 0 && p.inherit_fd != kInheritedFd &&
      (tokens_fd = syscall(SYS_fcntl, tokens_fd, F_DUPFD_CLOEXEC, kTokensFd + 1)) < 0)
    child_fail(p, ChildStep::stdio, errno);
  if (p.inherit_fd >= 0) {
    if (p.inherit_fd != kInheritedFd && syscall(SYS_dup2, p.inherit_fd, kInheritedFd) < 0)
      child_fail(p, ChildStep::stdio, errno);
    if (syscall(SYS_fcntl, kInheritedFd, F_SETFD, 0) < 0) child_fail(p, ChildStep::stdio, errno);
  }
  if (tokens_fd >= 0) {
    if (tokens_fd != kTokensFd && syscall(SYS_dup2, tokens_fd, kTokensFd) < 0) child_fail(p, ChildStep::stdio, errno);
    if (syscall(SYS_fcntl, kTokensFd, F_SETFD, 0) < 0) child_fail(p, ChildStep::stdio, errno);
  }
  // Signal state: the supervisor may block or ignore signals (signalfd, SIGPIPE); the sandbox
  // starts with the defaults.
  const unsigned long empty_mask = 0;
  if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty_mask, nullptr, sizeof empty_mask) < 0) {
    child_fail(p, ChildStep::signals, errno);
  }
  const KernelSigaction dfl{SIG_DFL, 0, nullptr, 0};
  for (int sig = 1; sig < 65; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    syscall(SYS_rt_sigaction, sig, &dfl, nullptr, sizeof dfl.mask);  // invalid numbers: ignored
  }
  // Everything is in place: from here the kill-switch can have been armed by the parent before
  // the command's first instruction (prepare_sandbox / release_sandbox).
  if (p.gated) child_gate(p);
  // The filter is the last step: from here on only execve and the failure report run.
  if (p.seccomp != nullptr &&
      syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, p.seccomp) < 0)
    child_fail(p, ChildStep::seccomp, errno);
  syscall(SYS_execve, p.path, p.argv, p.envp);
  child_fail(p, ChildStep::exec, errno);
}

const char* step_name(int step) {
  switch (static_cast<ChildStep>(step)) {
    case ChildStep::setsid: return "setsid";
    case ChildStep::pdeathsig: return "prctl(PR_SET_PDEATHSIG)";
    case ChildStep::parent_gone: return "parent check";
    case ChildStep::stdio: return "dup2 of stdio";
    case ChildStep::signals: return "signal reset";
    case ChildStep::exec: return "execve";
    case ChildStep::chdir: return "chdir";
    case ChildStep::dumpable: return "prctl(PR_SET_DUMPABLE)";
    case ChildStep::mount_private: return "making the mount namespace private";
    case ChildStep::mount_proc: return "mounting its own /proc";
    case ChildStep::hide: return "covering a hidden path";
    case ChildStep::cgroup_ns: return "unshare(CLONE_NEWCGROUP)";
    case ChildStep::nproc: return "setrlimit(RLIMIT_NPROC)";
    case ChildStep::rt_limits: return "setrlimit(RLIMIT_RTPRIO, RLIMIT_NICE)";
    case ChildStep::capabilities: return "dropping capabilities";
    case ChildStep::setgroups: return "setgroups";
    case ChildStep::setgid: return "setresgid";
    case ChildStep::setuid: return "setresuid";
    case ChildStep::no_new_privs: return "prctl(PR_SET_NO_NEW_PRIVS)";
    case ChildStep::seccomp: return "installing the seccomp filter";
    case ChildStep::gate: return "waiting to be released before exec";
  }
  return "unknown step";
}

std::string env_lookup(const std::vector<std::string>& env, std::string_view key) {
  for (const auto& e : env) {
    if (e.size() > key.size() && e.compare(0, key.size(), key) == 0 && e[key.size()] == '=') {
      return e.substr(key.size() + 1);
    }
  }
  return {};
}

bool is_executable_file(const std::string& path, bool& exists) {
  struct stat st {};
  exists = ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  return exists && ::access(path.c_str(), X_OK) == 0;
}

// Writes `text` to /proc/<pid>/<file>. "" or the error.
std::string write_proc_file(pid_t pid, const char* file, const std::string& text) {
  const std::string path = "/proc/" + std::to_string(pid) + "/" + file;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  const ssize_t w = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (w != static_cast<ssize_t>(text.size()))
    return "cannot write " + path + ": " + (w < 0 ? std::strerror(err) : "short write");
  return {};
}

// Maps exactly one uid and one gid into the child's new user namespace (identity: the ids are
// the same inside and outside). A non-root parent may map only its own ids, after denying
// setgroups (user_namespaces(7)).
std::string write_id_maps(pid_t pid, const Isolation& iso, bool root) {
  if (!root) {
    if (std::string e = write_proc_file(pid, "setgroups", "deny"); !e.empty()) return e;
  }
  const std::string u = std::to_string(iso.uid), g = std::to_string(iso.gid);
  if (std::string e = write_proc_file(pid, "uid_map", u + " " + u + " 1\n"); !e.empty()) return e;
  return write_proc_file(pid, "gid_map", g + " " + g + " 1\n");
}

}  // namespace

Result<SeccompFilter> build_seccomp_filter() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return Status{Errc::io_error, "seccomp filter: seccomp_init failed"};
  SeccompFilter f;
  Status error;
  auto deny = [&](const char* name, int err) -> bool {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) return true;  // not on this architecture
    if (int r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(err), nr, 0); r < 0) {
      error = Status::from_errno(r, std::string("seccomp filter: the rule for ") + name);
      return false;
    }
    f.denied.emplace_back(name);
    return true;
  };
  static constexpr const char* kDenied[] = {
      "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount", "fsconfig", "fspick",
      "move_mount", "open_tree", "mount_setattr", "unshare", "setns", "ptrace", "process_vm_readv",
      "process_vm_writev", "kcmp", "bpf", "keyctl", "add_key", "request_key", "perf_event_open",
      "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at",
      "name_to_handle_at", "userfaultfd", "io_uring_setup", "iopl", "ioperm", "swapon", "swapoff", "reboot",
      "acct", "quotactl", "quotactl_fd", "syslog", "lookup_dcookie", "settimeofday", "clock_settime",
      "clock_adjtime", "adjtimex", "stime", "vhangup", "nfsservctl", "uselib", "pidfd_getfd"};
  bool ok = true;
  for (const char* name : kDenied) ok = ok && deny(name, EPERM);
  // clone3 passes its flags in memory, which a filter cannot read: ENOSYS makes libc fall back
  // to clone, whose flags are an argument.
  ok = ok && deny("clone3", ENOSYS);
  static constexpr std::uint64_t kNamespaceFlags[] = {CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNS, CLONE_NEWNET,
                                                      CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWCGROUP, CLONE_NEWTIME};
  for (std::uint64_t flag : kNamespaceFlags) {
    if (!ok) break;
    if (int r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                 SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag));
        r < 0) {
      error = Status::from_errno(r, "seccomp filter: the rule for clone");
      ok = false;
    }
  }
  if (ok) f.denied.emplace_back("clone(CLONE_NEW*)");
  // Export the BPF through a memfd (libseccomp 2.5 exports to an fd only).
  if (ok) {
    const int fd = ::memfd_create("leasehold-seccomp", MFD_CLOEXEC);
    if (fd < 0) {
      error = Status::from_errno(errno, "seccomp filter: memfd_create");
      ok = false;
    } else {
      if (int r = seccomp_export_bpf(ctx, fd); r < 0) {
        error = Status::from_errno(r, "seccomp filter: seccomp_export_bpf");
        ok = false;
      } else {
        const off_t size = ::lseek(fd, 0, SEEK_END);
        if (size <= 0 || size % static_cast<off_t>(sizeof(sock_filter)) != 0) {
          error = Status{Errc::io_error, "seccomp filter: seccomp_export_bpf wrote " + std::to_string(size) +
                                             " bytes, not a whole number of " + std::to_string(sizeof(sock_filter)) +
                                             "-byte instructions"};
          ok = false;
        } else {
          f.words.resize(static_cast<std::size_t>(size) / sizeof(sock_filter));
          if (::pread(fd, f.words.data(), static_cast<std::size_t>(size), 0) != size) {
            error = Status{Errc::io_error, "seccomp filter: cannot read back the program from its memfd"};
            ok = false;
          }
        }
      }
      ::close(fd);
    }
  }
  seccomp_release(ctx);
  if (!ok) return error;
  return f;
}

std::vector<std::string> default_bwrap_args() {
  return {"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
          "--die-with-parent"};
}

Result<std::string> resolve_command(std::string_view command, std::string_view search_path) {
  if (command.empty()) return Status::invalid("empty command");
  if (command.find('/') != std::string_view::npos) {
    std::string path(command);
    bool exists = false;
    if (is_executable_file(path, exists)) return path;
    if (exists) return Status{Errc::permission_denied, "permission denied: " + path};
    return Status{Errc::not_found, "command not found: " + path};
  }
  std::string denied;
  std::size_t pos = 0;
  while (pos <= search_path.size()) {
    std::size_t end = search_path.find(':', pos);
    if (end == std::string_view::npos) end = search_path.size();
    std::string dir(search_path.substr(pos, end - pos));
    pos = end + 1;
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + std::string(command);
    bool exists = false;
    if (is_executable_file(candidate, exists)) return candidate;
    if (exists && denied.empty()) denied = candidate;
  }
  if (!denied.empty()) return Status{Errc::permission_denied, "permission denied: " + denied};
  return Status{Errc::not_found, "command not found: " + std::string(command)};
}

SandboxProcess::SandboxProcess(SandboxProcess&& o) noexcept : pid_(o.pid_), pidfd_(o.pidfd_) {
  o.pid_ = 0;
  o.pidfd_ = -1;
}

SandboxProcess& SandboxProcess::operator=(SandboxProcess&& o) noexcept {
  if (this != &o) {
    if (pidfd_ >= 0) ::close(pidfd_);
    pid_ = o.pid_;
    pidfd_ = o.pidfd_;
    o.pid_ = 0;
    o.pidfd_ = -1;
  }
  return *this;
}

SandboxProcess::~SandboxProcess() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

namespace {

// A started child: after its exec (not gated), or waiting at its gate with the parent's end of
// the socket pair open (gated).
struct ChildStart {
  SandboxProcess process;
  int report_fd = -1;  // gated: the gate; -1 otherwise
  int sync_fd = -1;    // gated, isolated: the sync pipe's write end (the child's parent-death check)
  std::string exec_path;
};

// The error a failed child's report `r` (`n` bytes of it) stands for.
SpawnError failure_of(const ChildReport& r, ssize_t n, const std::string& exec_path,
                      const std::string& working_directory, const std::string& map_error) {
  if (n != static_cast<ssize_t>(sizeof r)) return {EIO, "sandbox child reported a truncated error"};
  if (!map_error.empty()) return {EPERM, "cannot map the sandbox's uid/gid into its user namespace: " + map_error};
  if (r.step == static_cast<int>(ChildStep::chdir))
    return {r.err, "cannot change directory to " + working_directory + ": " + std::strerror(r.err)};
  if (r.step == static_cast<int>(ChildStep::exec)) {
    if (r.err == ENOENT) return {ENOENT, "command not found: " + exec_path};
    if (r.err == EACCES) return {EACCES, "permission denied: " + exec_path};
    return {r.err, "cannot execute " + exec_path + ": " + std::strerror(r.err)};
  }
  return {r.err, std::string("sandbox set-up failed at ") + step_name(r.step) + ": " + std::strerror(r.err)};
}

// Reads one report (EINTR retried): bytes read, 0 at EOF, -1 on error.
ssize_t read_report(int fd, ChildReport& r) {
  ssize_t n;
  do {
    n = ::read(fd, &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  return n;
}

std::optional<ChildStart> start_child(const SpawnRequest& request, bool gated, SpawnError& error) {
  error = {};
  auto fail = [&](int err, std::string message) -> std::optional<ChildStart> {
    error.errno_value = err;
    error.message = std::move(message);
    return std::nullopt;
  };
  if (request.argv.empty()) return fail(EINVAL, "empty argv: no command to run");
  std::size_t bytes = 0;
  for (const auto& s : request.argv) bytes += s.size() + 1;
  for (const auto& s : request.env) bytes += s.size() + 1;
  bytes += request.working_directory.size() + 1;
  if (request.working_directory.find('\0') != std::string::npos)
    return fail(EINVAL, "working directory contains a NUL byte");
  const std::size_t strings = request.argv.size() + request.env.size() +
                              (request.bwrap ? request.bwrap->args.size() + 2 : 0);
  if (strings > kSpawnStringsMax || bytes > kSpawnBytesMax) {
    return fail(E2BIG, "argv + env too large: " + std::to_string(strings) + " strings, " +
                           std::to_string(bytes) + " bytes (limits " + std::to_string(kSpawnStringsMax) +
                           ", " + std::to_string(kSpawnBytesMax) + ")");
  }

  // Resolve in the parent: clear errors, and the child only needs execve.
  std::string search = env_lookup(request.env, "PATH");
  if (search.empty()) {
    const char* own = std::getenv("PATH");
    search = own != nullptr ? own : kDefaultSearchPath;
  }
  // A relative path with a '/' names a file below the working directory the child will be in.
  const std::string& name = request.argv[0];
  const bool below_cwd = !request.working_directory.empty() && !name.empty() && name.front() != '/' &&
                         name.find('/') != std::string::npos;
  const Result<std::string> command = resolve_command(below_cwd ? request.working_directory + "/" + name : name, search);
  if (!command) return fail(command.code() == Errc::permission_denied ? EACCES : ENOENT, command.message());

  const Isolation* iso = request.isolation;
  const bool root = ::geteuid() == 0;
  if (iso != nullptr) {
    if (request.bwrap != nullptr) return fail(EINVAL, "isolation and bubblewrap wrapping are exclusive: choose one");
    if (iso->uid == 0 || iso->gid == 0)
      return fail(EINVAL, "an isolated sandbox never runs as uid or gid 0 (got uid " + std::to_string(iso->uid) +
                              ", gid " + std::to_string(iso->gid) + ")");
    if (!root && (iso->uid != ::geteuid() || iso->gid != ::getegid()))
      return fail(EPERM, "a non-root supervisor (uid " + std::to_string(::geteuid()) +
                             ") can run sandboxes only as its own uid and gid, not uid " + std::to_string(iso->uid));
  }
  // Paths to cover, split by kind (absent ones are skipped: nothing to hide).
  std::vector<std::string> hide_files, hide_dirs;
  if (iso != nullptr) {
    for (const auto& h : iso->hide) {
      struct stat st {};
      if (h.empty() || h.front() != '/' || ::stat(h.c_str(), &st) != 0) continue;
      (S_ISDIR(st.st_mode) ? hide_dirs : hide_files).push_back(h);
    }
    // A directory below another hidden one is covered already (and gone once that is covered).
    auto below = [](const std::string& path, const std::string& dir) {
      return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
             (dir.back() == '/' || path[dir.size()] == '/');
    };
    std::vector<std::string> outer;
    for (const auto& d : hide_dirs) {
      bool covered = false;
      for (const auto& o : hide_dirs) covered = covered || below(d, o);
      if (!covered && std::find(outer.begin(), outer.end(), d) == outer.end()) outer.push_back(d);
    }
    hide_dirs = std::move(outer);
  }
  std::vector<const char*> hide_file_ptrs, hide_dir_ptrs;
  for (const auto& h : hide_files) hide_file_ptrs.push_back(h.c_str());
  for (const auto& h : hide_dirs) hide_dir_ptrs.push_back(h.c_str());
  hide_file_ptrs.push_back(nullptr);
  hide_dir_ptrs.push_back(nullptr);
  static_assert(sizeof(sock_filter) == sizeof(std::uint64_t));
  sock_fprog fprog{};
  if (iso != nullptr && iso->seccomp != nullptr) {
    fprog.len = static_cast<unsigned short>(iso->seccomp->words.size());
    fprog.filter = reinterpret_cast<sock_filter*>(const_cast<std::uint64_t*>(iso->seccomp->words.data()));
  }

  std::vector<std::string> full;
  std::string exec_path = *command;
  if (request.bwrap != nullptr) {
    const Result<std::string> bwrap = resolve_command(request.bwrap->bwrap_path, search);
    if (!bwrap) return fail(ENOENT, "bubblewrap requested but unusable: " + bwrap.message());
    exec_path = *bwrap;
    full.push_back(*bwrap);
    full.insert(full.end(), request.bwrap->args.begin(), request.bwrap->args.end());
    full.push_back("--");
    full.push_back(*command);
  } else {
    full.push_back(request.argv[0]);
  }
  full.insert(full.end(), request.argv.begin() + 1, request.argv.end());

  std::vector<char*> argv;
  argv.reserve(full.size() + 1);
  for (auto& s : full) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_copy = request.env;
  std::vector<char*> envp;
  envp.reserve(env_copy.size() + 1);
  for (auto& s : env_copy) envp.push_back(s.data());
  envp.push_back(nullptr);

  // report[0]: the parent's end, report[1]: the child's (both CLOEXEC; the child's closes at exec).
  int report[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, report) != 0)
    return fail(errno, std::string("socketpair: ") + std::strerror(errno));
  // Neither end may sit where the child puts stdio or the inherited descriptors.
  if (report[0] <= kTokensFd || report[1] <= kTokensFd) {
    for (int& end : report) {
      if (end > kTokensFd) continue;
      const int moved = ::fcntl(end, F_DUPFD_CLOEXEC, kTokensFd + 1);
      if (moved < 0) {
        const int err = errno;
        ::close(report[0]);
        ::close(report[1]);
        return fail(err, std::string("fcntl(F_DUPFD_CLOEXEC): ") + std::strerror(err));
      }
      ::close(end);
      end = moved;
    }
  }
  int sync[2] = {-1, -1};
  int ready[2] = {-1, -1};
  const bool make_dumpable = iso != nullptr && !root && ::prctl(PR_GET_DUMPABLE) != 1;
  if ((iso != nullptr && ::pipe2(sync, O_CLOEXEC) != 0) || (make_dumpable && ::pipe2(ready, O_CLOEXEC) != 0)) {
    const int err = errno;
    for (int fd : {report[0], report[1], sync[0], sync[1]})
      if (fd >= 0) ::close(fd);
    return fail(err, std::string("pipe2: ") + std::strerror(err));
  }

  const ChildPlan plan{exec_path.c_str(), argv.data(), envp.data(), report[1], report[0], gated, ::getpid(),
                       request.die_with_supervisor,
                       {request.stdin_fd, request.stdout_fd, request.stderr_fd},
                       request.inherit_fd,
                       request.tokens_fd,
                       request.working_directory.empty() ? nullptr : request.working_directory.c_str(),
                       iso != nullptr, sync[0], sync[1], ready[1], ready[0],
                       make_dumpable,
                       root,
                       iso != nullptr ? iso->uid : 0, iso != nullptr ? iso->gid : 0,
                       hide_dir_ptrs.data(), hide_file_ptrs.data(),
                       iso != nullptr ? iso->nproc_max : 0,
                       iso != nullptr && iso->zero_rt_limits,
                       iso != nullptr && iso->seccomp != nullptr ? &fprog : nullptr};
  int pidfd = -1;
  clone_args args{};
  args.flags = CLONE_PIDFD;
  if (iso != nullptr) args.flags |= CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  if (request.cgroup_dir_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<std::uint64_t>(request.cgroup_dir_fd);
  }
  const long pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) child_main(plan);
  const int clone_err = errno;
  ::close(report[1]);
  if (sync[0] >= 0) ::close(sync[0]);
  if (ready[1] >= 0) ::close(ready[1]);
  std::string map_error;
  if (pid > 0 && iso != nullptr) {
    if (make_dumpable) {
      // EOF instead of the byte: the child failed first and says why on the report pipe.
      char ready_byte = 0;
      ssize_t got;
      do {
        got = ::read(ready[0], &ready_byte, 1);
      } while (got < 0 && errno == EINTR);
      if (got != 1) map_error = "the sandbox child stopped before it became dumpable";
    }
    // The child waits for its id maps; EOF on the sync pipe (map_error) makes it give up.
    if (map_error.empty()) map_error = write_id_maps(static_cast<pid_t>(pid), *iso, root);
    if (map_error.empty()) {
      const char go = 1;
      if (::write(sync[1], &go, 1) != 1) map_error = std::string("cannot release the sandbox child: ") + std::strerror(errno);
    }
    // On failure the child must see EOF now; otherwise the write end stays open until it has
    // passed its parent-death check (at its gate, or its exec).
    if (!map_error.empty()) {
      ::close(sync[1]);
      sync[1] = -1;
    }
  }
  if (ready[0] >= 0) ::close(ready[0]);
  if (pid < 0) {
    if (sync[1] >= 0) ::close(sync[1]);
    ::close(report[0]);
    if (clone_err == ENOSYS) return fail(ENOSYS, "clone3 is not available (needs Linux 5.3)");
    if (iso != nullptr && (clone_err == EPERM || clone_err == EINVAL || clone_err == ENOSPC || clone_err == EUSERS)) {
      return fail(clone_err, std::string("clone3 of an isolated sandbox failed: ") + std::strerror(clone_err) +
                                 " (new user, pid, mount, ipc and uts namespaces; user namespaces disabled? check "
                                 "sysctl user.max_user_namespaces and kernel.unprivileged_userns_clone, or a "
                                 "seccomp/LSM policy around the supervisor)");
    }
    if (request.cgroup_dir_fd >= 0) {
      return fail(clone_err, std::string("clone3 into the sandbox cgroup failed: ") + std::strerror(clone_err) +
                                 " (CLONE_INTO_CGROUP needs Linux 5.7 and a cgroup v2 leaf)");
    }
    return fail(clone_err, std::string("clone3 failed: ") + std::strerror(clone_err));
  }

  ChildStart started{SandboxProcess(static_cast<pid_t>(pid), pidfd), -1, -1, exec_path};
  // Gated: the child sets itself up and stops at its gate on its own; nothing is waited for here
  // (release_sandbox reads its reports), so the gate costs no round trip on the start path.
  if (gated && map_error.empty()) {
    started.report_fd = report[0];
    started.sync_fd = sync[1];
    return started;
  }
  // Not gated: EOF is the exec (the child's end closed on exec).
  ChildReport r{};
  const ssize_t n = read_report(report[0], r);
  if (sync[1] >= 0) ::close(sync[1]);
  ::close(report[0]);
  if (n == 0 && map_error.empty()) return started;  // running

  // The child failed before or at exec: reap it so nothing is left behind.
  siginfo_t info{};
  reap(pidfd, info, true);
  error = failure_of(r, n, exec_path, request.working_directory, map_error);
  return std::nullopt;
}

}  // namespace

std::optional<SandboxProcess> spawn_sandbox(const SpawnRequest& request, SpawnError& error) {
  auto started = start_child(request, false, error);
  if (!started) return std::nullopt;
  return std::move(started->process);
}

PreparedSandbox::PreparedSandbox(PreparedSandbox&& o) noexcept
    : process_(std::move(o.process_)), gate_fd_(o.gate_fd_), sync_fd_(o.sync_fd_),
      exec_path_(std::move(o.exec_path_)), working_directory_(std::move(o.working_directory_)) {
  o.gate_fd_ = o.sync_fd_ = -1;
}

PreparedSandbox& PreparedSandbox::operator=(PreparedSandbox&& o) noexcept {
  if (this != &o) {
    abandon();
    process_ = std::move(o.process_);
    gate_fd_ = o.gate_fd_;
    sync_fd_ = o.sync_fd_;
    o.gate_fd_ = o.sync_fd_ = -1;
    exec_path_ = std::move(o.exec_path_);
    working_directory_ = std::move(o.working_directory_);
  }
  return *this;
}

PreparedSandbox::~PreparedSandbox() { abandon(); }

void PreparedSandbox::abandon() noexcept {
  if (gate_fd_ >= 0) ::close(gate_fd_);
  if (sync_fd_ >= 0) ::close(sync_fd_);
  gate_fd_ = sync_fd_ = -1;
}

std::optional<PreparedSandbox> prepare_sandbox(const SpawnRequest& request, SpawnError& error) {
  auto started = start_child(request, true, error);
  if (!started) return std::nullopt;
  PreparedSandbox p;
  p.process_ = std::move(started->process);
  p.gate_fd_ = started->report_fd;
  p.sync_fd_ = started->sync_fd;
  p.exec_path_ = std::move(started->exec_path);
  p.working_directory_ = request.working_directory;
  return p;
}

bool release_sandbox(PreparedSandbox& prepared, SpawnError& error) {
  error = {};
  if (prepared.gate_fd_ < 0) {
    error = {EBADF, "the sandbox's gate was already closed: it exits without running its command"};
    return false;
  }
  const char go = 1;
  ssize_t sent;
  do {
    sent = ::send(prepared.gate_fd_, &go, 1, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  const int send_err = sent == 1 ? 0 : errno;
  if (sent != 1 && send_err != EPIPE && send_err != ECONNRESET) {
    prepared.abandon();
    error = {send_err, std::string("cannot release the sandbox child: ") + std::strerror(send_err)};
    return false;
  }
  // EOF at the exec, or the step that failed. The child's end closed with the byte unread
  // (ECONNRESET, reported once before its queued report) or before it was sent (EPIPE): it never
  // passed the gate, so it never exec'd.
  bool gate_unpassed = sent != 1;
  ChildReport r{};
  ssize_t n;
  int read_err = 0;
  for (;;) {
    n = read_report(prepared.gate_fd_, r);
    read_err = n < 0 ? errno : 0;
    if (n < 0 && read_err == ECONNRESET && !gate_unpassed) {
      gate_unpassed = true;
      continue;
    }
    break;
  }
  prepared.abandon();
  if (n == 0 && !gate_unpassed) return true;  // its end closed on exec
  if (n == 0 || (n < 0 && read_err == ECONNRESET)) {
    error = {ESRCH, "the sandbox was killed before its exec: its command never ran"};
    return false;
  }
  if (n < 0) {
    error = {read_err, std::string("cannot read the sandbox's exec verdict: ") + std::strerror(read_err)};
    return false;
  }
  error = failure_of(r, n, prepared.exec_path_, prepared.working_directory_, {});
  return false;
}

Status check_dedicated_dir(const std::string& dir, mode_t extra_mode) {
  if (dir.empty() || dir.front() != '/') return Status::invalid("directory " + dir + " is not an absolute path");
  if (dir == "/") return Status::invalid("the directory is / itself");
  static const char* const kSystem[] = {"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64",
                                        "/libx32", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/run/user",
                                        "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var", "/var/lib",
                                        "/var/run", "/var/tmp"};
  for (const char* sys : kSystem)
    if (dir == sys) return Status::invalid("directory " + dir + " is a system directory");
  char real[PATH_MAX];
  if (::getcwd(real, sizeof real) != nullptr && dir == real)
    return Status::invalid("directory " + dir + " is the working directory");
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') {
    if (::realpath(home, real) != nullptr ? dir == real : dir == home)
      return Status::invalid("directory " + dir + " is $HOME");
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return Status::from_errno(errno, "directory " + dir);
  if (!S_ISDIR(st.st_mode)) return Status::invalid(dir + " is not a directory");
  if (st.st_uid != ::geteuid())
    return Status{Errc::permission_denied, "directory " + dir + " is owned by uid " + std::to_string(st.st_uid) +
                                               ", not uid " + std::to_string(::geteuid())};
  const mode_t mode = st.st_mode & 07777;
  if ((mode & ~(0700 | extra_mode)) != 0) {
    char text[8];
    std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode));
    return Status{Errc::permission_denied, "directory " + dir + " has mode " + text + ", not 0700"};
  }
  return {};
}

Status check_no_renamable_ancestor(const std::string& dir) {
  if (dir.empty() || dir.front() != '/') return Status::invalid("directory " + dir + " is not an absolute path");
  const uid_t me = ::geteuid();
  std::string x = dir;
  while (x.size() > 1) {
    x.resize(std::max<std::size_t>(x.rfind('/'), 1));  // the next directory up
    if (x == "/") break;
    const auto up = x.rfind('/');
    const std::string parent = up == 0 ? "/" : x.substr(0, up);
    struct stat xs {}, ps {};
    if (::lstat(x.c_str(), &xs) != 0 || ::stat(parent.c_str(), &ps) != 0)
      return Status::from_errno(errno, "cannot check " + x);
    if (S_ISLNK(xs.st_mode)) return Status::invalid(x + " is a symbolic link (use the path it resolves to)");
    const bool writable = ::faccessat(AT_FDCWD, parent.c_str(), W_OK | X_OK, AT_EACCESS) == 0;
    const bool sticky_against = (ps.st_mode & S_ISVTX) != 0 && xs.st_uid != me && ps.st_uid != me;
    if (writable && !sticky_against)
      return Status{Errc::permission_denied, "directory " + x + " can be renamed by uid " + std::to_string(me) +
                                                 " (its parent " + parent +
                                                 " is writable to it), and so by a sandbox of this supervisor"};
  }
  return {};
}

Status become_child_subreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) return Status::from_errno(errno, "prctl(PR_SET_CHILD_SUBREAPER)");
  return {};
}

int reap(int pidfd, siginfo_t& info, bool block) noexcept {
  info = {};
  int r;
  do {
    r = ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  return r == 0 ? 0 : -errno;
}

namespace {
// Runs `req` to its end: ok when it exited 0, else why not (`what` names it in the text).
Status run_probe(const SpawnRequest& req, const std::string& what, const char* status_hint) {
  SpawnError err;
  auto p = spawn_sandbox(req, err);
  if (!p)
    return Status{err.errno_value != 0 ? errc_of_errno(err.errno_value) : Errc::io_error,
                  err.message.empty() ? "cannot start " + what : err.message};
  siginfo_t info{};
  if (int r = reap(p->pidfd(), info, true); r < 0) return Status::from_errno(r, what + ": waitid");
  if (info.si_code != CLD_EXITED)
    return Status{Errc::unsupported, what + " was killed by signal " + std::to_string(info.si_status)};
  if (info.si_status != 0)
    return Status{Errc::unsupported, what + " exited with status " + std::to_string(info.si_status) + status_hint};
  return {};
}
}  // namespace

Status probe_bwrap(const BwrapConfig& config) {
  SpawnRequest req;
  req.argv = {"true"};
  const char* path = std::getenv("PATH");
  req.env = {std::string("PATH=") + (path != nullptr ? path : kDefaultSearchPath)};
  req.bwrap = &config;
  return run_probe(req, "bwrap", " (user namespaces or mounts not permitted here?)");
}

Status probe_isolation(const Isolation& isolation, const std::string& command) {
  SpawnRequest req;
  req.argv = {command};
  req.env = {std::string("PATH=") + kDefaultSearchPath};
  req.isolation = &isolation;
  return run_probe(req, "the isolated probe " + command, "");
}

}  // namespace leasehold
