#include "leasehold/supervisor/config.hpp"

#include "leasehold/io/address_list.hpp"
#include "leasehold/shm/table.hpp"

#include <CLI/CLI.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace leasehold {
namespace {

std::string ms_text(double ns) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f ms", ns / 1e6);
  return buf;
}

template <class Id>
Id random_uuid_v4() {
  std::uint8_t b[16] = {};
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
  }
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  Id id;
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | b[i];
    id.lo = (id.lo << 8) | b[8 + i];
  }
  return id;
}

}  // namespace

Result<ConfigBudget> check_config(const SupervisorConfig& c) {
  ConfigBudget r;
  const auto refuse = [](std::string why) { return Status::invalid(std::move(why)); };
  if (c.lockd_address.empty())
    return refuse("--lockd is required (host:port of leasehold-lockd, or several comma-separated)");
  const Result<std::vector<AddressEntry>> lockds = split_address_list(c.lockd_address);
  if (!lockds) return refuse("--lockd " + lockds.message());
  r.lockd_addresses = static_cast<std::uint32_t>(lockds->size());
  if (c.lockd_failover_ms == 0 || c.lockd_failover_ms > kTtlMsMax)
    return refuse("--lockd-failover-ms " + std::to_string(c.lockd_failover_ms) + " is out of range 1.." +
                  std::to_string(kTtlMsMax));
  if (c.key_file.empty()) return refuse("--key-file is required (this worker's key, derived by lockd --derive-worker-key)");
  if (c.ttl_ms == 0 || c.ttl_ms > kTtlMsMax)
    return refuse("--ttl-ms " + std::to_string(c.ttl_ms) + " is out of range 1.." +
                  std::to_string(kTtlMsMax));
  if (c.kill_after_ms == 0) return refuse("--kill-after-ms must be > 0");
  if (c.heartbeat_interval_ms == 0) return refuse("--heartbeat-interval-ms must be > 0");
  if (!(c.clock_rate_bound >= 0.0) || c.clock_rate_bound > kClockRateBoundMax)
    return refuse("--clock-rate-bound " + std::to_string(c.clock_rate_bound) +
                  " is out of range 0.." + std::to_string(kClockRateBoundMax));
  if (c.slots == 0 || c.slots > kSlotsMax)
    return refuse("--slots " + std::to_string(c.slots) + " is out of range 1.." +
                  std::to_string(kSlotsMax));
  if (c.wheel_granularity_ns < 100'000 || c.wheel_granularity_ns > 100'000'000)
    return refuse("--wheel-granularity-us " + std::to_string(c.wheel_granularity_ns / 1000) +
                  " is out of range 100..100000");
  if (c.rt_command_poll_ns < 100'000 || c.rt_command_poll_ns > 100'000'000)
    return refuse("--rt-command-poll-us " + std::to_string(c.rt_command_poll_ns / 1000) +
                  " is out of range 100..100000");
  if (c.rt_priority < 1 || c.rt_priority > 99)
    return refuse("--rt-priority " + std::to_string(c.rt_priority) +
                  " is out of range 1..99 (SCHED_FIFO)");

  // DESIGN.md "Time": kill_after·(1+ρ) + wheel_granularity + kill_latency_budget < ttl·(1−ρ),
  // in integer ns rounded toward safety (lease/timing.hpp).
  const timing::Inputs in = timing::inputs_of(c);
  const timing::Safety safety = timing::check_safety(in);
  r.pause_budget_ns = safety.pause_budget_ns;
  if (!safety.safe) {
    return refuse(
        "unsafe timing (DESIGN.md \"Time\"): kill_after*(1+rho) + wheel_granularity + "
        "kill_latency_budget = " +
        ms_text(static_cast<double>(timing::stretch_up_ns(in.kill_after_ns, in.rho_ppb))) + " + " +
        ms_text(static_cast<double>(in.wheel_granularity_ns)) + " + " +
        ms_text(static_cast<double>(in.kill_latency_budget_ns)) + " = " +
        ms_text(static_cast<double>(safety.left_ns)) + " is not below ttl*(1-rho) = " +
        ms_text(static_cast<double>(safety.right_ns)) +
        "; lower --kill-after-ms or --kill-latency-budget-ms, or raise --ttl-ms (and lockd's TTL)");
  }

  // At least kMinRefreshAttempts refreshes must fit in kill_after, or one lost datagram
  // (or one slow answer) fires the kill-switch.
  r.refresh_attempts = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(c.kill_after_ms / c.heartbeat_interval_ms, UINT32_MAX));
  if (r.refresh_attempts < kMinRefreshAttempts) {
    return refuse("--heartbeat-interval-ms " + std::to_string(c.heartbeat_interval_ms) +
                  " allows only " + std::to_string(r.refresh_attempts) +
                  " refresh attempt(s) within --kill-after-ms " + std::to_string(c.kill_after_ms) +
                  "; at least " + std::to_string(kMinRefreshAttempts) +
                  " are needed so that one lost datagram does not fire the kill-switch "
                  "(use an interval <= " +
                  std::to_string(c.kill_after_ms / kMinRefreshAttempts) + " ms)");
  }

  // Several lockd addresses: a new leader must be reached before the kill-switch fires
  // (config.hpp): failover + longest retry gap < kill_after − heartbeat_interval.
  r.retry_gap_ns = longest_backoff_ns(lockd_retry_policy(c));
  if (r.lockd_addresses > 1) {
    const std::int64_t failover_ns = static_cast<std::int64_t>(c.lockd_failover_ms) * kNsPerMs;
    const std::int64_t left_ns = failover_ns + r.retry_gap_ns;
    const std::int64_t right_ns = static_cast<std::int64_t>(c.kill_after_ms) * kNsPerMs -
                                  static_cast<std::int64_t>(c.heartbeat_interval_ms) * kNsPerMs;
    r.failover_margin_ns = right_ns - left_ns;
    if (r.failover_margin_ns <= 0) {
      return refuse("unsafe failover (DESIGN.md \"Time\"): with " + std::to_string(r.lockd_addresses) +
                    " lockd addresses the supervisor must reach a new leader before its kill-switch fires, but "
                    "--lockd-failover-ms + the longest retry gap = " + ms_text(static_cast<double>(failover_ns)) +
                    " + " + ms_text(static_cast<double>(r.retry_gap_ns)) + " = " +
                    ms_text(static_cast<double>(left_ns)) + " is not below --kill-after-ms - --heartbeat-interval-ms = " +
                    ms_text(static_cast<double>(c.kill_after_ms) * kNsPerMs) + " - " +
                    ms_text(static_cast<double>(c.heartbeat_interval_ms) * kNsPerMs) + " = " +
                    ms_text(static_cast<double>(right_ns)) +
                    "; raise --kill-after-ms (with --ttl-ms and lockd's TTL), lower --heartbeat-interval-ms "
                    "(the retry gap is 1.2 intervals), or shorten lockd's failover");
    }
  }
  return r;
}

RetryPolicy lockd_retry_policy(const SupervisorConfig& c) {
  RetryPolicy retry;
  const std::int64_t interval_ns = static_cast<std::int64_t>(c.heartbeat_interval_ms) * kNsPerMs;
  retry.first_backoff_ns = std::max<std::int64_t>(5'000'000, interval_ns / 4);
  retry.backoff_max_ns = interval_ns;
  return retry;
}

std::string runtime_dir() {
  if (geteuid() == 0) return "/run/leasehold";
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0')
    return std::string(xdg) + "/leasehold";
  // Not /tmp: anyone may create a directory there first. The control socket server checks
  // that this one is ours with mode 0700 (0750 with --group).
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/') return std::string(home) + "/.leasehold";
  return "/tmp/leasehold-" + std::to_string(geteuid());
}

std::string default_control_socket_path() {
  for (const char* var : {"LEASEHOLD_CONTROL_SOCKET", "LEASEHOLD_SUPERVISOR"})
    if (const char* env = std::getenv(var); env != nullptr && *env != '\0') return env;
  return runtime_dir() + "/supervisor.sock";
}

std::string worker_lock_path(const WorkerId& worker) { return runtime_dir() + "/worker-" + worker.str() + ".lock"; }

std::vector<SweptWorker> sweep_stale_workers(const std::string& lock_dir, const std::string& shm_dir,
                                             const WorkerId& self) {
  std::vector<SweptWorker> swept;
  DIR* d = ::opendir(lock_dir.c_str());
  if (d == nullptr) return swept;
  constexpr std::string_view kPrefix = "worker-", kSuffix = ".lock";
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& name : names) {
    if (name.size() <= kPrefix.size() + kSuffix.size() || name.rfind(kPrefix, 0) != 0 ||
        name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
      continue;
    const auto worker = WorkerId::parse(name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size()));
    // Only names this code makes: worker-<canonical uuid>.lock, never our own.
    if (!worker || worker->is_nil() || *worker == self || std::string(kPrefix) + worker->str() + std::string(kSuffix) != name)
      continue;
    const std::string path = lock_dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat held {}, named {};
    // Held: a live supervisor's. Not held: taken now, so a supervisor of that worker that starts
    // meanwhile waits, then finds the file gone and makes its own.
    if (::fstat(fd, &held) != 0 || !S_ISREG(held.st_mode) || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    // Still the file at that name (a departing holder unlinks before it unlocks)?
    if (::lstat(path.c_str(), &named) != 0 || named.st_ino != held.st_ino || named.st_dev != held.st_dev) {
      ::close(fd);
      continue;
    }
    SweptWorker w{*worker, {}};
    const std::string shm = shm_dir + "/leasehold-" + worker->str();
    struct stat st {};
    if (::lstat(shm.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && ::unlink(shm.c_str()) == 0)
      w.removed.push_back(shm);
    const std::string logs = lock_dir + "/sandbox-logs-" + worker->str();
    if (::rmdir(logs.c_str()) == 0) w.removed.push_back(logs);  // only when empty: output is kept
    if (::unlink(path.c_str()) == 0) w.removed.push_back(path);  // still holding the lock
    ::close(fd);
    swept.push_back(std::move(w));
  }
  return swept;
}

std::string default_shm_path(const WorkerId& worker) {
  return std::string(shm::kMemfdPrefix) + "leasehold-" + worker.str();
}

std::string_view to_string(SupervisorMode m) noexcept {
  return m == SupervisorMode::lease ? "lease" : "preemptible";
}

std::string_view to_string(ShutdownPolicy p) noexcept {
  return p == ShutdownPolicy::kill ? "kill" : "keep";
}

WorkerId random_worker_id() { return random_uuid_v4<WorkerId>(); }
SandboxId random_sandbox_id() { return random_uuid_v4<SandboxId>(); }

void add_supervisor_flags(CLI::App& app, SupervisorConfig& c) {
  add_config_file(app, kSupervisorConfigDefault);
  add_log_flags(app, c.log);
  app.add_option("--lockd", c.lockd_address,
                 "lockd address HOST:PORT (UDP; a numeric address or a host name, resolved at start), or a "
                 "comma-separated list A,B,C of a replicated lockd's addresses (at most 16): the supervisor "
                 "follows the leader")
      ->required();
  app.add_option("--lockd-failover-ms", c.lockd_failover_ms,
                 "with several --lockd addresses: the longest time from the loss of lockd's leader to a new one "
                 "serving (leadership lease + election), ms; checked at start: failover + 1.2 heartbeat "
                 "intervals < kill_after - heartbeat interval")
      ->capture_default_str();
  app.add_option("--key-file", c.key_file,
                 "this worker's key file (leasehold-lockd --derive-worker-key; mode 0600): it names "
                 "the worker id, and the supervisor speaks to lockd only as that worker")
      ->required();
  app.add_option_function<std::string>(
         "--worker-id",
         [&c](const std::string& text) {
           auto id = WorkerId::parse(text);
           if (!id || id->is_nil()) throw CLI::ValidationError("--worker-id", "not a UUID: " + text);
           c.worker_id = *id;
         },
         "this worker's id, UUID; optional: the key file names it, and a different one is refused");
  app.add_option("--shm", c.shm_path,
                 "shm epoch table location (default: memfd:leasehold-<worker id>, a sealed memfd no sandbox can "
                 "write, grow or shrink; root reads it from outside at /proc/<supervisor pid>/fd/<N>, printed at "
                 "start). A path or shm name makes a 0640 file external readers can open; a non-root supervisor "
                 "with isolation refuses one (its sandboxes share its uid and could truncate it)");
  add_metrics_flags(app, c.metrics_listen, c.metrics_allow, 9741);
  app.add_option("--control-socket", c.control_socket_path,
                 "control socket path (default: /run/leasehold/supervisor.sock as root, else "
                 "$XDG_RUNTIME_DIR/leasehold/supervisor.sock or $HOME/.leasehold/supervisor.sock, a directory that must be "
                 "this user's with mode 0700; $LEASEHOLD_CONTROL_SOCKET or $LEASEHOLD_SUPERVISOR overrides)");
  app.add_option("--sandbox-log-dir", c.sandbox_log_dir,
                 "directory for each sandbox's stdout and stderr, <sandbox id>.log (default: <runtime dir>/"
                 "sandbox-logs-<worker id>; must be this user's, writable by neither group nor others); "
                 "`leasehold logs` shows one to its owner. At exit the supervisor removes the logs that stayed "
                 "empty, and the default directory once nothing is left in it");
  app.add_option("--sandbox-log-max-bytes", c.sandbox_log_max_bytes,
                 "at most this many bytes of a sandbox's output are kept in its log file; the rest is read and "
                 "discarded, after one line saying so (default 8388608)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("--group", c.group,
                 "group whose members may use the control socket besides root (default: root only)");
  app.add_option("--ttl-ms", c.ttl_ms,
                 "lease TTL in ms; at most lockd's --ttl-ms, checked at start (--mode preemptible: at most "
                 "lockd's worker-liveness TTL); the kill-switch is timed for it, so a grant with a shorter TTL "
                 "is given back")
      ->capture_default_str();
  app.add_option("--heartbeat-interval-ms", c.heartbeat_interval_ms,
                 "interval between batched heartbeats, ms")
      ->capture_default_str();
  app.add_option("--kill-after-ms", c.kill_after_ms,
                 "kill a sandbox this many ms after the send time of its last acknowledged refresh")
      ->capture_default_str();
  app.add_option("--clock-rate-bound", c.clock_rate_bound,
                 "rho: bound on the clock-rate difference between hosts, dimensionless")
      ->capture_default_str();
  app.add_option("--kill-latency-budget-ms", c.kill_latency_budget_ms,
                 "time allowed from a kill deadline to the sandbox being dead, ms")
      ->capture_default_str();
  app.add_option_function<std::uint64_t>(
         "--wheel-granularity-us",
         [&c](std::uint64_t us) { c.wheel_granularity_ns = us * 1000; },
         "tick of the rt thread's deadline wheel, us (enters the safety condition; default 1000)")
      ->check(CLI::Range(std::uint64_t{100}, std::uint64_t{100'000}));
  app.add_option_function<std::uint64_t>(
         "--rt-command-poll-us",
         [&c](std::uint64_t us) { c.rt_command_poll_ns = us * 1000; },
         "longest sleep of the rt thread between wheel events, us: bounds how late a kill-now is "
         "applied; each period costs one wake-up (at most the wheel tick: wake every tick; "
         "default 5000)")
      ->check(CLI::Range(std::uint64_t{100}, std::uint64_t{100'000}));
  app.add_option("--rt-priority", c.rt_priority, "SCHED_FIFO priority of the rt thread, 1..99")
      ->capture_default_str();
  app.add_option("--rt-cpu", c.rt_cpu, "CPU to pin the rt thread to (-1: the last online CPU)")
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--mode",
         [&c](const std::string& m) {
           c.mode = m == "preemptible" ? SupervisorMode::preemptible : SupervisorMode::lease;
         },
         "lock mode, lease|preemptible; must match lockd's (default: lease)")
      ->check(CLI::IsMember({"lease", "preemptible"}));
  app.add_option_function<std::string>(
         "--on-shutdown",
         [&c](const std::string& p) {
           c.on_shutdown = p == "keep" ? ShutdownPolicy::keep : ShutdownPolicy::kill;
         },
         "on SIGTERM/SIGINT: kill|keep the unnamed sandboxes (default: kill). Named ones are always killed "
         "before their names are released. Kept sandboxes run until this worker's supervisor starts again, "
         "which stops them; under keep a sandbox started unnamed cannot be named later")
      ->check(CLI::IsMember({"kill", "keep"}));
  app.add_option("--stop-grace-ms", c.stop_grace_ms,
                 "on release, kill and shutdown: SIGTERM to every process of the sandbox first, and cgroup.kill "
                 "only if it is still running this many milliseconds later (0: cgroup.kill at once; at most " +
                     std::to_string(kStopGraceMsMax) +
                     "). Meanwhile it keeps its name and its lease is refreshed; the kill-switch never waits. A "
                     "request's grace_ms may shorten it")
      ->check(CLI::Range(std::uint64_t{0}, kStopGraceMsMax))
      ->capture_default_str();
  app.add_flag("--bwrap", c.bwrap, "run every sandbox inside bubblewrap (bwrap); needs --isolation off");
  app.add_option_function<std::string>(
         "--isolation",
         [&c](const std::string& v) { c.isolation = v == "on"; },
         "on|off (default: on): each sandbox runs as an unprivileged uid in its own user, pid, mount, ipc, "
         "uts and cgroup namespaces, without capabilities, with no_new_privs and a seccomp filter; off is the "
         "legacy spawn (the supervisor's uid and namespaces: a sandbox can then escape the kill-switch)")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option_function<std::string>(
         "--uid-range,--sandbox-uids",
         [&c](const std::string& v) {
           const auto colon = v.find(':');
           char* end = nullptr;
           const unsigned long first = std::strtoul(v.c_str(), &end, 10);
           const unsigned long count =
               colon == std::string::npos ? 0 : std::strtoul(v.c_str() + colon + 1, nullptr, 10);
           if (colon == std::string::npos || end != v.c_str() + colon || first == 0 || count == 0 ||
               first > 0xFFFFFFFEul || count > 0xFFFFFFFFul - first)
             throw CLI::ValidationError("--uid-range", "want START:COUNT with START >= 1, got \"" + v + "\"");
           c.sandbox_uid_first = static_cast<std::uint32_t>(first);
           c.sandbox_uid_count = static_cast<std::uint32_t>(count);
         },
         "root supervisor: host uid range START:COUNT for sandboxes root starts (uid = START + slot; at least "
         "--slots ids; default: root's range in /etc/subuid, else 100000:65536). Each supervisor on a host needs its "
         "own: one whose range overlaps a live supervisor's is refused (locks in /run/leasehold/uid-ranges), and so "
         "is one (the default too) that holds uid 0 or an account's uid or a group's gid. A "
         "non-root caller's sandbox runs as the caller's uid; a non-root supervisor's as its own");
  app.add_option("--sandbox-nproc-max", c.sandbox_nproc_max,
                 "most processes one isolated sandbox may have (RLIMIT_NPROC of its user namespace), count")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 22));
  app.add_option("--pids-max", c.sandbox_pids_max,
                 "most processes and threads one sandbox may have, count: pids.max of its cgroup leaf where the pids "
                 "controller is delegated (the start-up summary says whether it is); elsewhere --sandbox-nproc-max "
                 "bounds an isolated sandbox")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 22));
  app.add_flag("--no-cgroup", c.no_cgroup,
               "do not use cgroup v2 leaves even where one is delegated: the kill-switch then signals the "
               "sandbox's pidfd and process group (with isolation, its pid namespace still ends every descendant)");
  app.add_flag("--allow-unsafe-kill", c.allow_unsafe_kill,
               "start named sandboxes even where no kill is unescapable (no delegated cgroup v2 and isolation "
               "off): a sandbox's descendants may then outlive its kill-switch; every status line says so");
  app.add_option("--slots", c.slots, "shm table slots (sandboxes at once), count")
      ->capture_default_str();
  app.add_flag("--synthetic", c.synthetic,
               "performance measurement only: `run` registers a lease without starting a process");
  app.get_option("--synthetic")->configurable(false);  // a measurement, never a service's setting
}

UidRangeLock::UidRangeLock(UidRangeLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
UidRangeLock& UidRangeLock::operator=(UidRangeLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}
UidRangeLock::~UidRangeLock() { release(); }

void UidRangeLock::release() noexcept {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding the lock: nobody takes a departing holder's file
  ::close(fd_);
  fd_ = -1;
}

Status UidRangeLock::claim(const std::string& dir, std::uint32_t first, std::uint32_t count,
                           const std::string& holder) {
  release();
  const std::string mine = std::to_string(first) + ":" + std::to_string(count);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::from_errno(errno, "cannot create " + dir + " for the uid range lock");
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0)
    return Status{Errc::permission_denied, dir + " (the uid range locks) must be a directory of uid " +
                                               std::to_string(::geteuid()) + " that neither group nor others may write"};
  const std::string guard_path = dir + "/.lock";
  const int guard = ::open(guard_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (guard < 0) return Status::from_errno(errno, "cannot open " + guard_path);
  if (::flock(guard, LOCK_EX) != 0) {
    const int e = errno;
    ::close(guard);
    return Status::from_errno(e, "cannot lock " + guard_path);
  }
  Status refusal;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      unsigned long f = 0, c = 0;
      char tail = 0;
      if (std::sscanf(e->d_name, "range-%lu-%lu%c", &f, &c, &tail) != 2) continue;
      const std::string other = dir + "/" + e->d_name;
      const int fd = ::open(other.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        ::unlink(other.c_str());  // its holder died without removing it
        ::close(fd);
        continue;
      }
      char who[256] = {};
      const ssize_t n = ::pread(fd, who, sizeof who - 1, 0);
      ::close(fd);
      const bool overlaps = f < std::uint64_t{first} + count && std::uint64_t{first} < f + c;
      if (overlaps && refusal.ok())
        refusal = Status{Errc::refused, "uid range " + mine + " overlaps " + std::to_string(f) + ":" + std::to_string(c) +
                  " of a live supervisor on this host (" + std::string(who, n > 0 ? std::strcspn(who, "\n") : 0) +
                  ", lock " + other + "): their sandboxes would share uids; give each supervisor its own --uid-range"};
    }
    ::closedir(d);
  } else {
    refusal = Status::from_errno(errno, "cannot list " + dir);
  }
  if (refusal.ok()) {
    path_ = dir + "/range-" + std::to_string(first) + "-" + std::to_string(count);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0 || ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      refusal = Status::from_errno(errno, "cannot claim " + path_);
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
    } else {
      const std::string text = holder + "\n";
      [[maybe_unused]] const ssize_t w = ::pwrite(fd_, text.data(), text.size(), 0);  // for the message only
    }
  }
  ::close(guard);
  return refusal;
}

std::optional<std::pair<std::uint32_t, std::uint32_t>> root_subuid_range(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string line(text.substr(pos, end - pos));
    pos = end + 1;
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? std::string::npos : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string who = line.substr(0, a);
    if (who != "root" && who != "0") continue;
    char* e1 = nullptr;
    char* e2 = nullptr;
    const unsigned long first = std::strtoul(line.c_str() + a + 1, &e1, 10);
    const unsigned long count = std::strtoul(line.c_str() + b + 1, &e2, 10);
    if (e1 != line.c_str() + b || *e2 != '\0' || first == 0 || count == 0 || first > 0xFFFFFFFEul ||
        count > 0xFFFFFFFFul - first)
      continue;
    return std::make_pair(static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(count));
  }
  return std::nullopt;
}

