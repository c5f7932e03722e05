// leasehold/supervisor: starting sandboxes — clone3 with a pidfd, into a leaf cgroup, optionally
// inside bubblewrap — and reaping them.
//
// DESIGN.md "The supervisor" (spawn): `clone3(CLONE_PIDFD | CLONE_INTO_CGROUP)` where a delegated
// cgroup v2 exists. CLONE_INTO_CGROUP (Linux 5.7) places the child in its leaf atomically, so no
// process of the sandbox ever runs outside it and cgroup.kill reaches all of them. CLONE_PIDFD
// (5.2; clone3 5.3) gives a pidfd that cannot be confused with a recycled pid: it is what the io
// thread polls for exit and the kill-switch signals.
//
// The child starts a new session (setsid), so pgid == pid and the process-group fallback
// `kill(-pgid, SIGKILL)` reaches the sandbox's ordinary children.
//
// Supervisor death. A sandbox must not outlive its lease unsupervised: once the supervisor is gone
// nothing refreshes the lease nor kills at the deadline, while the sandbox might still act on a
// name lockd has handed to someone else. We therefore set PR_SET_PDEATHSIG(SIGKILL) by default
// (`die_with_supervisor`), and close the race with an early supervisor death by checking getppid()
// right after. An isolated sandbox sets it only after its last credential change (the kernel
// clears it on setresuid/setresgid), and since getppid() is 0 in its new pid namespace it checks
// instead that the parent still holds the sync pipe open (a hang-up: the parent died). Caveats, documented for the daemon: (1) the signal follows the death of the parent
// *thread* that called spawn, not the process — spawn from a thread that lives as long as the
// supervisor (the io thread); (2) it reaches the direct child only; its descendants are reached by
// cgroup.kill (cgroup mode) or by bubblewrap's --die-with-parent (in default_bwrap_args); in the
// process-group fallback without bubblewrap, grandchildren that left the group can survive, which
// is one reason the cgroup mode is preferred. Either way the shm writer heartbeat goes stale and
// the sandbox's own checks refuse (DESIGN.md "The shared-memory epoch table").
//
// Exec failure is reported through a CLOEXEC socket pair (SOCK_SEQPACKET) carrying the failing
// step and errno, so the caller gets "command not found: foo" or "permission denied: /x" rather
// than a child that exits 127; the failed child is reaped before spawn returns, so nothing leaks.
//
// Armed before exec (issue 14). spawn_sandbox() lets the child exec as soon as it is set up, so a
// kill deadline armed after it returns leaves the command running unwatched for as long as the
// caller takes to arm (a stalled io thread: the lease can expire at lockd meanwhile). The
// supervisor therefore starts a sandbox in two steps: prepare_sandbox() returns once the child
// exists in its leaf; it sets itself up and then stops right before its exec, at a gate where it
// waits for one byte on the socket pair — its pidfd, process group and leaf are a complete kill
// target from clone3 on. release_sandbox() sends the byte and waits for the verdict. In between the
// caller arms the kill-switch. Nothing is waited for at the gate (the byte may arrive before the
// child does), so the two steps cost what one did. A child killed before the gate opened never
// executes an instruction of its command; a gate closed without the byte (the caller gave up, or
// died) makes it exit 127 without exec.
//
// Isolation (DESIGN.md "Trust model"; on by default in the daemon). A sandbox runs untrusted
// code, so with `SpawnRequest::isolation` set it is started by the kernel interfaces directly
// (not bubblewrap: the pidfd then names the pid-namespace init itself, so "pidfd readable" means
// the whole namespace is gone, there is no helper process between the supervisor and the
// sandbox, and no second exec on the start path):
//  * clone3(CLONE_PIDFD | CLONE_INTO_CGROUP | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS |
//    CLONE_NEWIPC | CLONE_NEWUTS): the sandbox is the init of its own pid namespace, so when it
//    dies the kernel kills every descendant (also one that called setsid or double-forked)
//    before its exit is reported; it can neither see nor signal a process outside.
//  * The parent maps exactly one host uid and gid into the user namespace (Isolation::uid/gid:
//    never 0); the child then drops its supplementary groups (root parent) and switches to them.
//  * Its own mount namespace (everything private): a fresh /proc of its pid namespace (no
//    /proc/<supervisor>), and each Isolation::hide path covered — a directory by an empty
//    read-only tmpfs, a file by /dev/null — e.g. the key file, the control socket's directory
//    and the host cgroup tree. Then a cgroup namespace rooted at its leaf.
//  * RLIMIT_NPROC in its own user namespace (per sandbox, whatever its uid): a fork bomb stops
//    there even where the leaf has no pids controller.
//  * Every capability dropped (bounding set, ambient, permitted/effective/inheritable),
//    PR_SET_NO_NEW_PRIVS, and the seccomp filter of build_seccomp_filter() as the last step
//    before execve.
//
// The child between clone3 and execve uses raw system calls only (the supervisor is
// multi-threaded; no allocation, no locks, nothing a sanitizer intercepts).
#pragma once

