// `leasehold pause-probe`: how long a supervisor pause a deployment survives, and what happens
// past it (DESIGN.md "Time": the safety condition and the pause budget).
//
//   leasehold pause-probe --standalone                       lockd + supervisor of its own
//   leasehold pause-probe --supervisor SOCK --lockd ADDR --key-file KEY   a running deployment
//
// For each pause length of a sweep (default: 0 to 2·ttl in --steps steps; --pauses overrides) one
// trial: run a named sandbox (`leasehold pause-probe-sandbox`, which polls check_deadline on its
// slot every ~1 ms and logs every change of the answer with CLOCK_BOOTTIME times), freeze the
// supervisor for the pause (cgroup v2 `cgroup.freeze` of a leaf the supervisor is moved into —
// its sandboxes' leaves are not below it, so they keep running — or SIGSTOP), resume, and watch:
// the sandbox's death (its pidfd), lockd's expiry of the lease (Show: ttl_left), a contender that
// tries to acquire the name every --contend-interval-ms from another worker, the slot in shm, and
// the supervisor's shm stats. include/leasehold/pause/model.hpp turns that into the trial's outcome;
// pause/README.md defines every column and the two budgets.
//
// Phases: `worst` (standalone only) drops the supervisor's refreshes at a UDP relay the probe puts
// between the supervisor and lockd, then starts the freeze --guard-ms before the sandbox's
// valid_until — the case the pause budget is defined for; `random` freezes at a random moment of
// a healthy heartbeat cycle.
//
// Exit codes: 0 when the verdicts agree with DESIGN.md "Time"; 1 (kFailure) when a pause under the
// budget produced a violation, a sandbox accepted a check it should have refused, a violation was
// not ended by recovery, no trial could be run, or the sweep was interrupted; 2 usage (checked
// before anything starts); 3 another probe is probing the same supervisor; 5 lockd unreachable
// or not answering with the key (checked at start-up); 7 no supervisor.
#include "tools/cmd_common.hpp"

#include "leasehold/harness/deployment.hpp"
#include "leasehold/harness/freeze.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/relay.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/io/udp.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/pause/model.hpp"
#include "leasehold/pause/report.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <climits>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

namespace leasehold::cli {
namespace {

namespace pp = leasehold::pause;

// ---- bounds ------------------------------------------------------------------------------------
constexpr std::uint64_t kStartTimeoutMs = 20'000;       ///< lockd / supervisor start-up
constexpr std::uint64_t kDeathWaitMs = 5'000;           ///< a kill at the end of a trial
constexpr std::uint64_t kGrantWaitAfterDeathMs = 500;   ///< how long to look for the next grant
constexpr std::size_t kValidUntilChangesMax = 100'000;  ///< per trial (one per heartbeat)
constexpr std::uint64_t kGnuplotTimeoutMs = 30'000;
constexpr std::uint32_t kRepeatMax = 100;
constexpr std::uint32_t kPauseMissedRetriesMax = 2;   ///< worst phase: a kill before the freeze
constexpr std::uint64_t kLockdCheckTimeoutMs = 1'000;  ///< external mode: lockd's start-up stats answer
constexpr std::size_t kLogDirEntriesMax = 100'000;   ///< entries looked at when clearing old logs

// ---- clocks, signals ---------------------------------------------------------------------------

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted.store(true, std::memory_order_relaxed); }
struct Interrupted {};
void check_interrupted() {
  if (g_interrupted.load(std::memory_order_relaxed)) throw Interrupted{};
}

using harness::now_ns;

/// Sleeps until `t_ns` (CLOCK_BOOTTIME), waking every ≤10 ms to honour Ctrl-C.
void sleep_until_ns(std::int64_t t_ns) { harness::sleep_until_ns(t_ns, check_interrupted); }
void sleep_ms(std::int64_t ms) { sleep_until_ns(now_ns() + ms * 1'000'000); }

struct SignalScope {
  struct sigaction old_int {}, old_term {};
  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int);
    ::sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalScope() {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
};

using harness::slurp;

using harness::dir_of;

// ---- child processes ---------------------------------------------------------------------------

/// Starts a long-running child (stress-ng, gnuplot) in its own process
/// group with stdout and stderr into one log file, SIGKILLed if the probe dies.
Status spawn_proc(harness::Process& p, const std::string& label, const std::vector<std::string>& argv,
                  const std::string& log_path) {
  harness::Spawn spec;
  spec.argv = argv;
  spec.stdout_path = log_path;
  spec.stderr_path = log_path;
  spec.label = label;
  return p.start(spec);
}

// ---- the UDP relay between the supervisor and lockd (worst phase) ----------------------------

// harness::UdpRelay: drops the supervisor's refreshes while cut, which is how the worst phase
// makes its lease run down to valid_until.
using harness::UdpRelay;

// ---- freezing the supervisor -------------------------------------------------------------------

// harness::Freezer: the supervisor is moved into a cgroup v2 leaf of its own next to its
// sandboxes' leaves (so they keep running) and that leaf is frozen, or it is SIGSTOPped.
using harness::Freezer;

// ---- one probe per supervisor -------------------------------------------------------------------

/// Two probes freezing one supervisor would nest their cgroup leaves, time each other's pauses,
/// and leave the supervisor in the wrong cgroup. Each probe therefore holds an exclusive flock
/// on `pause-probe-<supervisor pid>.lock` in the control socket's directory (resolved; where
/// that is not writable, in /run/leasehold) for its whole run; the file holds the owner's pid.
/// It is left in place: unlinking a lock file races with the next probe opening it.
class ProbeLock {
 public:
  static std::unique_ptr<ProbeLock> take(pid_t supervisor_pid, const std::string& socket, Failure& f) {
    const std::string file = "pause-probe-" + std::to_string(supervisor_pid) + ".lock";
    std::string dir = dir_of(socket);
    char real[PATH_MAX];
    if (::realpath(dir.c_str(), real) != nullptr) dir = real;
    std::string path = dir + "/" + file;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      ::mkdir("/run/leasehold", 0755);
      path = "/run/leasehold/" + file;
      fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
      f = {kInternal, "cannot create the probe's lock file " + path + ": " + std::strerror(errno)};
      return nullptr;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int e = errno;
      char buf[32] = {};
      const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
      ::close(fd);
      const std::string owner = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?");
      if (e == EWOULDBLOCK) {
        f = {kRefused, "another pause-probe (pid " + owner.substr(0, owner.find('\n')) +
                           ") is already probing the supervisor (pid " + std::to_string(supervisor_pid) +
                           ", " + socket + "); two probes would freeze it in each other's pauses. Wait for it "
                           "to finish (lock: " + path + ")"};
      } else {
        f = {kInternal, "flock " + path + ": " + std::strerror(e)};
      }
      return nullptr;
    }
    const std::string me = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      // The lock holds without the pid in it; only the other probe's message is poorer.
    }
    std::unique_ptr<ProbeLock> l(new ProbeLock());
    l->fd_ = fd;
    return l;
  }
  ~ProbeLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  ProbeLock(const ProbeLock&) = delete;
  ProbeLock& operator=(const ProbeLock&) = delete;

 private:
  ProbeLock() = default;
  int fd_ = -1;
};

// ---- per-trial observers -----------------------------------------------------------------------

/// Observer threads (pidfd watch, contender, and the thread that times the freeze) timestamp events; under load a normal-priority
/// thread wakes late and would report a death or a grant late. They run SCHED_FIFO at this
/// priority when permitted (below the supervisor's rt thread; 0 = normal priority).
std::atomic<int> g_observer_priority{10};
std::atomic<bool> g_observer_fifo_refused{false};
void raise_observer_priority() {
  const int prio = g_observer_priority.load();
  if (prio <= 0) return;
  sched_param sp{};
  sp.sched_priority = prio;
  // The calling thread only; children forked later (stress-ng, gnuplot) start at normal priority.
  if (::sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) != 0) g_observer_fifo_refused.store(true);
}

/// Watches the sandbox (pidfd) and its slot (revoked bit, valid_until changes) from a thread.
class Monitor {
 public:
  Monitor(int pidfd, const shm::Slot* slot) : pidfd_(pidfd), slot_(slot) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Monitor() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::int64_t death_ns() const { return death_ns_.load(std::memory_order_acquire); }
  std::int64_t revoked_ns() const { return revoked_ns_.load(std::memory_order_acquire); }
  std::uint64_t valid_until_ns() const { return slot_->valid_until_ns.load(std::memory_order_acquire); }
  /// First time after `after_ns` at which valid_until moved above `above_ns` (0 if never).
  std::int64_t refreshed_after(std::int64_t after_ns, std::uint64_t above_ns) {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [t, vu] : changes_)
      if (t >= after_ns && vu > above_ns) return t;
    return 0;
  }

 private:
  void loop() {
    raise_observer_priority();
    std::uint64_t last_vu = slot_->valid_until_ns.load(std::memory_order_acquire);
    while (!stop_.load(std::memory_order_relaxed)) {
      pollfd p{pidfd_, POLLIN, 0};
      const int rc = pidfd_ >= 0 && death_ns_.load() == 0 ? ::poll(&p, 1, 1) : (::usleep(1000), 0);
      const std::int64_t t = now_ns();
      if (rc > 0 && (p.revents & (POLLIN | POLLHUP)) && death_ns_.load() == 0) death_ns_.store(t, std::memory_order_release);
      if (death_ns_.load() != 0) continue;  // the slot is freed after death: stop reading it
      const std::uint64_t word = slot_->check_word.load(std::memory_order_acquire);
      if ((word & shm::kRevokedBit) != 0 && revoked_ns_.load() == 0) revoked_ns_.store(t, std::memory_order_release);
      const std::uint64_t vu = slot_->valid_until_ns.load(std::memory_order_acquire);
      if (vu != last_vu) {
        last_vu = vu;
        std::lock_guard<std::mutex> g(mu_);
        if (changes_.size() < kValidUntilChangesMax) changes_.emplace_back(t, vu);
      }
    }
  }
  int pidfd_;
  const shm::Slot* slot_;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> death_ns_{0}, revoked_ns_{0};
  std::mutex mu_;
  std::vector<std::pair<std::int64_t, std::uint64_t>> changes_;
  std::thread thread_;
};

