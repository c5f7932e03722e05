// leasehold/harness: the pause-probe's trials (include/leasehold/harness/pause_trial.hpp).
#include "leasehold/harness/pause_trial.hpp"

#include "leasehold/shm/layout.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/wire/protocol.hpp"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace leasehold::harness {

namespace pp = leasehold::pause;

// ---- observers ---------------------------------------------------------------------------------

void ObserverPriority::raise() noexcept {
  if (priority_ <= 0) return;
  sched_param sp{};
  sp.sched_priority = priority_;
  // The calling thread only; children forked later (stress-ng, gnuplot) start at normal priority.
  if (::sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) != 0) refused_.store(true);
}

SlotMonitor::SlotMonitor(int pidfd, const shm::Slot* slot, ObserverPriority& priority)
    : pidfd_(pidfd), slot_(slot), priority_(priority) {
  thread_ = std::thread([this] { loop(); });
}

SlotMonitor::~SlotMonitor() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::uint64_t SlotMonitor::valid_until_ns() const noexcept {
  return slot_->valid_until_ns.load(std::memory_order_acquire);
}

std::int64_t SlotMonitor::refreshed_after(std::int64_t after_ns, std::uint64_t above_ns) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& [t, vu] : changes_)
    if (t >= after_ns && vu > above_ns) return t;
  return 0;
}