#include "leasehold/lease/result.hpp"

#include <signal.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace leasehold {

/// The descriptor number SpawnRequest::inherit_fd has in the sandbox.
inline constexpr int kInheritedFd = 3;
/// The descriptor number SpawnRequest::tokens_fd has in the sandbox.
inline constexpr int kTokensFd = 4;

/// Bounds on one spawn: argv + env entries, and their total bytes.
inline constexpr std::size_t kSpawnStringsMax = 4096;
inline constexpr std::size_t kSpawnBytesMax = 1u << 20;

/// Where a command is looked up when the environment has no PATH.
inline constexpr const char* kDefaultSearchPath = "/usr/local/bin:/usr/bin:/bin";

/// Bubblewrap wrapping: the sandbox runs as `bwrap <args...> -- <argv...>`.
struct BwrapConfig {
  std::string bwrap_path = "bwrap";  ///< a name (looked up in PATH) or a path
  std::vector<std::string> args;     ///< e.g. default_bwrap_args()
};

/// A conservative default: read-only root, private /dev, /proc and /tmp, and --die-with-parent
/// (bwrap's children die with bwrap). The caller adds binds (e.g. the shm file) as needed.
std::vector<std::string> default_bwrap_args();

/// Resolves `command` like execvp: a name with '/' is taken as is, otherwise each directory
/// of `search_path` (colon-separated; empty entries mean ".") is tried for an executable
/// regular file. The path, or not_found "command not found: <name>", permission_denied
/// "permission denied: <path>" (found, not executable), invalid_argument "empty command".
Result<std::string> resolve_command(std::string_view command, std::string_view search_path);

/// Whether bubblewrap works here: resolves `config.bwrap_path` and runs `bwrap <args> -- true`.
/// Ok when it ran and exited 0. Errors: as spawn_sandbox (not installed: not_found), or
/// unsupported when it failed with status N or was killed (e.g. user namespaces disabled).
Status probe_bwrap(const BwrapConfig& config);

/// A compiled seccomp-BPF program (classic BPF, `struct sock_filter` words), built once in the
/// supervisor and installed by each isolated child with a raw seccomp(2) call.
struct SeccompFilter {
  std::vector<std::uint64_t> words;  ///< sock_filter entries, 8 bytes each
  std::vector<std::string> denied;   ///< the system calls it refuses, for --help and logs
};

/// Builds the sandbox filter with libseccomp: everything is allowed except (EPERM) mount,
/// umount2, pivot_root, chroot, the new mount API (fsopen, fsmount, fspick, move_mount,
/// open_tree, mount_setattr), unshare, setns, clone with any CLONE_NEW* flag (clone3: ENOSYS,
/// so libc falls back to clone), ptrace, process_vm_readv/writev, kcmp, bpf, keyctl, add_key,
/// request_key, perf_event_open, kexec_load, kexec_file_load, init/finit/delete_module,
/// open_by_handle_at, name_to_handle_at, userfaultfd, io_uring_setup, iopl, ioperm, swapon,
/// swapoff, reboot, acct, quotactl, syslog, lookup_dcookie, vhangup, pidfd_getfd and the
/// clock setters. Errors: io_error (or the errno's code) naming the libseccomp step that failed.
Result<SeccompFilter> build_seccomp_filter();

/// How an isolated sandbox runs (see the header comment). uid/gid are host ids, never 0; a
/// non-root supervisor can only map its own euid and egid.
struct Isolation {
  uid_t uid = 0;
  gid_t gid = 0;
  /// Paths covered inside the sandbox (absent ones are skipped): files by /dev/null, directories
  /// by an empty read-only tmpfs.
  std::vector<std::string> hide;
  const SeccompFilter* seccomp = nullptr;  ///< nullptr: no filter (tests of the other layers)
  std::uint64_t nproc_max = 0;             ///< RLIMIT_NPROC in its user namespace; 0 = unchanged
  /// RLIMIT_RTPRIO and RLIMIT_NICE set to 0: no real-time scheduling and no raised priority,
  /// whatever limits the supervisor runs with. A sandbox allowed SCHED_FIFO above the rt
  /// thread's priority could keep the kill-switch from running on every core. Off only in tests
  /// (the ablation).
  bool zero_rt_limits = true;
};