/// Another holder: tries to acquire the name every `interval` from its own worker id, until it
/// succeeds or is stopped; then holds it until release().
class Contender {
 public:
  Contender(const SocketAddress& lockd, const wire::WireKey& key, std::string name, std::int64_t interval_ns)
      : client_(lockd, key, WorkerId{}, 250'000'000), name_(std::move(name)), interval_ns_(interval_ns),
        sandbox_(random_sandbox_id()) {}
  ~Contender() { stop(); }
  void start() {
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  bool granted() const { return grant_recv_ns_.load(std::memory_order_acquire) != 0; }
  std::int64_t grant_send_ns() const { return grant_send_ns_.load(); }
  std::int64_t grant_recv_ns() const { return grant_recv_ns_.load(); }
  std::int64_t last_deny_send_ns() const { return last_deny_send_ns_.load(); }
  std::uint64_t attempts() const { return attempts_.load(); }
  /// Releases a grant (after stop()).
  void release() {
    if (!granted()) return;
    client_.release(name_id_, sandbox_, epoch_);
  }

 private:
  void loop() {
    raise_observer_priority();
    while (!stop_.load(std::memory_order_relaxed)) {
      const std::int64_t sent = now_ns();
      attempts_.fetch_add(1);
      const lockd::Answer a = client_.acquire(name_, sandbox_, client_.self(), 0, false);
      const std::int64_t recv = now_ns();
      if (const auto* g = a.as<wire::Grant>(); g != nullptr && g->holder == sandbox_) {
        name_id_ = g->name_id;
        epoch_ = g->epoch;
        grant_send_ns_.store(sent);
        grant_recv_ns_.store(recv, std::memory_order_release);
        return;
      }
      if (a.as<wire::Deny>() != nullptr) last_deny_send_ns_.store(sent);
      const std::int64_t next = sent + interval_ns_;
      while (!stop_.load(std::memory_order_relaxed) && now_ns() < next) {
        const std::int64_t left = next - now_ns();
        if (left > 0) ::usleep(static_cast<useconds_t>(std::min<std::int64_t>(left / 1000 + 1, 1000)));
      }
    }
  }
  lockd::AdminClient client_;
  std::string name_;
  std::int64_t interval_ns_;
  SandboxId sandbox_;
  NameId name_id_;
  Epoch epoch_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> grant_send_ns_{0}, grant_recv_ns_{0}, last_deny_send_ns_{0};
  std::atomic<std::uint64_t> attempts_{0};
  std::thread thread_;
};

pp::HistogramSnapshot snap(const shm::Histogram& h) {
  pp::HistogramSnapshot s;
  s.count = h.count.load(std::memory_order_relaxed);
  s.sum = h.sum.load(std::memory_order_relaxed);
  s.max = h.max.load(std::memory_order_relaxed);
  for (std::size_t b = 0; b < pp::kHistogramBuckets; ++b) s.buckets[b] = h.buckets[b].load(std::memory_order_relaxed);
  return s;
}

struct StatsSnapshot {
  pp::HistogramSnapshot lateness, rtt, kill;
  std::uint64_t kills = 0;
};
StatsSnapshot snap_stats(const shm::TableReader& t) {
  const shm::Stats& s = t.stats();
  return {snap(s.rt_lateness_ns), snap(s.heartbeat_rtt_ns), snap(s.kill_latency_ns),
          s.counters.kills.load(std::memory_order_relaxed)};
}

// ---- the probe ---------------------------------------------------------------------------------

struct ProbeArgs {
  bool standalone = false;
  std::string supervisor_socket, lockd, key_file;
  std::string lockd_bin, supervisor_bin;
  std::uint64_t ttl_ms = 2000;
  std::uint64_t kill_after_ms = 0;        // 0: 70 % of ttl
  std::uint64_t heartbeat_interval_ms = 0;  // 0: kill_after / 7
  std::uint64_t kill_latency_budget_ms = 50;
  double clock_rate_bound = 1e-3;
  bool kill_latency_budget_set = false;
  bool clock_rate_bound_set = false;
  bool pauses_set = false;
  std::vector<std::string> standalone_only_given;  ///< such flags given on the command line
  std::uint32_t steps = 16;
  std::string pauses;
  std::uint32_t repeat = 1;
  std::string phase = "auto";
  std::string freeze = "auto";
  std::uint64_t guard_ms = 10;
  std::uint64_t baseline_ms = 2000;
  int observer_priority = 10;
  std::uint64_t contend_interval_ms = 2;
  bool stress = false;
  std::string stress_args = "--cpu 0 --io 1 --vm 1 --vm-bytes 64M";
  std::uint64_t stress_timeout_s = 0;  // 0: estimate from the sweep
  std::string out_dir;
  std::string csv_path;
  std::string plot = "auto";
  bool json = false;
  bool quiet = false;
  std::uint64_t seed = 0;
};

/// The deployment under test, either started here (standalone) or found through its socket.
struct Deployment {
  // Stopped in this order by the destructor: the supervisor (SIGTERM: it releases its names
  // through the relay) before the relay and lockd go, and the temp dir last.
  std::optional<harness::TempDir> tmp;       ///< standalone only
  std::unique_ptr<harness::Deployment> run;  ///< standalone: lockd and the supervisor
  std::unique_ptr<UdpRelay> relay;
  std::string socket;
  SocketAddress lockd_addr;
  std::optional<wire::WireKey> key;
  pid_t supervisor_pid = -1;
  std::string shm_path;
  pp::Timing timing;
  std::string lockd_text;
  std::string status_lockd;  ///< the lockd address the supervisor itself uses (its status)

