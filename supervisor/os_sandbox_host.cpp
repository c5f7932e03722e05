#include "leasehold/supervisor/os_sandbox_host.hpp"

#include "leasehold/io/clock.hpp"
#include "leasehold/supervisor/kill_switch.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace leasehold {
namespace {

// The answer's code for a start that failed: the command (or its directory) is the caller's
// problem; killed at its gate is the kill-switch's doing; anything else is internal.
ControlError failure_code(const SpawnError& e) {
  if (e.errno_value == ENOENT || e.errno_value == EACCES || e.errno_value == ENOEXEC || e.errno_value == ENOTDIR ||
      e.errno_value == ELOOP)
    return ControlError::exec_failed;
  return e.errno_value == ESRCH ? ControlError::killswitch : ControlError::internal;
}

PortError internal(std::string message) { return PortError{ControlError::internal, std::move(message)}; }

}  // namespace

OsSandboxHost::OsSandboxHost(OsSandboxHostConfig config, ExitHandler on_exit)
    : cfg_(std::move(config)), on_exit_(std::move(on_exit)) {}

OsSandboxHost::Record* OsSandboxHost::find(const SandboxId& id) {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}
const OsSandboxHost::Record* OsSandboxHost::find(const SandboxId& id) const {
  auto it = records_.find(id);
  return it == records_.end() ? nullptr : &it->second;
}

void OsSandboxHost::log(const std::string& event) const {
  if (cfg_.log) cfg_.log(event);
}

void OsSandboxHost::test_stall() const {
  if (cfg_.test_stall_ms == 0) return;
  log("event=test_stall where=after_spawn ms=" + std::to_string(cfg_.test_stall_ms));
  const std::uint64_t until = static_cast<std::uint64_t>(boottime_ns()) + cfg_.test_stall_ms * 1'000'000ull;
  const timespec ts{static_cast<time_t>(until / 1'000'000'000ull), static_cast<long>(until % 1'000'000'000ull)};
  while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
  log("event=test_stall_end where=after_spawn");
}

std::optional<PortError> OsSandboxHost::open_tokens(const SandboxId& id) {
  Record& r = records_[id];
  if (r.tokens) return std::nullopt;
  try {
    r.tokens.emplace(shm::TokenChannel::create("leasehold-tokens-" + id.str()));
  } catch (const std::exception& e) {
    return internal(std::string("cannot create the sandbox's token channel: ") + e.what());
  }
  return std::nullopt;
}

shm::TableErrc OsSandboxHost::publish_token(const SandboxId& id, Epoch epoch, std::span<const std::uint8_t> token) {
  Record* r = find(id);
  return r != nullptr && r->tokens ? r->tokens->publish(epoch, token) : shm::TableErrc::ok;
}

void OsSandboxHost::clear_tokens(const SandboxId& id) {
  if (Record* r = find(id); r != nullptr && r->tokens) r->tokens->clear();
}

