// leasehold/supervisor: spawn (see spawn.hpp).
#include "supervisor/spawn.hpp"

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace leasehold {
namespace {

// What the child reports through the pipe when a step before exec (or exec itself) fails.
enum class ChildStep : int { setsid = 1, pdeathsig, parent_gone, stdio, signals, exec, chdir };

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
  int report_fd;
  pid_t parent;
  bool die_with_parent;
  int stdio[3];
  const char* working_directory;  // nullptr: stay
};

[[noreturn]] void child_fail(const ChildPlan& p, ChildStep step, long err) {
  const ChildReport r{static_cast<int>(step), static_cast<int>(err)};
  syscall(SYS_write, p.report_fd, &r, sizeof r);
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

// Raw system calls return -1 and set errno through syscall(); errno is thread-local and the
// child has one thread, so reading it is safe.
[[noreturn]] void child_main(const ChildPlan& p) {
  if (syscall(SYS_setsid) < 0) child_fail(p, ChildStep::setsid, errno);
  if (p.die_with_parent) {
    if (syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) child_fail(p, ChildStep::pdeathsig, errno);
    // The supervisor may have died between clone3 and prctl: then nobody would kill us.
    if (syscall(SYS_getppid) != p.parent) child_fail(p, ChildStep::parent_gone, ESRCH);
  }
  for (int i = 0; i < 3; ++i) {
    if (p.stdio[i] >= 0 && syscall(SYS_dup2, p.stdio[i], i) < 0) child_fail(p, ChildStep::stdio, errno);
  }
  if (p.working_directory != nullptr && syscall(SYS_chdir, p.working_directory) < 0) {
    child_fail(p, ChildStep::chdir, errno);
  }
  // Nothing but 0..2 (and the report pipe, already CLOEXEC) crosses exec. Best effort: old
  // kernels (< 5.11) lack CLOSE_RANGE_CLOEXEC, and the supervisor opens everything CLOEXEC anyway.
  syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
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

}  // namespace

std::vector<std::string> default_bwrap_args() {
  return {"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
          "--die-with-parent"};
}

std::optional<std::string> resolve_command(std::string_view command, std::string_view search_path,
                                           std::string& error) {
  if (command.empty()) {
    error = "empty command";
    return std::nullopt;
  }
  if (command.find('/') != std::string_view::npos) {
    std::string path(command);
    bool exists = false;
    if (is_executable_file(path, exists)) return path;
    error = exists ? "permission denied: " + path : "command not found: " + path;
    return std::nullopt;
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
  error = denied.empty() ? "command not found: " + std::string(command) : "permission denied: " + denied;
  return std::nullopt;
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

std::optional<SandboxProcess> spawn_sandbox(const SpawnRequest& request, SpawnError& error) {
  error = {};
  auto fail = [&](int err, std::string message) -> std::optional<SandboxProcess> {
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
  std::string why;
  // A relative path with a '/' names a file below the working directory the child will be in.
  const std::string& name = request.argv[0];
  const bool below_cwd = !request.working_directory.empty() && !name.empty() && name.front() != '/' &&
                         name.find('/') != std::string::npos;
  const auto command = resolve_command(below_cwd ? request.working_directory + "/" + name : name, search, why);
  if (!command) return fail(why.rfind("permission", 0) == 0 ? EACCES : ENOENT, why);

  std::vector<std::string> full;
  std::string exec_path = *command;
  if (request.bwrap != nullptr) {
    const auto bwrap = resolve_command(request.bwrap->bwrap_path, search, why);
    if (!bwrap) return fail(ENOENT, "bubblewrap requested but unusable: " + why);
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

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return fail(errno, std::string("pipe2: ") + std::strerror(errno));

  const ChildPlan plan{exec_path.c_str(), argv.data(), envp.data(), report[1], ::getpid(),
                       request.die_with_supervisor,
                       {request.stdin_fd, request.stdout_fd, request.stderr_fd},
                       request.working_directory.empty() ? nullptr : request.working_directory.c_str()};
  int pidfd = -1;
  clone_args args{};
  args.flags = CLONE_PIDFD;
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
  if (pid < 0) {
    ::close(report[0]);
    if (clone_err == ENOSYS) return fail(ENOSYS, "clone3 is not available (needs Linux 5.3)");
    if (request.cgroup_dir_fd >= 0) {
      return fail(clone_err, std::string("clone3 into the sandbox cgroup failed: ") + std::strerror(clone_err) +
                                 " (CLONE_INTO_CGROUP needs Linux 5.7 and a cgroup v2 leaf)");
    }
    return fail(clone_err, std::string("clone3 failed: ") + std::strerror(clone_err));
  }

  ChildReport r{};
  ssize_t n;
  do {
    n = ::read(report[0], &r, sizeof r);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  SandboxProcess process(static_cast<pid_t>(pid), pidfd);
  if (n == 0) return process;  // the pipe closed on exec: running

  // The child failed before or at exec: reap it so nothing is left behind.
  siginfo_t info{};
  reap(pidfd, info, true);
  if (n != static_cast<ssize_t>(sizeof r)) return fail(EIO, "sandbox child reported a truncated error");
  if (r.step == static_cast<int>(ChildStep::chdir)) {
    return fail(r.err, "cannot change directory to " + request.working_directory + ": " + std::strerror(r.err));
  }
  if (r.step == static_cast<int>(ChildStep::exec)) {
    if (r.err == ENOENT) return fail(ENOENT, "command not found: " + exec_path);
    if (r.err == EACCES) return fail(EACCES, "permission denied: " + exec_path);
    return fail(r.err, "cannot execute " + exec_path + ": " + std::strerror(r.err));
  }
  return fail(r.err, std::string("sandbox set-up failed at ") + step_name(r.step) + ": " + std::strerror(r.err));
}

int become_child_subreaper() noexcept {
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 ? 0 : -errno;
}

int reap(int pidfd, siginfo_t& info, bool block) noexcept {
  info = {};
  int r;
  do {
    r = ::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED | (block ? 0 : WNOHANG));
  } while (r < 0 && errno == EINTR);
  return r == 0 ? 0 : -errno;
}

std::string probe_bwrap(const BwrapConfig& config) {
  SpawnRequest req;
  req.argv = {"true"};
  const char* path = std::getenv("PATH");
  req.env = {std::string("PATH=") + (path != nullptr ? path : kDefaultSearchPath)};
  req.bwrap = &config;
  SpawnError err;
  auto p = spawn_sandbox(req, err);
  if (!p) return err.message;
  siginfo_t info{};
  if (int r = reap(p->pidfd(), info, true); r < 0) return std::string("waitid: ") + std::strerror(-r);
  if (info.si_code != CLD_EXITED) return "bwrap was killed by signal " + std::to_string(info.si_status);
  if (info.si_status != 0) {
    return "bwrap exited with status " + std::to_string(info.si_status) +
           " (user namespaces or mounts not permitted here?)";
  }
  return {};
}

}  // namespace leasehold