  Deployment() = default;
  Deployment(const Deployment&) = delete;
  Deployment& operator=(const Deployment&) = delete;
  ~Deployment() {
    if (run) run->stop_supervisors();
    relay.reset();
    run.reset();
  }
  /// The standalone temp dir ("" in external mode or before it was made).
  std::string dir() const { return tmp ? tmp->path().string() : std::string(); }
};

std::string stderr_progress(bool quiet, const std::string& s) {
  if (!quiet) {
    std::fputs(s.c_str(), stderr);
    std::fflush(stderr);
  }
  return s;
}

std::optional<nlohmann::json> control(const std::string& socket, const nlohmann::json& req, Failure& f,
                                      std::uint64_t timeout_ms = 10'000) {
  SupervisorFlags flags;
  flags.socket = socket;
  flags.timeout_ms = timeout_ms;
  nlohmann::json r = req;
  r["v"] = 1;
  return supervisor_call(flags, r, f);
}

/// ρ as text that reads back to the same double, shortest form (std::to_string would print
/// 1e-7 as 0.000000): for the supervisor's command line and for messages.
std::string rho_text(double rho) {
  char b[64];
  const auto res = std::to_chars(b, b + sizeof b, rho);
  return std::string(b, res.ec == std::errc() ? res.ptr : b);
}

/// Starts lockd, the relay and a supervisor in a temp dir. Failure on error; then the temp dir
/// is kept, so the logs the message points at still exist.
Failure start_standalone_once(const ProbeArgs& a, Deployment& d);
Failure start_standalone(const ProbeArgs& a, Deployment& d) {
  Failure f = start_standalone_once(a, d);
  if (f.failed() && d.tmp) {
    d.tmp->keep();
    f.message += "\n(" + d.dir() + " is kept for inspection)";
  }
  return f;
}
Failure start_standalone_once(const ProbeArgs& a, Deployment& d) {
  try {
    d.tmp.emplace("leasehold-pause");
  } catch (const std::exception& e) {
    return {kInternal, e.what()};
  }
  const std::string dir = d.dir();
  const std::string lockd_bin = locate_service(a.lockd_bin, "leasehold-lockd", "lockd");
  const std::string sup_bin = locate_service(a.supervisor_bin, "leasehold-supervisor", "supervisor");
  if (lockd_bin.empty() || sup_bin.empty())
    return {kUsage, std::string("cannot find ") + (lockd_bin.empty() ? "leasehold-lockd" : "leasehold-supervisor") +
                        " next to " + self_exe() + " nor in $PATH; pass --lockd-bin / --supervisor-bin"};
  d.run = std::make_unique<harness::Deployment>(dir);
  harness::Deployment& run = *d.run;
  if (const Status e = run.make_cluster_key(); !e.ok()) return {kInternal, e.message()};
  d.key = run.key();
  // The supervisor holds only its own worker key, derived from the cluster key.
  if (const Status e = run.make_worker_key("worker.key", random_worker_id()); !e.ok()) return {kInternal, e.message()};
  harness::LockdSpec ls;
  ls.bin = lockd_bin;
  ls.ttl_ms = d.timing.ttl_ms;
  ls.ready_timeout = std::chrono::milliseconds(kStartTimeoutMs);
  const harness::Started lockd = run.start_lockd(ls, check_interrupted);
  if (!lockd.ok()) return {lockd.kind == harness::Started::Kind::not_ready ? kUnreachable : kInternal, lockd.error};
  d.lockd_text = run.lockd_text();
  d.lockd_addr = run.lockd_address();
  auto relay = UdpRelay::start(d.lockd_addr);
  if (!relay) return {kInternal, relay.message()};
  d.relay = std::move(relay).value();
  d.socket = dir + "/supervisor.sock";
  d.shm_path = dir + "/table";
  harness::SupervisorSpec ss;
  ss.bin = sup_bin;
  ss.lockd = d.relay->address();
  ss.key_file = dir + "/worker.key";
  ss.control_socket = d.socket;
  ss.shm = d.shm_path;
  ss.log = dir + "/supervisor.log";
  ss.ttl_ms = d.timing.ttl_ms;
  ss.kill_after_ms = d.timing.kill_after_ms;
  ss.heartbeat_interval_ms = d.timing.heartbeat_interval_ms;
  ss.extra_args = {"--kill-latency-budget-ms", std::to_string(d.timing.kill_latency_budget_ms), "--clock-rate-bound",
                   rho_text(d.timing.clock_rate_bound), "--slots", "16", "--on-shutdown", "kill", "--sandbox-log-dir",
                   dir + "/sandbox-logs",
                   // The probe's sandbox is its own trusted program writing logs below the output
                   // directory, which another uid may not reach; the kill path is the same.
                   "--isolation", "off"};
  ss.ready_timeout = std::chrono::milliseconds(kStartTimeoutMs);
  if (const harness::Started sup = run.start_supervisor(ss, nullptr, check_interrupted); !sup.ok())
    return {kInternal, sup.error};
  return {};
}

/// A probe killed mid-freeze (SIGKILL: no destructor ran) leaves the supervisor frozen in its
/// `leasehold-pause-<pid>` leaf, where it cannot answer status. Before asking it anything, find
/// the process behind the control socket (SO_PEERCRED) and thaw such a leaf; the Freezer later
/// recognises the leaf, reuses it and moves the process home. A SIGSTOPped supervisor is only
/// reported: its stop may not be ours.
Failure recover_left_frozen(const std::string& socket) {
  ucred cred{};
  {
    ControlCallFailure why;
    const ControlConnection conn = control_connect(socket, why);  // only a server of root or ours
    if (!conn || conn.server().pid <= 0) return {};                 // read_status says why
    cred = conn.server();
  }
  if (harness::process_state(cred.pid) == 'T')
    return {kNoSupervisor, "the supervisor (pid " + std::to_string(cred.pid) + ") is stopped (SIGSTOP); resume it with "
                           "`kill -CONT " + std::to_string(cred.pid) + "` and run the probe again"};
  const auto left = harness::thaw_left_frozen(cred.pid);
  if (!left) return {};
  const std::string& leaf = left->leaf;
  if (!left->thawed)
    return {kInternal, "the supervisor (pid " + std::to_string(cred.pid) + ") was left frozen in " + leaf +
                           " by a probe that died, and thawing it failed: " + std::strerror(left->error) +
                           "; write 0 to " + leaf + "/cgroup.freeze"};
  std::fprintf(stderr, "pause-probe: warning: thawed supervisor pid %d, left frozen in %s by a probe that died\n",
               static_cast<int>(cred.pid), leaf.c_str());
  return {};
}

/// Reads the supervisor's status into the deployment (pid, shm, timing).
Failure read_status(const ProbeArgs& a, Deployment& d) {
  Failure f;
  auto st = control(d.socket, {{"op", "status"}}, f);
  if (!st) return f;
  if (!st->value("ok", false)) return supervisor_failure(*st, "status");
  try {
    d.supervisor_pid = st->at("pid").get<pid_t>();
    d.shm_path = st->at("shm").get<std::string>();
    d.status_lockd = st->value("lockd", std::string());
    d.timing.ttl_ms = st->at("ttl_ms").get<std::uint64_t>();
    d.timing.kill_after_ms = st->at("kill_after_ms").get<std::uint64_t>();
    d.timing.heartbeat_interval_ms = st->at("heartbeat_interval_ms").get<std::uint64_t>();
    d.timing.wheel_granularity_ns = st->at("rt").at("granularity_ns").get<std::uint64_t>();
    // The supervisor reports every input of its pause budget; a flag given on the command line
    // still wins (to ask "what if the budget were ...").
    d.timing.clock_rate_bound =
        a.standalone || a.clock_rate_bound_set ? a.clock_rate_bound : st->at("clock_rate_bound").get<double>();
    d.timing.kill_latency_budget_ms = a.standalone || a.kill_latency_budget_set
                                          ? a.kill_latency_budget_ms
                                          : st->at("kill_latency_budget_ms").get<std::uint64_t>();
  } catch (const std::exception& e) {
    return {kInternal, std::string("the supervisor's status answer lacks a field: ") + e.what()};
  }
  return {};
}

/// Environment for the probe sandbox: PATH and the sanitizer options, if set.
std::map<std::string, std::string> sandbox_env() {
  std::map<std::string, std::string> env;
  for (const char* k : {"PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"})
    if (const char* v = std::getenv(k); v != nullptr) env[k] = v;
  if (env.find("PATH") == env.end()) env["PATH"] = "/usr/bin:/bin";
  return env;
}

struct TrialContext {
  const ProbeArgs& args;
  Deployment& dep;
  Freezer& freezer;
  const shm::TableReader& table;
  pp::Phase phase;
  std::string tag;
  std::string log_dir;
  std::mt19937_64 rng;
  pp::HistogramSnapshot clean_lateness, clean_rtt;
  // Clean windows (no freeze inside): the rt lateness window closes at the freeze, the heartbeat
  // RTT window already at the cut/freeze decision (dropped refreshes would count their retries).
  std::optional<StatsSnapshot> lateness_from, rtt_from;
  std::uint64_t guard_ms = 10;  // worst phase: freeze this long before valid_until
};

/// The supervisor status counters a trial compares before/after.
struct StatusCounters {
  std::uint64_t kills_deadline = 0, lost = 0, unknown = 0;
};
std::optional<StatusCounters> status_counters(const std::string& socket) {
  Failure f;
  auto st = control(socket, {{"op", "status"}}, f, 5'000);
  if (!st || !st->value("ok", false)) return std::nullopt;
  const auto& c = (*st)["counters"];
  return StatusCounters{c.value("kills_deadline", 0ull), c.value("lost", 0ull), c.value("unknown", 0ull)};
}

void close_lateness_window(TrialContext& cx, const StatsSnapshot& now) {
  if (cx.lateness_from) pp::histogram_add(cx.clean_lateness, pp::histogram_delta(cx.lateness_from->lateness, now.lateness));
  cx.lateness_from.reset();
}
void close_rtt_window(TrialContext& cx, const StatsSnapshot& now) {
  if (cx.rtt_from) pp::histogram_add(cx.clean_rtt, pp::histogram_delta(cx.rtt_from->rtt, now.rtt));
  cx.rtt_from.reset();
}

/// One trial. Never throws except Interrupted; failures land in `obs.error`.
pp::TrialObservation run_trial(TrialContext& cx, std::size_t index, std::uint64_t pause_ms, pp::SandboxLog& log_out,
                               bool& have_log) {
  const pp::Timing& t = cx.dep.timing;
  pp::TrialObservation o;
  o.pause_ms = pause_ms;
  o.phase = cx.phase;
  const std::string name = "pause-probe." + cx.tag + "." + std::to_string(index);
  const std::string log_path = cx.log_dir + "/sandbox-" + std::to_string(index) + "-" + std::to_string(pause_ms) + "ms.log";
  const std::uint64_t lifetime_ms = t.kill_after_ms + pause_ms + 2 * t.ttl_ms + 30'000;
  // A fresh log: the sandbox appends, and a log of an earlier run would read as two lives.
  ::unlink(log_path.c_str());
  ::unlink((log_path + ".last").c_str());

  const auto before = status_counters(cx.dep.socket);
  Failure f;
  nlohmann::json env = sandbox_env();
  auto ans = control(cx.dep.socket,
                     {{"op", "run"}, {"name", name},
                      {"argv", {self_exe(), "pause-probe-sandbox", "--log", log_path, "--lifetime-ms", std::to_string(lifetime_ms)}},
                      {"env", env}},
                     f, 15'000);
  if (!ans) {
    o.error = "run: " + f.message;
    return o;
  }
  if (!ans->value("ok", false)) {
    o.error = "run: " + ans->value("error", std::string("?")) + ": " + ans->value("message", std::string());
    return o;
  }
  const pid_t pid = ans->value("pid", -1);
  const std::uint32_t slot = ans->value("slot", 0u);
  const std::string sandbox = ans->value("sandbox", std::string());
  const shm::Slot* s = cx.table.slot(slot);
  if (s == nullptr || pid <= 0) {
    o.error = "run answered without a usable slot/pid: " + ans->dump();
    return o;
  }
  const int pidfd = harness::pidfd_open(pid);
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) ::close(fd);
    }
  } pidfd_closer{pidfd};
  auto monitor = std::make_unique<Monitor>(pidfd, s);
  if (pidfd < 0) {
    o.error = "pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno);
  }
  // Ends the trial's sandbox whatever happens below (kill request, then wait for its death).
  auto finish_sandbox = [&] {
    if (monitor->death_ns() == 0) {
      Failure kf;
      control(cx.dep.socket, {{"op", "kill"}, {"sandbox", sandbox}}, kf, 5'000);
      const std::int64_t until = now_ns() + static_cast<std::int64_t>(kDeathWaitMs) * 1'000'000;
      while (monitor->death_ns() == 0 && now_ns() < until) ::usleep(2000);
    }
  };
  std::unique_ptr<Contender> contender;
  auto end_contender = [&] {
    if (contender) contender->stop();
  };
  // Outside the try: a Show still in flight on its thread when an exception leaves the try is
  // joined at the end of the trial, after the handler thawed the supervisor.
  std::optional<lockd::AdminClient> shower;
  struct Joiner {
    std::thread th;
    ~Joiner() {
      if (th.joinable()) th.join();
    }
  } expiry_reader;
  try {
    if (!o.error.empty()) throw std::runtime_error(o.error);
    contender = std::make_unique<Contender>(cx.dep.lockd_addr, *cx.dep.key, name,
                                            static_cast<std::int64_t>(cx.args.contend_interval_ms) * 1'000'000);
    // A healthy lease first: at least one refresh acknowledged since the start, and the sandbox
    // running its checks (its start line logged; a slow exec on a loaded host can take longer
    // than a heartbeat interval, and a trial judged without it would be an error).
    auto sandbox_started = [&log_path] {
      std::ifstream in(log_path);
      std::string line;
      while (std::getline(in, line))
        if (line.rfind("start ", 0) == 0) return true;
      return false;
    };
    const std::uint64_t vu0 = monitor->valid_until_ns();
    const std::int64_t settle_until = now_ns() + static_cast<std::int64_t>(3 * t.heartbeat_interval_ms + 2000) * 1'000'000;
    bool started = false;
    while ((monitor->valid_until_ns() == vu0 || !(started = started || sandbox_started())) && now_ns() < settle_until &&
           monitor->death_ns() == 0)
      sleep_ms(1);
    if (monitor->death_ns() != 0) throw std::runtime_error("the sandbox died before the pause (see " + log_path + ")");
    if (monitor->valid_until_ns() == vu0) throw std::runtime_error("the lease was never refreshed before the pause");
    if (!started) throw std::runtime_error("the sandbox did not start its checks before the pause (see " + log_path + ")");

    shower.emplace(cx.dep.lockd_addr, *cx.dep.key, WorkerId{}, 500'000'000);
    // lockd's expiry of the lease (Show: ttl_left). A blocking request: never on the thread
    // that times the freeze.
    auto read_expiry = [&o, &shower, &name, &sandbox] {
      const std::int64_t sent = now_ns();
      const lockd::Answer a = shower->show(name);
      const std::int64_t recv = now_ns();
      const auto* info = a.as<wire::NameInfo>();
      if (info == nullptr || info->record.state != LockPhase::held || info->record.holder.str() != sandbox) return;
      o.expiry_lo_ns = sent + static_cast<std::int64_t>(info->record.ttl_left_ms) * 1'000'000;
      o.expiry_hi_ns = recv + static_cast<std::int64_t>(info->record.ttl_left_ms + 1) * 1'000'000;
    };

    const StatsSnapshot s1 = snap_stats(cx.table);
    close_rtt_window(cx, s1);
    if (cx.phase == pp::Phase::worst) {
      cx.dep.relay->cut(true);
      o.cut_ns = now_ns();
      // The last refresh answers may still arrive: follow valid_until until it stops moving,
      // and start the freeze `guard` before it.
      const std::int64_t cut_limit = o.cut_ns + static_cast<std::int64_t>(t.kill_after_ms + 2000) * 1'000'000;
      for (;;) {
        if (now_ns() > cut_limit)
          throw std::runtime_error("valid_until kept moving although the relay dropped every refresh");
        const std::int64_t vu = static_cast<std::int64_t>(monitor->valid_until_ns());
        const std::int64_t at = vu - static_cast<std::int64_t>(cx.guard_ms) * 1'000'000;
        if (now_ns() >= at || monitor->death_ns() != 0) break;
        sleep_until_ns(std::min(at, now_ns() + 1'000'000));
      }
      read_expiry();  // nothing reaches lockd any more: this is the expiry
    } else {
      std::uniform_int_distribution<std::int64_t> phase(0, static_cast<std::int64_t>(t.heartbeat_interval_ms) * 1'000'000);
      sleep_until_ns(now_ns() + phase(cx.rng));
    }
    o.valid_until_ns = static_cast<std::int64_t>(monitor->valid_until_ns());
    contender->start();
    close_lateness_window(cx, snap_stats(cx.table));
    o.freeze_ns = now_ns();
    // The thaw is due at this CLOCK_BOOTTIME instant whatever else happens during the freeze;
    // thaw_ns records when it was really requested (leasehold/pause/model.hpp: measured_pause_ns).
    const std::int64_t thaw_due = o.freeze_ns + static_cast<std::int64_t>(pause_ms) * 1'000'000;
    if (const Status e = cx.freezer.freeze(o.frozen_ns); !e.ok()) throw std::runtime_error("freeze: " + e.message());
    if (cx.phase == pp::Phase::random && now_ns() + 3'000'000 < thaw_due) {
      expiry_reader.th = std::thread([read_expiry, at = o.freeze_ns + 2'000'000] {
        // 2 ms into the freeze: a refresh already in flight lands first.
        const timespec ts{static_cast<time_t>(at / 1'000'000'000), static_cast<long>(at % 1'000'000'000)};
        while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
        }
        read_expiry();
      });
    }
    sleep_until_ns(thaw_due);
    o.thaw_ns = now_ns();
    if (cx.dep.relay) cx.dep.relay->cut(false);
    if (const Status e = cx.freezer.thaw(o.thawed_ns); !e.ok()) throw std::runtime_error("thaw: " + e.message());
    if (expiry_reader.th.joinable()) expiry_reader.th.join();

    // Observe until the sandbox died (and the next grant was seen), or the lease was kept.
    const std::int64_t settle = o.thaw_ns + std::max<std::int64_t>(50, 2 * static_cast<std::int64_t>(t.heartbeat_interval_ms)) * 1'000'000;
    const std::int64_t limit = o.thaw_ns + static_cast<std::int64_t>(t.ttl_ms + 2000) * 1'000'000;
    for (;;) {
      const std::int64_t now = now_ns();
      const std::int64_t death = monitor->death_ns();
      if (now >= settle) {
        if (death != 0 && (contender->granted() || now > death + static_cast<std::int64_t>(kGrantWaitAfterDeathMs) * 1'000'000)) break;
        if (death == 0) {
          const std::int64_t refreshed = monitor->refreshed_after(o.thaw_ns, static_cast<std::uint64_t>(o.valid_until_ns));
          if (refreshed != 0 && now >= refreshed + 2 * static_cast<std::int64_t>(t.heartbeat_interval_ms) * 1'000'000) break;
        }
      }
      if (now > limit) break;
      sleep_ms(2);
    }
    o.end_ns = now_ns();
    o.death_ns = monitor->death_ns();
    o.revoked_ns = monitor->revoked_ns();
    o.refreshed_ns = monitor->refreshed_after(o.thaw_ns, static_cast<std::uint64_t>(o.valid_until_ns));
    if (o.death_ns != 0 && o.refreshed_ns > o.death_ns) o.refreshed_ns = 0;
    contender->stop();
    o.grant_send_ns = contender->grant_send_ns();
    o.grant_recv_ns = contender->grant_recv_ns();
    o.last_deny_send_ns = contender->last_deny_send_ns();
    const StatsSnapshot s2 = snap_stats(cx.table);
    cx.lateness_from = s2;  // the next clean windows start after this trial's recovery
    cx.rtt_from = s2;
    if (const auto after = status_counters(cx.dep.socket); after && before) {
      o.kills_deadline = after->kills_deadline - before->kills_deadline;
      o.recovery_answers = (after->lost - before->lost) + (after->unknown - before->unknown);
    }
    // The supervisor's own record of the kill: its rt thread adds (confirmed − deadline) to the
    // kill-latency histogram, and the deadline of a deadline kill is the slot's valid_until.
    const pp::HistogramSnapshot kd = pp::histogram_delta(s1.kill, s2.kill);
    if (kd.count == 1 && o.kills_deadline == 1 && o.valid_until_ns != 0)
      o.sup_confirmed_ns = o.valid_until_ns + static_cast<std::int64_t>(kd.sum);
  } catch (const Interrupted&) {
    // Thaw first: everything after this needs the supervisor (the kill request, the release).
    if (const Status thawed = cx.freezer.thaw_if_frozen(); !thawed.ok())
      std::fprintf(stderr, "leasehold pause-probe: warning: cannot thaw the supervisor: %s\n", thawed.message().c_str());
    if (cx.dep.relay) cx.dep.relay->cut(false);
    if (expiry_reader.th.joinable()) expiry_reader.th.join();
    end_contender();
    finish_sandbox();
    if (contender) contender->release();
    throw;
  } catch (const std::exception& e) {
    if (const Status thawed = cx.freezer.thaw_if_frozen(); !thawed.ok()) o.error = std::string("thaw: ") + thawed.message() + "; ";
    if (cx.dep.relay) cx.dep.relay->cut(false);
    if (expiry_reader.th.joinable()) expiry_reader.th.join();
    o.error += e.what();
  }
  end_contender();
  finish_sandbox();
  if (contender) contender->release();
  monitor.reset();
  if (auto parsed = pp::parse_sandbox_log(slurp(log_path))) {
    log_out = std::move(*parsed);
    have_log = true;
    const std::string beacon = slurp(log_path + ".last", 64);
    std::int64_t last_accept = 0;
    if (beacon.size() >= sizeof last_accept) std::memcpy(&last_accept, beacon.data(), sizeof last_accept);
    if (last_accept != 0 && !pp::close_open_interval(log_out, last_accept) && o.error.empty())
      o.error = "sandbox log " + log_path + ": its last-accept record contradicts the log";
  } else if (o.error.empty()) {
    o.error = log_path + ": " + parsed.message();
  }
  return o;
}