std::optional<PortError> OsSandboxHost::create(const SandboxSpec& spec, HostedSandbox& out) {
  Record& r = records_[spec.id];
  const std::string idstr = spec.id.str();
  // Whatever fails below leaves no leaf behind.
  auto fail = [&](PortError e) -> std::optional<PortError> {
    if (r.leaf.valid() && !r.leaf.remove().ok()) log("level=warn event=cgroup_leak path=" + r.leaf.path());
    r.leaf = CgroupLeaf{};
    return e;
  };
  if (cfg_.cgroups != nullptr && cfg_.cgroups->mode() == KillMode::cgroup_v2_delegated) {
    auto leaf = cfg_.cgroups->create_leaf(idstr);
    if (!leaf) return fail(internal(leaf.message()));
    r.leaf = std::move(*leaf);
  }
  SpawnRequest sr;
  sr.argv = spec.argv;
  sr.env = spec.env;
  auto set_env = [&](const std::string& k, const std::string& v) {
    for (auto& e : sr.env)
      if (e.rfind(k + "=", 0) == 0) {
        e = k + "=" + v;
        return;
      }
    sr.env.push_back(k + "=" + v);
  };
  // A read-only descriptor of the table: the sandbox maps it without a path. The default memfd
  // is 0440 and sealed (no holder can write, grow, shrink or map it writable, reopened or not);
  // a --shm file is 0640, so another uid cannot open it.
  set_env("LEASEHOLD_SHM", cfg_.table_ro_fd >= 0 ? std::to_string(kInheritedFd) : cfg_.shm_path);
  sr.inherit_fd = cfg_.table_ro_fd;
  // Its own token channel, read-only: the tokens of its grants and of nobody else's.
  static_assert(kTokensFd == shm::kTokenChannelFd);
  if (!r.tokens) return fail(internal("the sandbox has no token channel to inherit"));
  const Result<int> reopened = r.tokens->reopen_read_only();
  if (!reopened.ok()) return fail(internal("cannot reopen the sandbox's token channel read-only: " + reopened.message()));
  const shm::OwnedFd tokens_ro(*reopened);
  set_env(shm::kTokenChannelEnv, std::to_string(kTokensFd));
  sr.tokens_fd = tokens_ro.fd;
  set_env("LEASEHOLD_SLOT", std::to_string(spec.slot));
  set_env("LEASEHOLD_EPOCH", std::to_string(spec.epoch));
  set_env("LEASEHOLD_SANDBOX", idstr);
  if (spec.name) set_env("LEASEHOLD_NAME", *spec.name);
  sr.working_directory = spec.cwd;
  sr.cgroup_dir_fd = r.leaf.valid() ? r.leaf.dir_fd() : -1;
  sr.bwrap = cfg_.bwrap;
  Isolation iso;
  if (cfg_.isolation) {
    iso = cfg_.isolation(spec.caller_uid, spec.caller_gid, spec.slot);
    sr.isolation = &iso;
  }
  sr.die_with_supervisor = spec.die_with_supervisor;
  sr.stdin_fd = cfg_.stdin_fd;
  // Its output goes to a file of its own (0600, the supervisor's; read back by `logs`).
  const std::string log_path = cfg_.log_dir + "/" + idstr + ".log";
  // The sandbox writes into a pipe, never into the file: the output pump copies at most
  // log_max_bytes of it, so a sandbox cannot fill the log's filesystem.
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (log_fd < 0) return fail(internal("cannot create the sandbox log " + log_path + ": " + std::strerror(errno)));
  int out_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(log_fd);
    ::unlink(log_path.c_str());
    return fail(internal(std::string("cannot create the sandbox's output pipe: ") + std::strerror(e)));
  }
  sr.stdout_fd = sr.stderr_fd = out_pipe[1];
  SpawnError se;
  // The child stops at its gate, right before its exec (spawn.hpp). Ablated, it execs at once.
  std::optional<SandboxProcess> proc;
  if (cfg_.exec_at_once) proc = spawn_sandbox(sr, se);
  else if ((r.prepared = prepare_sandbox(sr, se))) proc = std::move(r.prepared->process());
  ::close(out_pipe[1]);
  if (!proc) {
    ::close(out_pipe[0]);
    ::close(log_fd);
    ::unlink(log_path.c_str());
    r.prepared.reset();
    return fail(PortError{failure_code(se), se.message});
  }
  if (cfg_.output != nullptr) cfg_.output->add(out_pipe[0], log_fd, cfg_.log_max_bytes);
  r.process = std::move(*proc);
  const SandboxId id = spec.id;
  r.exit_poll = cfg_.loop->add_poll(r.process.pidfd(), POLLIN, PollMode::oneshot, [this, id](int) {
    if (Record* rec = find(id)) rec->exit_poll = PollId{};
    if (on_exit_) on_exit_(id);
  });
  out.pid = r.process.pid();
  out.uid = cfg_.isolation ? iso.uid : ::geteuid();
  out.log_path = log_path;
  out.cgroup_path = r.leaf.valid() ? r.leaf.path() : std::string();
  out.at_gate = r.prepared.has_value();
  if (!out.at_gate) test_stall();  // the ablated order: exec'd, not yet armed
  return std::nullopt;
}

KillTarget OsSandboxHost::kill_target(const SandboxId& id) const {
  KillTarget t;
  const Record* r = find(id);
  if (r == nullptr) return t;
  t.cgroup_kill_fd = r->leaf.valid() ? r->leaf.kill_fd() : -1;
  t.cgroup_events_fd = r->leaf.valid() ? r->leaf.events_fd() : -1;
  t.pidfd = r->process.valid() ? r->process.pidfd() : -1;
  t.pgid = r->process.valid() ? r->process.pgid() : 0;
  return t;
}

std::optional<PortError> OsSandboxHost::release(const SandboxId& id, std::uint64_t exec_by_ns) {
  Record* r = find(id);
  if (r == nullptr || !r->prepared) return std::nullopt;
  test_stall();  // armed, at its gate
  if (const auto t = static_cast<std::uint64_t>(boottime_ns()); exec_by_ns != 0 && t >= exec_by_ns) {
    // The start took so long (a stalled io thread, a slow set-up) that the kill-switch's
    // deadline is (nearly) here: the rt thread kills it (or has), and it must not exec now.
    return PortError{ControlError::killswitch, "the kill-switch's deadline for the sandbox was less than one rt "
                                               "command poll away when it could exec (" +
                                                   std::to_string((t - exec_by_ns) / 1'000'000) +
                                                   " ms late; its start was delayed); its command never ran; retry"};
  }
  SpawnError se;
  const bool ok = release_sandbox(*r->prepared, se);
  r->prepared.reset();
  if (!ok) return PortError{failure_code(se), se.message};
  return std::nullopt;
}

void OsSandboxHost::abandon(const SandboxId& id) {
  Record* r = find(id);
  if (r == nullptr || !r->prepared) return;
  r->prepared->abandon();
  r->prepared.reset();
}