bool ablated(std::string_view ablation) {
  const char* env = std::getenv("LEASEHOLD_ABLATE");
  std::string_view rest = env != nullptr ? env : "";
  while (!rest.empty()) {
    const std::size_t comma = std::min(rest.find(','), rest.size());
    if (rest.substr(0, comma) == ablation) return true;
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
  return false;
}

Status check_uid_range_accounts(std::uint32_t first, std::uint32_t count) {
  const std::uint64_t end = std::uint64_t{first} + count;  // exclusive
  const auto inside = [&](std::uint64_t id) { return id >= first && id < end; };
  std::string found;
  if (inside(0)) found = "uid 0 (root)";
  if (found.empty()) {
    ::setpwent();
    while (const passwd* pw = ::getpwent()) {
      if (!inside(pw->pw_uid)) continue;
      found = "uid " + std::to_string(pw->pw_uid) + " (account " + pw->pw_name + ")";
      break;
    }
    ::endpwent();
  }
  if (found.empty()) {
    ::setgrent();
    while (const group* gr = ::getgrent()) {
      if (!inside(gr->gr_gid)) continue;
      found = "gid " + std::to_string(gr->gr_gid) + " (group " + gr->gr_name + ")";
      break;
    }
    ::endgrent();
  }
  if (found.empty()) return {};
  return Status{Errc::exists,
                "uid range " + std::to_string(first) + ":" + std::to_string(count) + " contains " + found +
                    ", which this host already uses: a sandbox that root starts runs as uid and gid START + slot, so "
                    "it would own that account's files and could signal its processes; give --uid-range a range that "
                    "no account or group uses, such as root's subordinate range in /etc/subuid and /etc/subgid (e.g. "
                    "root:100000:65536, added with `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 "
                    "root`)"};
}

}  // namespace leasehold