/// A named sandbox that runs `ms` without any pause, so the clean windows have samples of the
/// rt lateness and heartbeat RTT (under --stress, under load). "" or an error.
std::string run_baseline(TrialContext& cx, std::uint64_t ms) {
  const std::string name = "pause-probe." + cx.tag + ".baseline";
  Failure f;
  auto ans = control(cx.dep.socket,
                     {{"op", "run"}, {"name", name},
                      {"argv", {self_exe(), "pause-probe-sandbox", "--log", cx.log_dir + "/sandbox-baseline.log",
                                "--lifetime-ms", std::to_string(ms + 30'000)}},
                      {"env", sandbox_env()}},
                     f, 15'000);
  if (!ans) return f.message;
  if (!ans->value("ok", false)) return ans->value("message", std::string("run refused"));
  sleep_ms(static_cast<std::int64_t>(ms));
  control(cx.dep.socket, {{"op", "release"}, {"name", name}}, f, 5'000);
  return "";
}

std::string ms_text(std::int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f ms", static_cast<double>(ns) / 1e6);
  return b;
}

/// Creates the output directory (with its parents) and refuses a path that is not a directory;
/// then removes what an earlier run of the probe left there (its plots, its sandbox logs), so
/// every file in it comes from this run. `out` becomes absolute. "" or the error.
std::string prepare_out_dir(std::string& out, std::string& log_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    return "--out " + out + " exists and is not a directory";
  fs::create_directories(out, ec);
  if (ec) return "cannot create the output dir " + out + ": " + ec.message();
  char real[PATH_MAX];
  if (::realpath(out.c_str(), real) != nullptr) out = real;
  if (::access(out.c_str(), W_OK | X_OK) != 0) return "cannot write into the output dir " + out + ": " + std::strerror(errno);
  log_dir = out + "/sandbox-logs";
  if (fs::exists(log_dir, ec) && !fs::is_directory(log_dir, ec)) return log_dir + " exists and is not a directory";
  fs::create_directories(log_dir, ec);
  if (ec) return "cannot create " + log_dir + ": " + ec.message();
  std::vector<fs::path> stale;
  std::size_t seen = 0;
  for (fs::directory_iterator it(log_dir, ec), end; !ec && it != end && seen < kLogDirEntriesMax; it.increment(ec), ++seen) {
    const std::string name = it->path().filename().string();
    if (name.rfind("sandbox-", 0) == 0 && it->is_regular_file(ec)) stale.push_back(it->path());
  }
  for (const auto& path : stale) fs::remove(path, ec);
  for (const char* old_file : {"pause-probe.png", "pause-probe.svg", "pause-probe.gp", "gnuplot.log"})
    fs::remove(out + "/" + old_file, ec);
  return "";
}

/// The command line alone, checked before anything starts (kUsage naming the flag).
Failure check_args(const ProbeArgs& a, const pp::Timing& t) {
  if (a.repeat == 0 || a.repeat > kRepeatMax) return {kUsage, "--repeat must be 1.." + std::to_string(kRepeatMax)};
  if (a.steps == 0 || a.steps > pp::kStepsMax) return {kUsage, "--steps must be 1.." + std::to_string(pp::kStepsMax)};
  if (!(a.clock_rate_bound >= 0.0 && a.clock_rate_bound <= pp::kClockRateBoundMax))
    return {kUsage, "--clock-rate-bound " + rho_text(a.clock_rate_bound) + " is out of range 0.." +
                        rho_text(pp::kClockRateBoundMax) + " (rho, dimensionless: DESIGN.md \"Time\")"};
  if (a.standalone) {
    for (const auto& [flag, given] : {std::pair{"--supervisor", a.supervisor_socket}, std::pair{"--lockd", a.lockd},
                                      std::pair{"--key-file", a.key_file}})
      if (!given.empty())
        return {kUsage, std::string("--standalone starts its own lockd and supervisor with a key of its own; drop ") + flag};
    if (a.guard_ms >= t.kill_after_ms)
      return {kUsage, "--guard-ms " + std::to_string(a.guard_ms) + " must be below kill_after (" +
                          std::to_string(t.kill_after_ms) + " ms): the worst phase starts the freeze that long before "
                          "valid_until, which lies kill_after after the last acknowledged refresh"};
    SupervisorConfig c;  // what the standalone supervisor would check at its start
    c.lockd_address = "127.0.0.1:0";
    c.key_file = "key";
    c.ttl_ms = t.ttl_ms;
    c.kill_after_ms = t.kill_after_ms;
    c.heartbeat_interval_ms = t.heartbeat_interval_ms;
    c.kill_latency_budget_ms = t.kill_latency_budget_ms;
    c.clock_rate_bound = t.clock_rate_bound;
    if (const auto cc = check_config(c); !cc.ok())
      return {kUsage, "the supervisor would refuse this timing: " + cc.message()};
    if (pp::configured_budget_ns(t) <= 0)
      return {kUsage, "--ttl-ms " + std::to_string(t.ttl_ms) + " with --kill-after-ms " + std::to_string(t.kill_after_ms) +
                          " leaves a pause budget of " + ms_text(pp::configured_budget_ns(t)) +
                          ": it breaks DESIGN.md's safety condition (kill_after*(1+rho) + wheel_granularity + "
                          "kill_latency_budget < ttl*(1-rho))"};
  } else if (!a.standalone_only_given.empty()) {
    std::string flags;
    for (const auto& g : a.standalone_only_given) flags += (flags.empty() ? "" : ", ") + g;
    return {kUsage, flags + ": standalone only. Against a running supervisor the probe takes the timing from its "
                            "status, runs its binaries as they are, and freezes at a random phase (--guard-ms "
                            "tunes --phase worst, which needs --standalone)"};
  }
  return {};
}

/// The key file of a running deployment; kUsage naming the file and the fix.
Failure load_deployment_key(const std::string& path, Deployment& d) {
  auto kl = wire::load_key_file(path);
  if (kl) {
    d.key = *kl;
    return {};
  }
  std::string msg = kl.message();
  // The loader's own hint names lockd's flag; from here the fix is the deployment's key.
  if (const auto p = msg.find("; create one with --generate-key"); p != std::string::npos) msg.resize(p);
  return {kUsage, msg + "; pass the key file this deployment's lockd and supervisor use (--key-file or $" +
                      kKeyFileEnv + "); a new key is made with `leasehold-lockd --generate-key PATH`"};
}

/// External mode: settles which lockd the probe talks to and proves it answers with the key.
/// Without --lockd (or $LEASEHOLD_LOCKD) it is the supervisor's own (its status). A --lockd
/// that differs from the supervisor's, or a lockd that does not answer a stats request signed
/// with the key, is kUnreachable: every lockd-side observation of the trials (lockd's expiry,
/// the contender's grant) would be missing, and a trial would look safe for lack of evidence.
Failure settle_lockd(const ProbeArgs& a, Deployment& d) {
  const bool given = !a.lockd.empty() || std::getenv(kLockdEnv) != nullptr;
  std::string text;
  if (given) {
    LockdFlags lf;
    lf.lockd = a.lockd;
    resolve(lf);
    text = lf.lockd;
  } else if (!d.status_lockd.empty()) {
    text = d.status_lockd;
  } else {
    text = kLockdDefault;
  }
  auto addr = SocketAddress::parse(text);
  if (!addr) return {kUsage, "--lockd \"" + text + "\" is not HOST:PORT (numeric)"};
  if (!d.status_lockd.empty()) {
    const auto theirs = SocketAddress::parse(d.status_lockd);
    if (theirs && theirs->str() != addr->str())
      return {kUnreachable, "the supervisor at " + d.socket + " uses lockd at " + theirs->str() + ", not " + addr->str() +
                                ": the probe must watch the lockd that holds the supervisor's leases (drop --lockd, "
                                "or pass --lockd " + theirs->str() + ")"};
  }
  d.lockd_addr = *addr;
  d.lockd_text = addr->str();
  lockd::AdminClient probe(d.lockd_addr, *d.key, WorkerId{}, static_cast<std::int64_t>(kLockdCheckTimeoutMs) * 1'000'000);
  const lockd::Answer ans = probe.stats();
  if (!ans.ok())
    return {kUnreachable, "lockd at " + d.lockd_text + " did not answer a stats request signed with the key file within " +
                              std::to_string(kLockdCheckTimeoutMs) + " ms (" + ans.message() + "): is it running there, and "
                              "is the key the one lockd was started with? Without lockd's answers no trial can be judged"};
  return {};
}

/// One run of the probe: what its phases (prepare, deploy, arm, baseline, trials, report) hand
/// on to each other. Members are destroyed in reverse: the trial context, the stress load, the
/// table, the freezer (thawing the supervisor and moving it home), the lock, the deployment.
struct ProbeRun {
  explicit ProbeRun(ProbeArgs args) : a(std::move(args)) {}
  ProbeArgs a;
  Deployment d;
  pp::Phase phase = pp::Phase::random;
  std::optional<std::vector<std::uint64_t>> listed;  ///< --pauses, parsed
  std::string out, log_dir;
  std::unique_ptr<ProbeLock> lock;
  std::int64_t budget_ns = 0;
  std::vector<std::uint64_t> plan;  ///< one pause per trial
  std::string why;                  ///< how the supervisor is frozen, and why
  std::unique_ptr<Freezer> freezer;
  std::optional<shm::TableReader> table;
  harness::Process stress;
  std::string stress_text;
  std::unique_ptr<TrialContext> cx;
  pp::SweepReport rep;
  bool interrupted = false;
};

/// The command line, the output directory and the CSV path, checked (and the directory made)
/// before anything starts.
Failure prepare(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  Deployment& d = r.d;
  d.timing.ttl_ms = a.ttl_ms;
  d.timing.kill_after_ms = a.kill_after_ms != 0 ? a.kill_after_ms : a.ttl_ms * 7 / 10;
  d.timing.heartbeat_interval_ms = a.heartbeat_interval_ms != 0 ? a.heartbeat_interval_ms : std::max<std::uint64_t>(1, d.timing.kill_after_ms / 7);
  d.timing.kill_latency_budget_ms = a.kill_latency_budget_ms;
  d.timing.clock_rate_bound = a.clock_rate_bound;
  d.timing.wheel_granularity_ns = 1'000'000;  // the supervisor's default tick; status has the real one
  if (Failure f = check_args(a, d.timing); f.failed()) return f;

  r.phase = a.standalone ? pp::Phase::worst : pp::Phase::random;
  if (a.phase == "worst") {
    if (!a.standalone)
      return {kUsage, "--phase worst needs --standalone: the probe drops the supervisor's refreshes "
                      "at a relay it puts between the supervisor and lockd"};
    r.phase = pp::Phase::worst;
  } else if (a.phase == "random") {
    r.phase = pp::Phase::random;
  }

  if (a.pauses_set) {
    auto listed = pp::parse_pause_list(a.pauses);
    if (!listed) return {kUsage, "--pauses: " + listed.message()};
    r.listed = std::move(listed).value();
    if (r.listed->size() * a.repeat > pp::kPausesMax * 4) return {kUsage, "too many trials (pauses x --repeat)"};
  }

  r.out = a.out_dir;
  if (r.out.empty()) {
    char stamp[32];
    const time_t now = ::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
    r.out = std::string("pause-probe-") + stamp;
  }
  if (std::string e = prepare_out_dir(r.out, r.log_dir); !e.empty()) return {kUsage, e};
  if (!a.csv_path.empty()) {
    struct stat st {};
    const std::string dir = dir_of(a.csv_path);
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return {kUsage, "--csv " + a.csv_path + ": " + dir + " is not a directory"};
    if (::stat(a.csv_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return {kUsage, "--csv " + a.csv_path + " is a directory"};
  }
  return {};
}

/// Standalone: starts lockd, the relay and a supervisor. External: finds the supervisor and its
/// lockd, and takes the probe lock. Then the pause budget of the deployment's timing.
Failure deploy(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  Deployment& d = r.d;
  Failure f;
  if (a.standalone) {
    stderr_progress(a.quiet, "starting lockd and a supervisor in a temp dir...\n");
    if (f = start_standalone(a, d); f.failed()) return f;
    if (f = read_status(a, d); f.failed()) return f;
  } else {
    SupervisorFlags sf;
    sf.socket = a.supervisor_socket;
    resolve(sf);
    d.socket = sf.socket;
    LockdFlags lf;
    lf.key_file = a.key_file;
    resolve(lf);
    if (f = load_deployment_key(lf.key_file, d); f.failed()) return f;
    if (f = recover_left_frozen(d.socket); f.failed()) return f;
    if (f = read_status(a, d); f.failed()) return f;
    if (f = settle_lockd(a, d); f.failed()) return f;
    r.lock = ProbeLock::take(d.supervisor_pid, d.socket, f);
    if (!r.lock) return f;
  }
  r.budget_ns = pp::configured_budget_ns(d.timing);
  if (r.budget_ns <= 0)
    return {kUsage, "the configured pause budget is " + ms_text(r.budget_ns) + ": the timing breaks DESIGN.md's safety condition"};
  return {};
}

/// The trial plan, the freezer, the supervisor's shm table and the stress load (bounded in time).
Failure arm(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  const Deployment& d = r.d;
  std::vector<std::uint64_t> pauses;
  if (r.listed) {
    pauses = *r.listed;
  } else {
    pauses = pp::default_sweep_ms(d.timing.ttl_ms, a.steps);
    if (pauses.empty()) return {kUsage, "no default sweep for ttl " + std::to_string(d.timing.ttl_ms) + " ms; pass --pauses"};
  }
  for (auto p : pauses)
    for (std::uint32_t i = 0; i < a.repeat; ++i) r.plan.push_back(p);
  if (r.plan.size() > pp::kPausesMax * 4) return {kUsage, "too many trials (pauses x --repeat)"};

  auto freezer = Freezer::make(d.supervisor_pid, a.freeze, r.why);
  if (!freezer) return {kUsage, freezer.message()};
  r.freezer = std::move(freezer).value();

  try {
    r.table.emplace(shm::TableReader::open(d.shm_path, shm::OpenOptions{2'000'000'000, 1'000'000}));
  } catch (const shm::TableError& e) {
    return {kTableError, std::string("the supervisor's shm table: ") + e.what()};
  }

  if (a.stress) {
    const std::string bin = find_program("stress-ng");
    if (bin.empty()) {
      stderr_progress(a.quiet, "warning: --stress: stress-ng is not installed; measuring without load\n");
    } else {
      std::uint64_t est_s = 30;
      for (auto p : r.plan) est_s += (d.timing.kill_after_ms + p + d.timing.ttl_ms + 1500) / 1000 + 1;
      const std::uint64_t secs = a.stress_timeout_s != 0 ? a.stress_timeout_s : est_s;
      std::vector<std::string> argv = {bin};
      std::stringstream ss(a.stress_args);
      for (std::string w; ss >> w;) argv.push_back(w);
      argv.insert(argv.end(), {"--timeout", std::to_string(secs) + "s", "--quiet"});
      const std::string slog = (a.standalone ? d.dir() : r.out) + "/stress-ng.log";
      if (const Status started = spawn_proc(r.stress, "stress-ng", argv, slog); !started.ok())
        return {kInternal, started.message()};
      for (const auto& w : argv) r.stress_text += (r.stress_text.empty() ? "" : " ") + w;
      stderr_progress(a.quiet, "stress: " + r.stress_text + "\n");
      sleep_ms(500);  // let the load ramp up before the first trial
    }
  }
  return {};
}

/// The report's header, the progress line about the deployment, the trial context and the
/// baseline window (a named sandbox without pauses).
void baseline(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  Deployment& d = r.d;
  r.rep.timing = d.timing;
  r.rep.mode = a.standalone ? "standalone" : "external";
  r.rep.freeze = r.freezer->name();
  r.rep.freeze_why = r.why;
  r.rep.phase = r.phase;
  r.rep.stress = r.stress_text;

  stderr_progress(a.quiet, "supervisor pid " + std::to_string(d.supervisor_pid) + ", lockd " + d.lockd_text +
                               "; freeze: " + r.why + "; phase " + std::string(pp::to_string(r.phase)) + "\n" +
                               "ttl " + std::to_string(d.timing.ttl_ms) + " ms, kill_after " +
                               std::to_string(d.timing.kill_after_ms) + " ms, heartbeat " +
                               std::to_string(d.timing.heartbeat_interval_ms) + " ms, pause budget " +
                               ms_text(r.budget_ns) + "; " + std::to_string(r.plan.size()) + " trial(s)\n");

  raise_observer_priority();  // this thread times the freeze against valid_until
  r.cx.reset(new TrialContext{a, d, *r.freezer, *r.table, r.phase,
                              std::to_string(::getpid()) + "-" + std::to_string(now_ns() % 1'000'000'000), r.log_dir,
                              std::mt19937_64(a.seed != 0 ? a.seed : static_cast<std::uint64_t>(now_ns())), {}, {}, {}, {},
                              a.guard_ms});
  r.cx->lateness_from = snap_stats(*r.table);
  r.cx->rtt_from = r.cx->lateness_from;
  if (a.baseline_ms > 0) {
    stderr_progress(a.quiet, "baseline: a named sandbox for " + std::to_string(a.baseline_ms) +
                                 " ms without pauses (rt lateness and heartbeat RTT)\n");
    if (std::string e = run_baseline(*r.cx, a.baseline_ms); !e.empty()) stderr_progress(a.quiet, "warning: baseline: " + e + "\n");
  }
}

/// Every trial of the plan (Ctrl-C ends the sweep: r.interrupted), then the clean windows
/// closed, the stress load and the freezer gone, and the verdict.
void trials(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  const pp::Timing& timing = r.d.timing;
  TrialContext& cx = *r.cx;
  for (std::size_t i = 0; i < r.plan.size(); ++i) {
    const std::uint64_t p = r.plan[i];
    const bool under = static_cast<std::int64_t>(p) * 1'000'000 < r.budget_ns;
    stderr_progress(a.quiet, "[" + std::to_string(i + 1) + "/" + std::to_string(r.plan.size()) + "] pause " +
                                 std::to_string(p) + " ms (" + (under ? "under" : "past") + " the budget) ... ");
    pp::SandboxLog log;
    bool have_log = false;
    pp::TrialObservation o;
    pp::TrialResult res;
    // The deadline wheel may fire a kill early (it rounds down, DESIGN.md "Time"), before a
    // worst-phase freeze took hold; such a trial says nothing about the pause, so it is run
    // again with the freeze started earlier (bounded: kPauseMissedRetriesMax).
    cx.guard_ms = a.guard_ms;
    try {
      for (std::uint32_t attempt = 0;; ++attempt) {
        log = {};
        have_log = false;
        o = run_trial(cx, i * (kPauseMissedRetriesMax + 1) + attempt, p, log, have_log);
        res = pp::classify(o, have_log ? &log : nullptr, timing);
        if (!res.pause_missed || r.phase != pp::Phase::worst || attempt == kPauseMissedRetriesMax) break;
        cx.guard_ms = std::min(cx.guard_ms * 4 + 1, timing.kill_after_ms / 2);
        stderr_progress(a.quiet, "killed before the freeze took hold; again with the freeze " +
                                     std::to_string(cx.guard_ms) + " ms before valid_until ... ");
      }
    } catch (const Interrupted&) {
      r.interrupted = true;
      stderr_progress(a.quiet, "interrupted\n");
      break;
    }
    std::string line = std::string(pp::to_string(res.outcome));
    if (res.margin_ns) line += ", margin " + ms_text(*res.margin_ns);
    if (res.violation) line += ", window " + ms_text(res.window_ns);
    if (res.recovery_ns) line += ", recovery " + ms_text(*res.recovery_ns);
    if (!res.side_effects_refused) line += ", SIDE EFFECT ACCEPTED";
    if (!res.note.empty()) line += " (" + res.note + ")";
    stderr_progress(a.quiet, line + "\n");
    pp::add_kill_latency(r.rep.measured, o, res);
    r.rep.observations.push_back(std::move(o));
    r.rep.results.push_back(std::move(res));
  }
  {
    const StatsSnapshot last = snap_stats(*r.table);
    close_lateness_window(cx, last);
    close_rtt_window(cx, last);
  }
  r.stress.terminate(std::chrono::milliseconds(1000));
  r.freezer.reset();

  if (g_observer_fifo_refused.load())
    stderr_progress(a.quiet, "warning: SCHED_FIFO refused for the observer threads: under load, deaths and grants "
                             "may be seen late (the supervisor's own kill record still bounds the death)\n");
  r.rep.measured.rt_lateness = cx.clean_lateness;
  r.rep.measured.heartbeat_rtt = cx.clean_rtt;
  pp::finish_measured(r.rep.measured, timing);
  r.rep.verdict = pp::sweep_verdict(r.rep.observations, r.rep.results, timing);
  if (r.interrupted) r.rep.verdict = pp::interrupted_verdict(r.rep.verdict, r.plan.size());
}

/// The CSV, the plot (gnuplot's PNG, else an SVG), the JSON and the table; the exit code.
int report_sweep(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  const pp::SweepReport& rep = r.rep;
  const std::string& out = r.out;
  const std::string csv = !a.csv_path.empty() ? a.csv_path : out + "/pause-probe.csv";
  const std::string json_path = out + "/pause-probe.json";
  if (const Status w = harness::write_file(csv, pp::to_csv(rep)); !w.ok()) return report("pause-probe", {kFailure, w.message()});
  nlohmann::json j = pp::to_json(rep);
  std::string plot_path;
  const std::string gnuplot = a.plot == "svg" ? "" : find_program("gnuplot");
  if (!gnuplot.empty()) {
    plot_path = out + "/pause-probe.png";
    const std::string script = out + "/pause-probe.gp";
    if (const Status w = harness::write_file(script, pp::gnuplot_script(rep, csv, plot_path)); !w.ok()) return report("pause-probe", {kFailure, w.message()});
    harness::Process gp;
    if (spawn_proc(gp, "gnuplot", {gnuplot, script}, out + "/gnuplot.log").ok()) {
      gp.wait(std::chrono::milliseconds(kGnuplotTimeoutMs));
      gp.terminate(std::chrono::milliseconds(100));
    }
    struct stat st{};
    if (::stat(plot_path.c_str(), &st) != 0 || st.st_size == 0) {
      // No point to draw (every trial an error), or gnuplot failed: no empty PNG is left.
      ::unlink(plot_path.c_str());
      stderr_progress(a.quiet, "warning: gnuplot did not write " + plot_path + " (see " + out +
                                   "/gnuplot.log); writing an SVG instead\n");
      plot_path.clear();
    }
  } else if (a.plot == "png") {
    stderr_progress(a.quiet, "warning: gnuplot is not installed; writing an SVG instead of a PNG\n");
  }
  if (plot_path.empty()) {
    plot_path = out + "/pause-probe.svg";
    if (const Status w = harness::write_file(plot_path, pp::svg_plot(rep)); !w.ok()) return report("pause-probe", {kFailure, w.message()});
  }
  j["files"] = {{"csv", csv}, {"plot", plot_path}, {"json", json_path}, {"sandbox_logs", r.log_dir}};
  j["interrupted"] = r.interrupted;
  if (const Status w = harness::write_file(json_path, j.dump(2) + "\n"); !w.ok()) return report("pause-probe", {kFailure, w.message()});

  std::string text = "\n" + pp::to_table(rep) + "\n" + pp::budget_text(rep);
  if (rep.verdict.safe_pause_max_ms || rep.verdict.violating_pause_min_ms) {
    text += "observed threshold       longest pause without a violation " +
            (rep.verdict.safe_pause_max_ms ? std::to_string(*rep.verdict.safe_pause_max_ms) + " ms" : std::string("-")) +
            ", shortest with one " +
            (rep.verdict.violating_pause_min_ms ? std::to_string(*rep.verdict.violating_pause_min_ms) + " ms" : std::string("-")) + "\n";
  }
  if (rep.verdict.window_excess_max_ns) {
    const std::int64_t c = *rep.verdict.window_excess_max_ns;
    text += "window past the budget   <= (pause - budget) " + std::string(c < 0 ? "- " : "+ ") +
            ms_text(c < 0 ? -c : c) + " (largest window " + ms_text(rep.verdict.window_max_ns.value_or(0)) + ")\n";
  }
  text += "files                    " + csv + "  " + plot_path + "  " + json_path + "\n";
  text += "verdict                  " + rep.verdict.line + "\n";
  if (a.json) {
    std::fputs(text.c_str(), stderr);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  std::fflush(stdout);
  if (r.interrupted) return kFailure;
  if (rep.verdict.trials == rep.verdict.errors) return kFailure;
  return rep.verdict.ok ? kOk : kFailure;
}

int run_probe(ProbeArgs args) {
  SignalScope signals;
  g_interrupted.store(false);
  g_observer_priority.store(args.observer_priority);
  ProbeRun r(std::move(args));
  if (Failure f = prepare(r); f.failed()) return report("pause-probe", f);
  try {
    if (Failure f = deploy(r); f.failed()) return report("pause-probe", f);
    if (Failure f = arm(r); f.failed()) return report("pause-probe", f);
    baseline(r);
    trials(r);
    return report_sweep(r);
  } catch (const Interrupted&) {
    // Cleaned up before saying so: the trial context, the load, the table, the freezer (the
    // supervisor thawed and moved home) and the lock; the deployment goes with `r`.
    r.cx.reset();
    r.stress.kill9();
    r.table.reset();
    r.freezer.reset();
    r.lock.reset();
    std::fputs("leasehold pause-probe: interrupted; cleaned up\n", stderr);
    return kFailure;
  }
}

// ---- the probe sandbox -------------------------------------------------------------------------

struct SandboxArgs {
  std::string log;
  std::uint64_t poll_us = 1000;
  std::uint64_t lifetime_ms = 600'000;
};

int run_sandbox(const SandboxArgs& a) {
  // One sandbox, one log: truncated at the start (a log of an earlier life would read as two).
  const int fd = ::open(a.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "leasehold pause-probe-sandbox: cannot open %s: %s\n", a.log.c_str(), std::strerror(errno));
    return kUsage;
  }
  char buf[256];
  // One write per line (O_APPEND): a kill can only tear the last line, which the parser drops.
  auto emit = [fd, &buf](int n) {
    if (n > 0) (void)!::write(fd, buf, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof buf) - 1)));
  };
  const char* slot_env = std::getenv("LEASEHOLD_SLOT");
  const char* epoch_env = std::getenv("LEASEHOLD_EPOCH");
  if (slot_env == nullptr || epoch_env == nullptr || std::getenv("LEASEHOLD_SHM") == nullptr) {
    emit(std::snprintf(buf, sizeof buf, "# error: LEASEHOLD_SHM, LEASEHOLD_SLOT and LEASEHOLD_EPOCH must be set (run it as a named sandbox)\n"));
    ::close(fd);
    return kUsage;
  }
  const std::uint32_t slot = static_cast<std::uint32_t>(std::strtoul(slot_env, nullptr, 10));
  const std::uint64_t epoch = std::strtoull(epoch_env, nullptr, 10);
  std::optional<shm::TableReader> table;
  try {
    table.emplace(shm::TableReader::open(shm::location_from_env(), shm::OpenOptions{2'000'000'000, 1'000'000}));
  } catch (const shm::TableError& e) {
    emit(std::snprintf(buf, sizeof buf, "# error: %s\n", e.what()));
    ::close(fd);
    return kTableError;
  }
  const shm::Slot* s = table->slot(slot);
  if (s == nullptr) {
    emit(std::snprintf(buf, sizeof buf, "# error: slot %u out of range\n", slot));
    ::close(fd);
    return kTableError;
  }
  // The latest accepted check, in a shared mapping that outlives a SIGKILL (see
  // leasehold/pause/model.hpp close_open_interval): one relaxed store per check, no syscall.
  std::atomic<std::int64_t>* last_accept_shared = nullptr;
  {
    const std::string beacon = a.log + ".last";
    const int bfd = ::open(beacon.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (bfd >= 0 && ::ftruncate(bfd, 64) == 0) {
      void* m = ::mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, bfd, 0);
      if (m != MAP_FAILED) last_accept_shared = new (m) std::atomic<std::int64_t>(0);
    }
    if (bfd >= 0) ::close(bfd);
  }
  const std::int64_t start = now_ns();
  emit(std::snprintf(buf, sizeof buf, "start t=%" PRId64 " slot=%u epoch=%" PRIu64 " pid=%d\n", start, slot, epoch, static_cast<int>(::getpid())));
  enum { kUnknown, kValid, kRefused } state = kUnknown;
  std::int64_t last_accept = 0;
  std::uint64_t accepts = 0, refusals = 0, late = 0;
  const std::int64_t end = start + static_cast<std::int64_t>(a.lifetime_ms) * 1'000'000;
  const timespec nap{0, static_cast<long>(std::min<std::uint64_t>(a.poll_us, 999'999) * 1000)};
  for (std::int64_t t = now_ns(); t < end; t = now_ns()) {
    // t is read before check_deadline reads its own clock, and valid_until after it: an accept
    // with t > valid_until can only mean the check accepted an expired lease.
    const bool ok = table->check_deadline(slot, epoch);
    const std::int64_t vu = static_cast<std::int64_t>(s->valid_until_ns.load(std::memory_order_acquire));
    if (ok) {
      ++accepts;
      if (t > vu) {
        ++late;
        emit(std::snprintf(buf, sizeof buf, "late t=%" PRId64 " vu=%" PRId64 "\n", t, vu));
      }
      if (state != kValid) emit(std::snprintf(buf, sizeof buf, "valid t=%" PRId64 " vu=%" PRId64 "\n", t, vu));
      state = kValid;
      last_accept = t;
      if (last_accept_shared != nullptr) last_accept_shared->store(t, std::memory_order_relaxed);
    } else {
      ++refusals;
      if (state != kRefused) emit(std::snprintf(buf, sizeof buf, "refused t=%" PRId64 " last=%" PRId64 " vu=%" PRId64 "\n", t, last_accept, vu));
      state = kRefused;
    }
    ::clock_nanosleep(CLOCK_BOOTTIME, 0, &nap, nullptr);
  }
  emit(std::snprintf(buf, sizeof buf, "exit t=%" PRId64 " accepts=%" PRIu64 " refusals=%" PRIu64 " late=%" PRIu64 "\n", now_ns(), accepts, refusals, late));
  ::close(fd);
  return kOk;
}

// ---- registration ------------------------------------------------------------------------------

const Command kPauseProbe([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ProbeArgs>();
  auto* sub = app.add_subcommand(
      "pause-probe",
      "Measure the pause tolerance: for each pause length, run a named sandbox, freeze the supervisor "
      "(cgroup v2 freeze, else SIGSTOP) that long, resume, and record whether the kill-switch fired "
      "before lockd's expiry, the margin, the mutex-violation window, recovery, and the sandbox's own "
      "check_deadline answers; writes a table, CSV, JSON and a plot (DESIGN.md \"Time\"; pause/README.md)");
  sub->add_flag("--standalone", a->standalone,
                "start lockd and a supervisor in a temp dir, with their own key; everything is removed on exit");
  sub->add_option("--supervisor", a->supervisor_socket,
                  std::string("control socket of a running supervisor (env ") + kSupervisorEnv + ")");
  sub->add_option("--lockd", a->lockd, std::string("lockd address HOST:PORT of that deployment (env ") + kLockdEnv + ")");
  sub->add_option("--key-file", a->key_file, std::string("its HMAC key file (env ") + kKeyFileEnv + ")");
  std::vector<CLI::Option*> standalone_only;
  standalone_only.push_back(sub->add_option("--lockd-bin", a->lockd_bin, "standalone: leasehold-lockd to run (default: next to this binary, or $PATH)"));
  standalone_only.push_back(sub->add_option("--supervisor-bin", a->supervisor_bin, "standalone: leasehold-supervisor to run"));
  standalone_only.push_back(sub->add_option("--ttl-ms", a->ttl_ms, "standalone: lease TTL, ms")->capture_default_str()->check(CLI::Range(100, 600'000)));
  standalone_only.push_back(sub->add_option("--kill-after-ms", a->kill_after_ms,
                                            "standalone: kill_after, ms; 0 = 70 % of the TTL (the default)")
                                ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{600'000})));
  standalone_only.push_back(sub->add_option("--heartbeat-interval-ms", a->heartbeat_interval_ms,
                                            "standalone: heartbeat interval, ms; 0 = kill_after/7 (the default)")
                                ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{600'000})));
  auto* klb = sub->add_option("--kill-latency-budget-ms", a->kill_latency_budget_ms,
                              "kill latency budget, ms (standalone: passed to the supervisor; external: default "
                              "the supervisor's own, from its status)")
                  ->capture_default_str();
  auto* rho = sub->add_option("--clock-rate-bound", a->clock_rate_bound,
                              "rho, dimensionless, 0..0.1 (external: default the supervisor's own, from its status)")
                  ->capture_default_str();
  sub->add_option("--steps", a->steps, "default sweep: this many steps from 0 to 2*ttl")->capture_default_str();
  auto* pauses = sub->add_option("--pauses", a->pauses, "pause lengths instead of the default sweep: e.g. 0,250,500ms,1.5s");
  sub->add_option("--repeat", a->repeat, "trials per pause length")->capture_default_str();
  sub->add_option("--phase", a->phase,
                  "worst: drop refreshes at the probe's relay and freeze --guard-ms before valid_until (standalone; "
                  "the default there); random: freeze at a random moment of the heartbeat cycle")
      ->check(CLI::IsMember({"auto", "worst", "random"}));
  standalone_only.push_back(sub->add_option("--guard-ms", a->guard_ms,
                                            "worst phase (standalone): start the freeze this long before valid_until, "
                                            "ms; below kill_after")
                                ->capture_default_str());
  sub->add_option("--baseline-ms", a->baseline_ms,
                  "before the sweep, run a named sandbox this long without pauses (clean lateness/RTT samples); 0 = none")
      ->capture_default_str();
  sub->add_option("--observer-priority", a->observer_priority,
                  "SCHED_FIFO priority of the probe's observer threads (0: normal priority)")
      ->capture_default_str()->check(CLI::Range(0, 98));
  sub->add_option("--freeze", a->freeze, "auto | cgroup | sigstop")->check(CLI::IsMember({"auto", "cgroup", "sigstop"}))->capture_default_str();
  sub->add_option("--contend-interval-ms", a->contend_interval_ms,
                  "the contender's acquire attempts, one per this many ms")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_flag("--stress", a->stress, "run stress-ng during the sweep (bounded in time)");
  sub->add_option("--stress-args", a->stress_args, "stress-ng arguments")->capture_default_str();
  sub->add_option("--stress-timeout-s", a->stress_timeout_s, "stress-ng --timeout, s (default: the sweep's estimate)");
  sub->add_option("--out", a->out_dir,
                  "output directory, created if missing (default ./pause-probe-<date>-<time>); an existing one is "
                  "reused: the probe's files in it (CSV, JSON, plot, sandbox logs) are replaced");
  sub->add_option("--csv", a->csv_path, "CSV path (default <out>/pause-probe.csv)");
  sub->add_option("--plot", a->plot, "auto (PNG through gnuplot, else SVG) | png | svg")->check(CLI::IsMember({"auto", "png", "svg"}));
  sub->add_flag("--json", a->json, "print the JSON summary on stdout (the table goes to stderr)");
  sub->add_flag("--quiet", a->quiet, "no progress lines");
  sub->add_option("--seed", a->seed, "random phase seed (default: from the clock)");
  sub->callback([a, klb, rho, pauses, standalone_only, exit_code] {
    a->kill_latency_budget_set = klb->count() > 0;
    a->clock_rate_bound_set = rho->count() > 0;
    a->pauses_set = pauses->count() > 0;
    a->standalone_only_given.clear();
    for (const CLI::Option* o : standalone_only)
      if (o->count() > 0) a->standalone_only_given.push_back(o->get_name());
    *exit_code = run_probe(*a);
  });
});

const Command kPauseProbeSandbox([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<SandboxArgs>();
  auto* sub = app.add_subcommand("pause-probe-sandbox",
                                 "the sandbox `pause-probe` runs: polls check_deadline and logs each change");
  sub->group("");  // internal: not listed in --help
  sub->add_option("--log", a->log, "log file (created fresh)")->required();
  sub->add_option("--poll-us", a->poll_us, "pause between checks, us")->check(CLI::Range(10, 1'000'000));
  sub->add_option("--lifetime-ms", a->lifetime_ms, "exit after this long, ms")->check(CLI::Range(1, 86'400'000));
  sub->callback([a, exit_code] { *exit_code = run_sandbox(*a); });
});

}  // namespace
}  // namespace leasehold::cli