/// Ok when `dir` is a directory of its own that a sandbox's mount namespace may cover with an
/// empty tmpfs: it must be a directory (not a symlink) owned by this process's euid with no
/// permission bits beyond 0700 | `extra_mode` (e.g. 0050 for a --group socket directory), and
/// not "/", a system directory (/etc, /tmp, /home, /run, /usr, /var, ...), the working directory
/// or $HOME. A file renamed over a covered *file* on the host detaches that cover in every
/// namespace (Linux 3.18+); a rename inside a covered directory stays unseen. Errors, the message
/// naming the directory: invalid_argument (not absolute, not a directory, a system directory,
/// the working directory, $HOME), permission_denied (another owner, a wider mode), or lstat's
/// errno (errc_of_errno).
Status check_dedicated_dir(const std::string& dir, mode_t extra_mode = 0);

/// Ok when no directory strictly above `dir` (up to, not including, "/") has an entry this
/// process's euid may rename or replace (its parent is writable to it and not sticky against
/// it). `dir` itself is not checked: a covered directory is a mount point in the sandbox's
/// namespace, which rename(2) refuses (EBUSY) there. A sandbox of a non-root supervisor runs as
/// the same uid: through such an ancestor it could move the whole path aside on the host and put
/// its own directory (and socket, or a key the host then writes) in its place. Errors:
/// permission_denied naming the first such ancestor and why, invalid_argument (not absolute, a
/// symbolic link on the way), or the errno of a failed stat (errc_of_errno).
Status check_no_renamable_ancestor(const std::string& dir);

/// Whether isolation can be used here: ok when an isolated `/bin/true`-like command ran and
/// exited 0. Errors: as spawn_sandbox, or unsupported when the probe failed with status N or was
/// killed (e.g. user namespaces disabled).
Status probe_isolation(const Isolation& isolation, const std::string& command);

struct SpawnRequest {
  std::vector<std::string> argv;  ///< argv[0]: the command (a name looked up in PATH, or a path)
  std::vector<std::string> env;   ///< the whole environment, "KEY=VALUE" (LEASEHOLD_SHM, ...)
  /// The child changes to this directory before exec; empty = the supervisor's own. A relative
  /// command path ("./run", "bin/x") is resolved from it. Failure: SpawnError with the chdir
  /// errno and "cannot change directory to <dir>: <reason>".
  std::string working_directory;
  int cgroup_dir_fd = -1;         ///< a leaf's dir fd for CLONE_INTO_CGROUP, or -1
  const BwrapConfig* bwrap = nullptr;  ///< wrap in bubblewrap when set
  /// Isolate (see the header comment) when set; nullptr is the unisolated legacy spawn: the
  /// sandbox then runs as the supervisor's uid in the host's namespaces.
  const Isolation* isolation = nullptr;
  bool die_with_supervisor = true;     ///< PR_SET_PDEATHSIG(SIGKILL); see the header comment
  int stdin_fd = -1, stdout_fd = -1, stderr_fd = -1;  ///< dup'ed onto 0/1/2 when >= 0
  /// Inherited as descriptor kInheritedFd (e.g. a read-only descriptor of the shm table) when
  /// >= 0; every other descriptor above 2 is closed at exec.
  int inherit_fd = -1;
  /// Inherited as descriptor kTokensFd when >= 0 (the sandbox's own token channel, read-only).
  int tokens_fd = -1;
};

/// A started sandbox: pid, an owned pidfd, and its process group (== pid). Move-only; the
/// destructor closes the pidfd but neither kills nor reaps (the owner decides).
class SandboxProcess {
 public:
  SandboxProcess() noexcept = default;
  SandboxProcess(pid_t pid, int pidfd) noexcept : pid_(pid), pidfd_(pidfd) {}
  SandboxProcess(SandboxProcess&& o) noexcept;
  SandboxProcess& operator=(SandboxProcess&& o) noexcept;
  SandboxProcess(const SandboxProcess&) = delete;
  SandboxProcess& operator=(const SandboxProcess&) = delete;
  ~SandboxProcess();