void SlotMonitor::loop() {
  priority_.raise();
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

Contender::Contender(const SocketAddress& lockd, const wire::WireKey& key, std::string name, std::int64_t interval_ns,
                     ObserverPriority& priority)
    : client_(lockd, key, WorkerId{}, 250'000'000),
      name_(std::move(name)),
      interval_ns_(interval_ns),
      priority_(priority),
      sandbox_(random_sandbox_id()) {}

Contender::~Contender() { stop(); }

void Contender::start() {
  thread_ = std::thread([this] { loop(); });
}

void Contender::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Contender::release() {
  if (!granted()) return;
  client_.release(name_id_, sandbox_, epoch_);
}

void Contender::loop() {
  priority_.raise();
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

pp::HistogramSnapshot snapshot_of(const shm::Histogram& h) {
  pp::HistogramSnapshot s;
  s.count = h.count.load(std::memory_order_relaxed);
  s.sum = h.sum.load(std::memory_order_relaxed);
  s.max = h.max.load(std::memory_order_relaxed);
  for (std::size_t b = 0; b < pp::kHistogramBuckets; ++b) s.buckets[b] = h.buckets[b].load(std::memory_order_relaxed);
  return s;
}

StatsSnapshot snap_stats(const shm::TableReader& t) {
  const shm::Stats& s = t.stats();
  return {snapshot_of(s.rt_lateness_ns), snapshot_of(s.heartbeat_rtt_ns), snapshot_of(s.kill_latency_ns),
          s.counters.kills.load(std::memory_order_relaxed)};
}

// ---- one probe per supervisor ------------------------------------------------------------------

Result<std::unique_ptr<ProbeLock>> ProbeLock::take(pid_t supervisor_pid, const std::string& socket) {
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
  if (fd < 0) return Status::from_errno(errno, "cannot create the probe's lock file " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    const std::string owner = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("?");
    if (e != EWOULDBLOCK) return Status::from_errno(e, "flock " + path);
    return Status{Errc::busy, "another pause-probe (pid " + owner.substr(0, owner.find('\n')) +
                                  ") is already probing the supervisor (pid " + std::to_string(supervisor_pid) + ", " +
                                  socket + "); two probes would freeze it in each other's pauses. Wait for it "
                                  "to finish (lock: " + path + ")"};
  }
  const std::string me = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    // The lock holds without the pid in it; only the other probe's message is poorer.
  }
  std::unique_ptr<ProbeLock> l(new ProbeLock());
  l->fd_ = fd;
  l->path_ = path;
  return l;
}

ProbeLock::~ProbeLock() {
  if (fd_ >= 0) ::close(fd_);
}

// ---- the trials --------------------------------------------------------------------------------

std::map<std::string, std::string> sandbox_env() {
  std::map<std::string, std::string> env;
  for (const char* k : {"PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"})
    if (const char* v = std::getenv(k); v != nullptr) env[k] = v;
  if (env.find("PATH") == env.end()) env["PATH"] = "/usr/bin:/bin";
  return env;
}

namespace {

constexpr std::int64_t kNs = 1'000'000;  ///< ns per ms

/// A thread joined when this goes (a Show still in flight when a trial ends early).
struct Joiner {
  std::thread th;
  ~Joiner() { join(); }
  void join() {
    if (th.joinable()) th.join();
  }
};

/// A descriptor closed when this goes.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

/// True once `log_path` has the sandbox's start line.
bool sandbox_started(const std::string& log_path) {
  std::ifstream in(log_path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("start ", 0) == 0) return true;
  return false;
}

}  // namespace

/// The state of one trial, step by step (pause/README.md "One trial"). Every step but the last
/// throws std::runtime_error for a trial that cannot go on, and lets harness::Interrupted through.
class Trial {
 public:
  Trial(TrialRunner& r, std::size_t index, std::uint64_t pause_ms)
      : r_(r),
        t_(r.target_.timing),
        name_("pause-probe." + r.settings_.tag + "." + std::to_string(index)),
        log_path_(r.settings_.log_dir + "/sandbox-" + std::to_string(index) + "-" + std::to_string(pause_ms) + "ms.log") {
    o_.pause_ms = pause_ms;
    o_.phase = r.settings_.phase;
  }

  pp::TrialObservation run(pp::SandboxLog& log, bool& have_log);

 private:
  bool start_sandbox();
  void settle();
  void read_expiry();
  void position();
  void freeze_for_pause();
  void observe();
  void collect(const StatsSnapshot& s1);
  void thaw_after_failure();
  void end_sandbox();
  void read_log(pp::SandboxLog& log, bool& have_log);
  void sleep_until(std::int64_t t_ns) { sleep_until_ns(t_ns, r_.settings_.tick); }

  TrialRunner& r_;
  const pp::Timing& t_;
  pp::TrialObservation o_;
  std::string name_, log_path_, sandbox_;
  std::optional<StatusCounters> before_;
  FdCloser pidfd_{-1};
  std::unique_ptr<SlotMonitor> monitor_;
  std::unique_ptr<Contender> contender_;
  // Declared before the reader thread: a Show still in flight on it when a step throws is joined
  // at the end of the trial, after the supervisor was thawed.
  std::optional<lockd::AdminClient> shower_;
  Joiner expiry_reader_;
};

/// `run` of the probe sandbox through the supervisor; false with o_.error when there is no
/// sandbox to watch.
bool Trial::start_sandbox() {
  const std::uint64_t lifetime_ms = t_.kill_after_ms + o_.pause_ms + 2 * t_.ttl_ms + 30'000;
  // A fresh log: the sandbox appends, and a log of an earlier run would read as two lives.
  ::unlink(log_path_.c_str());
  ::unlink((log_path_ + ".last").c_str());
  before_ = r_.status_counters();
  nlohmann::json argv = r_.target_.sandbox_argv;
  for (const std::string& w : {std::string("--log"), log_path_, std::string("--lifetime-ms"), std::to_string(lifetime_ms)})
    argv.push_back(w);
  const nlohmann::json env = sandbox_env();
  auto ans = r_.target_.request({{"op", "run"}, {"name", name_}, {"argv", argv}, {"env", env}}, milliseconds(15'000));
  if (!ans) {
    o_.error = "run: " + ans.message();
    return false;
  }
  if (!ans->value("ok", false)) {
    o_.error = "run: " + ans->value("error", std::string("?")) + ": " + ans->value("message", std::string());
    return false;
  }
  const pid_t pid = ans->value("pid", -1);
  const std::uint32_t slot = ans->value("slot", 0u);
  sandbox_ = ans->value("sandbox", std::string());
  const shm::Slot* s = r_.table_.slot(slot);
  if (s == nullptr || pid <= 0) {
    o_.error = "run answered without a usable slot/pid: " + ans->dump();
    return false;
  }
  pidfd_.fd = pidfd_open(pid);
  monitor_ = std::make_unique<SlotMonitor>(pidfd_.fd, s, r_.priority_);
  if (pidfd_.fd < 0) o_.error = "pidfd_open(" + std::to_string(pid) + "): " + std::strerror(errno);
  return true;
}

/// A healthy lease first: at least one refresh acknowledged since the start, and the sandbox
/// running its checks (its start line logged; a slow exec on a loaded host can take longer than
/// a heartbeat interval, and a trial judged without it would be an error).
void Trial::settle() {
  const std::uint64_t vu0 = monitor_->valid_until_ns();
  const std::int64_t settle_until = now_ns() + static_cast<std::int64_t>(3 * t_.heartbeat_interval_ms + 2000) * kNs;
  bool started = false;
  while ((monitor_->valid_until_ns() == vu0 || !(started = started || sandbox_started(log_path_))) &&
         now_ns() < settle_until && monitor_->death_ns() == 0)
    sleep_until(now_ns() + kNs);
  if (monitor_->death_ns() != 0) throw std::runtime_error("the sandbox died before the pause (see " + log_path_ + ")");
  if (monitor_->valid_until_ns() == vu0) throw std::runtime_error("the lease was never refreshed before the pause");
  if (!started) throw std::runtime_error("the sandbox did not start its checks before the pause (see " + log_path_ + ")");
}

/// lockd's expiry of the lease (Show: ttl_left). A blocking request: never on the thread that
/// times the freeze.
void Trial::read_expiry() {
  const std::int64_t sent = now_ns();
  const lockd::Answer a = shower_->show(name_);
  const std::int64_t recv = now_ns();
  const auto* info = a.as<wire::NameInfo>();
  if (info == nullptr || info->record.state != LockPhase::held || info->record.holder.str() != sandbox_) return;
  o_.expiry_lo_ns = sent + static_cast<std::int64_t>(info->record.ttl_left_ms) * kNs;
  o_.expiry_hi_ns = recv + static_cast<std::int64_t>(info->record.ttl_left_ms + 1) * kNs;
}

/// Worst phase: drop the refreshes at the relay, follow valid_until until it stops moving, and
/// return `guard` before it. Random phase: return at a random moment of a heartbeat cycle.
void Trial::position() {
  if (r_.settings_.phase != pp::Phase::worst) {
    std::uniform_int_distribution<std::int64_t> phase(0, static_cast<std::int64_t>(t_.heartbeat_interval_ms) * kNs);
    sleep_until(now_ns() + phase(r_.rng_));
    return;
  }
  if (r_.target_.relay == nullptr) throw std::runtime_error("the worst phase needs the relay");
  r_.target_.relay->cut(true);
  o_.cut_ns = now_ns();
  // The last refresh answers may still arrive: follow valid_until until it stops moving, and
  // start the freeze `guard` before it.
  const std::int64_t cut_limit = o_.cut_ns + static_cast<std::int64_t>(t_.kill_after_ms + 2000) * kNs;
  for (;;) {
    if (now_ns() > cut_limit) throw std::runtime_error("valid_until kept moving although the relay dropped every refresh");
    const std::int64_t vu = static_cast<std::int64_t>(monitor_->valid_until_ns());
    const std::int64_t at = vu - static_cast<std::int64_t>(r_.guard_ms_) * kNs;
    if (now_ns() >= at || monitor_->death_ns() != 0) break;
    sleep_until(std::min(at, now_ns() + kNs));
  }
  read_expiry();  // nothing reaches lockd any more: this is the expiry
}

/// Freezes the supervisor, thaws it `pause` after the freeze request, and in the random phase
/// reads lockd's expiry 2 ms into the freeze on a thread of its own.
void Trial::freeze_for_pause() {
  o_.valid_until_ns = static_cast<std::int64_t>(monitor_->valid_until_ns());
  contender_->start();
  r_.close_lateness_window(snap_stats(r_.table_));
  o_.freeze_ns = now_ns();
  // The thaw is due at this CLOCK_BOOTTIME instant whatever else happens during the freeze;
  // thaw_ns records when it was really requested (leasehold/pause/model.hpp: measured_pause_ns).
  const std::int64_t thaw_due = o_.freeze_ns + static_cast<std::int64_t>(o_.pause_ms) * kNs;
  const Result<std::int64_t> frozen = r_.freezer_.freeze();
  if (!frozen.ok()) throw std::runtime_error("freeze: " + frozen.message());
  o_.frozen_ns = *frozen;
  if (r_.settings_.phase == pp::Phase::random && now_ns() + 3'000'000 < thaw_due) {
    expiry_reader_.th = std::thread([this, at = o_.freeze_ns + 2'000'000] {
      // 2 ms into the freeze: a refresh already in flight lands first.
      const timespec ts{static_cast<time_t>(at / 1'000'000'000), static_cast<long>(at % 1'000'000'000)};
      while (::clock_nanosleep(CLOCK_BOOTTIME, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
      }
      read_expiry();
    });
  }
  sleep_until(thaw_due);
  o_.thaw_ns = now_ns();
  if (r_.target_.relay != nullptr) r_.target_.relay->cut(false);
  const Result<std::int64_t> thawed = r_.freezer_.thaw();
  if (!thawed.ok()) throw std::runtime_error("thaw: " + thawed.message());
  o_.thawed_ns = *thawed;
  expiry_reader_.join();
}

/// Observes until the sandbox died (and the next grant was seen, or kGrantWaitAfterDeathMs
/// passed), or the lease was refreshed and stayed so for two heartbeats, or ttl + 2 s passed.
void Trial::observe() {
  const std::int64_t hb_ns = static_cast<std::int64_t>(t_.heartbeat_interval_ms) * kNs;
  const std::int64_t settle = o_.thaw_ns + std::max<std::int64_t>(50 * kNs, 2 * hb_ns);
  const std::int64_t limit = o_.thaw_ns + static_cast<std::int64_t>(t_.ttl_ms + 2000) * kNs;
  for (;;) {
    const std::int64_t now = now_ns();
    const std::int64_t death = monitor_->death_ns();
    if (now >= settle) {
      if (death != 0 &&
          (contender_->granted() || now > death + static_cast<std::int64_t>(kGrantWaitAfterDeathMs) * kNs))
        break;
      if (death == 0) {
        const std::int64_t refreshed = monitor_->refreshed_after(o_.thaw_ns, static_cast<std::uint64_t>(o_.valid_until_ns));
        if (refreshed != 0 && now >= refreshed + 2 * hb_ns) break;
      }
    }
    if (now > limit) break;
    sleep_until(now_ns() + 2 * kNs);
  }
}

/// The observation's times and counters once the trial ended; reopens the clean windows.
void Trial::collect(const StatsSnapshot& s1) {
  o_.end_ns = now_ns();
  o_.death_ns = monitor_->death_ns();
  o_.revoked_ns = monitor_->revoked_ns();
  o_.refreshed_ns = monitor_->refreshed_after(o_.thaw_ns, static_cast<std::uint64_t>(o_.valid_until_ns));
  if (o_.death_ns != 0 && o_.refreshed_ns > o_.death_ns) o_.refreshed_ns = 0;
  contender_->stop();
  o_.grant_send_ns = contender_->grant_send_ns();
  o_.grant_recv_ns = contender_->grant_recv_ns();
  o_.last_deny_send_ns = contender_->last_deny_send_ns();
  const StatsSnapshot s2 = snap_stats(r_.table_);
  r_.lateness_from_ = s2;  // the next clean windows start after this trial's recovery
  r_.rtt_from_ = s2;
  if (const auto after = r_.status_counters(); after && before_) {
    o_.kills_deadline = after->kills_deadline - before_->kills_deadline;
    o_.recovery_answers = (after->lost - before_->lost) + (after->unknown - before_->unknown);
  }
  // The supervisor's own record of the kill: its rt thread adds (confirmed − deadline) to the
  // kill-latency histogram, and the deadline of a deadline kill is the slot's valid_until.
  const pp::HistogramSnapshot kd = pp::histogram_delta(s1.kill, s2.kill);
  if (kd.count == 1 && o_.kills_deadline == 1 && o_.valid_until_ns != 0)
    o_.sup_confirmed_ns = o_.valid_until_ns + static_cast<std::int64_t>(kd.sum);
}

/// Ends the trial's sandbox whatever happened (kill request, then wait for its death), and
/// releases the contender's grant.
void Trial::end_sandbox() {
  if (contender_) contender_->stop();
  if (monitor_ && monitor_->death_ns() == 0) {
    (void)r_.target_.request({{"op", "kill"}, {"sandbox", sandbox_}, {"grace_ms", 0}}, milliseconds(5'000));
    const std::int64_t until = now_ns() + static_cast<std::int64_t>(kDeathWaitMs) * kNs;
    while (monitor_->death_ns() == 0 && now_ns() < until) ::usleep(2000);
  }
  if (contender_) contender_->release();
  monitor_.reset();
}

/// The sandbox's log, closed by its last-accept record (a SIGKILL leaves the last interval open).
void Trial::read_log(pp::SandboxLog& log, bool& have_log) {
  auto parsed = pp::parse_sandbox_log(slurp(log_path_));
  if (!parsed) {
    if (o_.error.empty()) o_.error = log_path_ + ": " + parsed.message();
    return;
  }
  log = std::move(*parsed);
  have_log = true;
  const std::string beacon = slurp(log_path_ + ".last", 64);
  std::int64_t last_accept = 0;
  if (beacon.size() >= sizeof last_accept) std::memcpy(&last_accept, beacon.data(), sizeof last_accept);
  if (last_accept != 0 && !pp::close_open_interval(log, last_accept) && o_.error.empty())
    o_.error = "sandbox log " + log_path_ + ": its last-accept record contradicts the log";
}

pp::TrialObservation Trial::run(pp::SandboxLog& log, bool& have_log) {
  if (!start_sandbox()) return o_;
  try {
    if (!o_.error.empty()) throw std::runtime_error(o_.error);
    contender_ = std::make_unique<Contender>(r_.target_.lockd, r_.target_.key, name_,
                                             static_cast<std::int64_t>(r_.settings_.contend_interval_ms) * kNs,
                                             r_.priority_);
    settle();
    shower_.emplace(r_.target_.lockd, r_.target_.key, WorkerId{}, 500'000'000);
    const StatsSnapshot s1 = snap_stats(r_.table_);
    r_.close_rtt_window(s1);
    position();
    freeze_for_pause();
    observe();
    collect(s1);
  } catch (const Interrupted&) {
    // Thaw first: everything after this needs the supervisor (the kill request, the release).
    if (const Status thawed = r_.freezer_.thaw_if_frozen(); !thawed.ok())
      std::fprintf(stderr, "leasehold pause-probe: warning: cannot thaw the supervisor: %s\n", thawed.message().c_str());
    if (r_.target_.relay != nullptr) r_.target_.relay->cut(false);
    expiry_reader_.join();
    end_sandbox();
    throw;
  } catch (const std::exception& e) {
    if (const Status thawed = r_.freezer_.thaw_if_frozen(); !thawed.ok())
      o_.error = std::string("thaw: ") + thawed.message() + "; ";
    if (r_.target_.relay != nullptr) r_.target_.relay->cut(false);
    expiry_reader_.join();
    o_.error += e.what();
  }
  end_sandbox();
  read_log(log, have_log);
  return o_;
}

TrialRunner::TrialRunner(TrialTarget target, TrialSettings settings, Freezer& freezer, const shm::TableReader& table,
                         ObserverPriority& priority)
    : target_(std::move(target)),
      settings_(std::move(settings)),
      freezer_(freezer),
      table_(table),
      priority_(priority),
      rng_(settings_.seed != 0 ? settings_.seed : static_cast<std::uint64_t>(now_ns())),
      guard_ms_(settings_.guard_ms) {
  lateness_from_ = snap_stats(table_);
  rtt_from_ = lateness_from_;
}

pp::TrialObservation TrialRunner::run(std::size_t index, std::uint64_t pause_ms, pp::SandboxLog& log, bool& have_log) {
  Trial trial(*this, index, pause_ms);
  return trial.run(log, have_log);
}

std::optional<StatusCounters> TrialRunner::status_counters() {
  auto st = target_.request({{"op", "status"}}, milliseconds(5'000));
  if (!st || !st->value("ok", false)) return std::nullopt;
  const auto& c = (*st)["counters"];
  return StatusCounters{c.value("kills_deadline", 0ull), c.value("lost", 0ull), c.value("unknown", 0ull)};
}

void TrialRunner::close_lateness_window(const StatsSnapshot& now) {
  if (lateness_from_) pp::histogram_add(clean_lateness_, pp::histogram_delta(lateness_from_->lateness, now.lateness));
  lateness_from_.reset();
}

void TrialRunner::close_rtt_window(const StatsSnapshot& now) {
  if (rtt_from_) pp::histogram_add(clean_rtt_, pp::histogram_delta(rtt_from_->rtt, now.rtt));
  rtt_from_.reset();
}

void TrialRunner::judge(pause::SweepReport& rep, bool interrupted, std::size_t planned) const {
  rep.measured.rt_lateness = clean_lateness_;
  rep.measured.heartbeat_rtt = clean_rtt_;
  pause::finish_measured(rep.measured, target_.timing);
  rep.verdict = pause::sweep_verdict(rep.observations, rep.results, target_.timing);
  if (interrupted) rep.verdict = pause::interrupted_verdict(rep.verdict, planned);
}

void TrialRunner::close_windows() {
  const StatsSnapshot last = snap_stats(table_);
  close_lateness_window(last);
  close_rtt_window(last);
}

Status TrialRunner::baseline(std::uint64_t ms) {
  const std::string name = "pause-probe." + settings_.tag + ".baseline";
  nlohmann::json argv = target_.sandbox_argv;
  for (const std::string& w : {std::string("--log"), settings_.log_dir + "/sandbox-baseline.log",
                               std::string("--lifetime-ms"), std::to_string(ms + 30'000)})
    argv.push_back(w);
  const nlohmann::json env = sandbox_env();
  auto ans = target_.request({{"op", "run"}, {"name", name}, {"argv", argv}, {"env", env}}, milliseconds(15'000));
  if (!ans) return ans.status();
  if (!ans->value("ok", false)) return Status{Errc::refused, ans->value("message", std::string("run refused"))};
  sleep_until_ns(now_ns() + static_cast<std::int64_t>(ms) * kNs, settings_.tick);
  (void)target_.request({{"op", "release"}, {"name", name}, {"grace_ms", 0}}, milliseconds(5'000));
  return {};
}

bool TrialRunner::sweep(const std::vector<std::uint64_t>& plan, std::int64_t budget_ns, pp::SweepReport& rep,
                        const std::function<void(const std::string&)>& progress) {
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const std::uint64_t p = plan[i];
    const bool under = static_cast<std::int64_t>(p) * kNs < budget_ns;
    progress("[" + std::to_string(i + 1) + "/" + std::to_string(plan.size()) + "] pause " + std::to_string(p) + " ms (" +
             (under ? "under" : "past") + " the budget) ... ");
    pp::SandboxLog log;
    bool have_log = false;
    pp::TrialObservation o;
    pp::TrialResult res;
    // The deadline wheel may fire a kill early (it rounds down, DESIGN.md "Time"), before a
    // worst-phase freeze took hold; such a trial says nothing about the pause, so it is run
    // again with the freeze started earlier (bounded: kPauseMissedRetriesMax).
    guard_ms_ = settings_.guard_ms;
    try {
      for (std::uint32_t attempt = 0;; ++attempt) {
        log = {};
        have_log = false;
        o = run(i * (kPauseMissedRetriesMax + 1) + attempt, p, log, have_log);
        res = pp::classify(o, have_log ? &log : nullptr, target_.timing);
        if (!res.pause_missed || settings_.phase != pp::Phase::worst || attempt == kPauseMissedRetriesMax) break;
        guard_ms_ = std::min(guard_ms_ * 4 + 1, target_.timing.kill_after_ms / 2);
        progress("killed before the freeze took hold; again with the freeze " + std::to_string(guard_ms_) +
                 " ms before valid_until ... ");
      }
    } catch (const Interrupted&) {
      progress("interrupted\n");
      return true;
    }
    progress(pp::trial_summary(res) + "\n");
    pp::add_kill_latency(rep.measured, o, res);
    rep.observations.push_back(std::move(o));
    rep.results.push_back(std::move(res));
  }
  return false;
}

}  // namespace leasehold::harness