void OsSandboxHost::kill(const SandboxId& id, std::uint64_t now_ns) {
  const Record* r = find(id);
  if (r != nullptr && (r->process.valid() || r->leaf.valid())) KillSwitch::kill(kill_target(id), now_ns);
}

void OsSandboxHost::terminate(const SandboxId& id) {
  const Record* r = find(id);
  if (r == nullptr) return;
  if (!r->leaf.valid()) {  // no leaf: its first process and its process group
    if (r->process.valid()) {
      (void)::syscall(SYS_pidfd_send_signal, r->process.pidfd(), SIGTERM, nullptr, 0);
      (void)::kill(-r->process.pgid(), SIGTERM);
    }
    return;
  }
  // Every pid of the leaf. A pid read here may exit and be reused before it is signalled, so
  // each is pinned with a pidfd first and checked to be in the leaf still (/proc/PID/cgroup):
  // a pidfd of a process that exited meanwhile signals nothing (ESRCH).
  const int fd = ::openat(r->leaf.dir_fd(), "cgroup.procs", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  std::string procs;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) procs.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const std::string& leaf = r->leaf.path();
  std::size_t pos = 0;
  int signalled = 0;
  while (pos < procs.size()) {
    const std::size_t nl = procs.find('\n', pos);
    const std::string line = procs.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? procs.size() : nl + 1;
    const long pid = std::strtol(line.c_str(), nullptr, 10);
    if (pid <= 0) continue;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (pidfd < 0) continue;
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%ld/cgroup", pid);
    const int cg = ::open(path, O_RDONLY | O_CLOEXEC);
    char text[4096];
    const ssize_t n = cg >= 0 ? ::read(cg, text, sizeof text - 1) : -1;
    if (cg >= 0) ::close(cg);
    if (n > 0) {
      std::string own(text, static_cast<std::size_t>(n));  // "0::/parent/leaf\n" (cgroup v2)
      const std::size_t sep = own.rfind("::");
      own = sep == std::string::npos ? std::string() : own.substr(sep + 2);
      while (!own.empty() && own.back() == '\n') own.pop_back();
      if (!own.empty() && leaf.size() >= own.size() && leaf.compare(leaf.size() - own.size(), own.size(), own) == 0 &&
          ::syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, nullptr, 0) == 0)
        ++signalled;
    }
    ::close(pidfd);
  }
  log("event=terminate sandbox=" + id.str() + " signalled=" + std::to_string(signalled));
}

ReapedSandbox OsSandboxHost::reap(const SandboxId& id) {
  ReapedSandbox out;
  auto it = records_.find(id);
  if (it == records_.end()) return out;
  Record& r = it->second;
  if (r.process.valid()) {
    siginfo_t info{};
    if (leasehold::reap(r.process.pidfd(), info, false) == 0 && info.si_pid != 0)
      out.exit_code = info.si_code == CLD_EXITED ? info.si_status : -info.si_status;
  }
  r.process = SandboxProcess{};  // closes the pidfd
  if (r.leaf.valid()) {
    Status removed = r.leaf.remove();
    for (int i = 0; removed.code() == Errc::busy && i < 100; ++i) {  // killed tasks leave the cgroup asynchronously
      r.leaf.kill();
      ::usleep(1000);
      removed = r.leaf.remove();
    }
    if (!removed.ok()) log("level=warn event=cgroup_leak path=" + r.leaf.path() + " error=\"" + removed.message() + "\"");
    // Dead means the pidfd reported the exit *and* the leaf is empty.
    out.still_populated = r.leaf.valid() && r.leaf.populated() == 1;
  }
  if (out.still_populated) {
    r.tokens.reset();  // the leaf alone is kept, for leaf_emptied()
    return out;
  }
  records_.erase(it);
  return out;
}

bool OsSandboxHost::leaf_emptied(const SandboxId& id) {
  auto it = records_.find(id);
  if (it == records_.end()) return true;
  CgroupLeaf& leaf = it->second.leaf;
  if (leaf.valid() && leaf.populated() == 1) {
    leaf.kill();
    return false;
  }
  if (leaf.valid() && !leaf.remove().ok()) return false;
  records_.erase(it);
  return true;
}

void OsSandboxHost::forget(const SandboxId& id) {
  auto it = records_.find(id);
  if (it == records_.end()) return;
  if (it->second.exit_poll.valid()) cfg_.loop->cancel_poll(it->second.exit_poll);
  records_.erase(it);  // closes the pidfd and the leaf's fds; a populated leaf stays
}

void OsSandboxHost::stop_all(std::uint64_t now_ns) {
  for (auto& [id, r] : records_) {
    if (r.process.valid() || r.leaf.valid()) KillSwitch::kill(kill_target(id), now_ns);
    if (r.process.valid()) {
      siginfo_t info{};
      leasehold::reap(r.process.pidfd(), info, true);
    }
    if (r.leaf.valid()) {
      for (int i = 0; i < 100 && r.leaf.remove().code() == Errc::busy; ++i) ::usleep(1000);
    }
  }
  records_.clear();
}

}  // namespace leasehold