  pid_t pid() const noexcept { return pid_; }
  pid_t pgid() const noexcept { return pid_; }  ///< the child called setsid()
  int pidfd() const noexcept { return pidfd_; }
  bool valid() const noexcept { return pidfd_ >= 0; }

 private:
  pid_t pid_ = 0;
  int pidfd_ = -1;
};

/// Why spawn failed: `errno_value` lets callers distinguish a missing kernel feature (ENOSYS
/// from clone3) from a bad command (ENOENT, EACCES).
struct SpawnError {
  int errno_value = 0;
  std::string message;
};

/// Starts `request.argv` as described above, in one step: the child execs as soon as it is set
/// up (the probes; see prepare_sandbox for a sandbox that must be watched from its first
/// instruction). On failure returns nullopt and fills `error` ("command not found: foo",
/// "permission denied: /x", "clone3 failed: ..."); no process, fd or pipe is left behind (a leaf
/// cgroup is the caller's to remove).
std::optional<SandboxProcess> spawn_sandbox(const SpawnRequest& request, SpawnError& error);

/// A sandbox child that exists (in its leaf) and cannot exec before release_sandbox(): it sets
/// itself up (namespaces, credentials, descriptors) and then waits at its gate, right before its
/// exec (see the header comment). Move-only. Destroying it (or abandon()) without release_sandbox() closes the gate: the child
/// then exits 127 without exec'ing. It is never reaped here: the owner of process() reaps it.
class PreparedSandbox {
 public:
  PreparedSandbox() noexcept = default;
  PreparedSandbox(PreparedSandbox&& o) noexcept;
  PreparedSandbox& operator=(PreparedSandbox&& o) noexcept;
  PreparedSandbox(const PreparedSandbox&) = delete;
  PreparedSandbox& operator=(const PreparedSandbox&) = delete;
  ~PreparedSandbox();

  /// The child (pid, pidfd, process group): a valid kill target already. The caller may move
  /// it out (e.g. into its own record) before release_sandbox().
  SandboxProcess& process() noexcept { return process_; }
  /// True until release_sandbox() or abandon() was called.
  bool at_gate() const noexcept { return gate_fd_ >= 0; }
  /// Closes the gate without letting the child exec: it exits 127 (not reaped here).
  void abandon() noexcept;

 private:
  friend std::optional<PreparedSandbox> prepare_sandbox(const SpawnRequest& request, SpawnError& error);
  friend bool release_sandbox(PreparedSandbox& prepared, SpawnError& error);
  SandboxProcess process_;
  int gate_fd_ = -1;               // the parent's end of the socket pair
  int sync_fd_ = -1;               // isolated: held until the verdict (the child's parent-death check)
  std::string exec_path_;          // for the verdict's message
  std::string working_directory_;
};

/// The first step of a two-step start: creates the child, which stops at its gate right before
/// its exec. Failures of the request, the command's lookup, clone3 and the uid/gid maps are
/// reported here as by spawn_sandbox (the child reaped, nothing left behind); the child's own
/// set-up steps (chdir, mounts, credentials, ...) report at release_sandbox().
std::optional<PreparedSandbox> prepare_sandbox(const SpawnRequest& request, SpawnError& error);

/// The second step: lets the child exec and waits for the verdict. True when it exec'd (or was
/// killed after the byte was sent, before or right at its exec: its pidfd then reports the exit
/// as for any sandbox). False with `error` when it did not run its command: a set-up step or the
/// exec failed (chdir, ENOENT/EACCES/ENOEXEC..., the messages as spawn_sandbox's), it was already
/// dead (ESRCH, e.g. killed at its gate by the kill-switch), or the gate was closed (EBADF). Either way the
/// child is NOT reaped (it has exited or is exiting): its owner reaps it once nothing else (the
/// kill-switch) may still use its pidfd or process group. The gate is closed afterwards.
bool release_sandbox(PreparedSandbox& prepared, SpawnError& error);

/// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER): orphaned descendants of
/// sandboxes are re-parented to the supervisor, not init, so they stay reapable and visible.
/// Errors: as prctl(2) (errc_of_errno).
Status become_child_subreaper();

/// waitid(P_PIDFD, pidfd, WEXITED [| WNOHANG]). 0 with `info` filled (info.si_pid == 0 when
/// `block` is false and the child has not exited yet), or -errno (-ECHILD: already reaped).
int reap(int pidfd, siginfo_t& info, bool block) noexcept;

}  // namespace leasehold
