// `leasehold demo`: the end-to-end scenario on real processes (README "demo").
//
// Starts leasehold-lockd (embedded SQLite store, generated key, temp dir) and two
// leasehold-supervisors - each in its own network namespace linked to lockd's by a veth pair
// where the machine allows it, otherwise on loopback with a packet filter - and runs a named
// "agent" sandbox (`leasehold agent`) that appends to a fenced SQLite resource every few
// milliseconds, checking its shm slot before each write. The scenario is the table kSteps,
// {label, title, act, verify}, whose numbered titles begin the README's list ("What the demo
// shows"; `leasehold demo --list-steps` prints it and a test compares the two):
//   1. the same name on worker 2 is refused, naming the holder and the epoch;
//   2. worker 1 is cut off from lockd: its kill-switch fires before lockd's lease expiry
//      (the margin is printed);
//   3. worker 2 acquires the name at epoch+1 and the agent continues there;
//   4. a write with the old token is replayed, and one with a made-up epoch: both rejected;
//   5. a graceful transfer back to worker 1 (reconnected first): the resource is told the new
//      epoch at the start, so no write is accepted during the transfer.
// It ends with the audit (writes per epoch, overlap and order checks, rejected writes) and a
// timeline, and exits non-zero if any check failed. Everything it started - processes,
// namespaces, veth pairs, filter rules, the temp dir - is removed on every exit path,
// including Ctrl-C, SIGTERM and SIGHUP (a closed terminal); it then exits 128+signal.
// Checks that wait for the agent allow for a loaded machine: they wait for a number of writes,
// with a deadline that grows with the load average, rather than for a fixed time.
#include "tools/cmd_common.hpp"
#include "tools/cmd_demo_env.hpp"

#include "leasehold/harness/deployment.hpp"
#include "leasehold/harness/network.hpp"
#include "leasehold/harness/process.hpp"

#include "leasehold/wire/auth.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/resource/fenced_store.hpp"
#include "leasehold/shm/table.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

namespace leasehold::cli {
namespace {

using namespace demo;
namespace fs = std::filesystem;
using harness::pidfd_open;
using harness::slurp;
using Network = harness::Network;

constexpr const char* kWorker[2] = {"worker 1", "worker 2"};

struct DemoArgs {
  bool fast = false;
  bool keep = false;
  bool json = false;
  std::string network = "auto";
  std::string name = "orders";
  std::string lockd_bin;
  std::string supervisor_bin;
  bool old_holder_releases_first = false;  ///< (tests) force the race handled in step 5
  bool list_steps = false;
};

/// Timing of one run. The supervisor's start-up check enforces
/// kill_after·(1+ρ) + granularity + kill budget < ttl·(1−ρ) (DESIGN.md "Time").
struct Timing {
  std::uint64_t ttl_ms;
  std::uint64_t kill_after_ms;
  std::uint64_t heartbeat_ms;
  std::uint64_t agent_interval_ms;
  std::uint64_t hold_ms;  ///< how long each holder writes before the next step
};
constexpr Timing kNormal{3000, 1800, 300, 5, 1500};
constexpr Timing kFast{1500, 900, 150, 5, 500};
/// Start-up bounds (generous: CI runs the debug build under ASan on 2 shared cores).
constexpr std::uint64_t kStartTimeoutMs = 30'000;
/// The demo's own requests to lockd (show, transfer): deadline per request, retries inside.
constexpr std::uint64_t kDemoLockdTimeoutMs = 2'000;
/// Longest wait for an agent's first write at a new epoch, on an idle machine (scaled by
/// load_factor()).
constexpr std::uint64_t kFirstWriteTimeoutMs = 10'000;
/// "The agent keeps writing": at least hold_ms / interval / kKeepWritingDivisor writes, spanning
/// at least hold_ms / 2, within kKeepWritingSlack × hold_ms × load_factor() of its first one.
constexpr std::uint64_t kKeepWritingDivisor = 4;
constexpr std::uint64_t kKeepWritingSlack = 4;
/// Upper bound of load_factor().
constexpr double kLoadFactorMax = 8.0;
/// How often the demo checkpoints the resource's write-ahead log while it waits (the agents
/// leave checkpoints to it, so their writes never pause for that I/O).
constexpr std::int64_t kCheckpointEveryNs = 200'000'000;

/// How much slower than idle this machine is likely to run the scenario: the 1-minute load
/// average per online CPU, at least 1 and at most kLoadFactorMax.
double load_factor() {
  double load1 = 0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::clamp(load1 / static_cast<double>(cpus > 0 ? cpus : 1), 1.0, kLoadFactorMax);
}

struct Abort {
  std::string why;
  bool cannot_run_here = false;  ///< the machine lacks what the scenario needs (exit kDemoCannotRun)
};
/// Exit code when the machine can neither make network namespaces nor filter packets, so a
/// worker cannot be cut off (CTest treats it as "skipped", see tests/tools/CMakeLists.txt).
constexpr int kDemoCannotRun = 77;

// Worker i's sandbox uid range (root): 4096 uids (its 1024 slots fit) in a block of this demo's
// own, from its pid, so demos running at once do not overlap either.
std::string demo_uid_range(int i) {
  const std::uint64_t block = static_cast<std::uint64_t>(::getpid() % 100'000) * 2 + static_cast<std::uint64_t>(i);
  return std::to_string(1'000'000 + block * 4096) + ":4096";
}

/// The value of `key=` in a logfmt line ("" if absent).
std::string field(const std::string& line, const std::string& key) {
  const std::string k = key + "=";
  std::size_t p = 0;
  while ((p = line.find(k, p)) != std::string::npos) {
    if (p == 0 || line[p - 1] == ' ') {
      const std::size_t s = p + k.size();
      return line.substr(s, line.find(' ', s) - s);
    }
    p += k.size();
  }
  return "";
}

/// The first line of `path` that contains every needle.
std::string find_line(const fs::path& path, std::initializer_list<std::string> needles) {
  std::stringstream ss(slurp(path));
  std::string line;
  while (std::getline(ss, line)) {
    bool all = true;
    for (const auto& n : needles) all = all && line.find(n) != std::string::npos;
    if (all) return line;
  }
  return "";
}

bool exited(int pidfd) { return harness::pidfd_exited(pidfd); }

/// Waits until the pidfd is readable (process exited); returns the boottime then, or -1.
std::int64_t wait_exit(int pidfd, std::uint64_t timeout_ms) {
  return harness::wait_pidfd_exit(pidfd, std::chrono::milliseconds(timeout_ms), check_interrupted);
}

/// True once lockd answers a `stats` request sent from inside network namespace `netns` (""
/// = ours) to `addr`: the path a worker uses, neighbour resolution included. Runs in a forked
/// child, since only a single-threaded process should switch namespaces.
bool lockd_answers_from(const std::string& netns, const SocketAddress& addr, const std::string& key_path,
                        std::int64_t timeout_ms) {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (!netns.empty()) {
      const int fd = ::open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) ::_exit(2);
    }
    wire::KeyLoad key = wire::load_key_file(key_path);
    if (!key) ::_exit(2);
    lockd::AdminClient c(addr, *key, WorkerId{}, timeout_ms * 1'000'000);
    ::_exit(c.stats().ok() ? 0 : 1);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// ---- the run ----------------------------------------------------------------------------------

/// Everything the demo starts; the destructor removes it all.
struct World {
  std::string tmp;
  bool keep = false;
  Network net;
  /// lockd and the two supervisors (supervisor(i) is worker i+1), keys and logs below `tmp`.
  std::optional<harness::Deployment> dep;
  bool lockd_started = false;  ///< lockd was spawned (it may have exited since)
  std::vector<int> pidfds;     ///< agents: SIGKILLed at the end if still there
  bool torn_down = false;

  harness::Process& sup(int i) { return dep->supervisor(static_cast<std::size_t>(i)); }
  bool has_sup(int i) const { return dep && dep->supervisors() > static_cast<std::size_t>(i); }

  std::string teardown() {
    if (torn_down) return "";
    torn_down = true;
    std::vector<std::string> done;
    // A worker still cut off would spend its shutdown trying to release its name to a lockd it
    // cannot reach: restore its link first (what it records then is also the truth).
    const bool had_filter = net.mode == Network::Mode::loopback && (net.cut[0] || net.cut[1]);
    for (int i = 0; i < 2; ++i)
      if (const Status r = net.reconnect(i); !r.ok()) done.push_back("(worker " + std::to_string(i + 1) + " stayed cut off: " + r.message() + ")");
    if (dep) {
      // Supervisors first (they release their names while lockd still runs), last started first.
      for (std::size_t i = dep->supervisors(); i-- > 0;) {
        dep->supervisor(i).terminate(std::chrono::milliseconds(5000));
        done.push_back("supervisor " + std::to_string(i + 1));
      }
      if (lockd_started) {
        dep->stop_lockd(std::chrono::milliseconds(5000));
        done.push_back("lockd");
      }
      dep.reset();
    }
    int agents = 0;
    for (int fd : pidfds) {
      if (::syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0) == 0) ++agents;
      ::close(fd);
    }
    pidfds.clear();
    if (agents > 0) done.push_back(std::to_string(agents) + " leftover agent(s)");
    const bool had_netns = net.mode == Network::Mode::netns;
    net.teardown();
    if (had_netns) done.push_back("2 network namespaces and their veth pairs");
    if (had_filter) done.push_back("packet filter rules");
    if (!tmp.empty()) {
      if (keep) {
        done.push_back("kept " + tmp);
      } else {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        done.push_back("temp dir " + tmp);
      }
    }
    std::string s;
    for (const auto& d : done) s += (s.empty() ? "" : ", ") + d;
    return s;
  }
  ~World() { teardown(); }
};

class Demo;

/// One step of the scenario as the README lists it ("What the demo shows"): `act` drives the
/// processes and records what happened, `verify` checks it (nullptr: the step sets up the
/// next ones and checks nothing itself). An error in either stops the run (Abort).
struct Step {
  const char* label;  ///< "set-up", "1" .. "5", "end"
  const char* title;  ///< the README's words for it (numbered steps: its list item begins so)
  void (Demo::*act)();
  void (Demo::*verify)();
};

class Demo {
 public:
  explicit Demo(const DemoArgs& a) : args_(a), t_(a.fast ? kFast : kNormal), t0_(boottime_ns()) {
    out_ = a.json ? stderr : stdout;
  }
  int run();

  // The steps, in order (kSteps below).
  void set_up();
  void start_agent();
  void start_again_act();
  void start_again_verify();
  void cut_off_act();
  void cut_off_verify();
  void take_over_act();
  void take_over_verify();
  void replay_act();
  void replay_verify();
  void transfer_act();
  void transfer_verify();
  void end_act();
  void end_verify();

 private:
  void body();
  // output
  std::string at(std::int64_t t_ns) const {
    char b[32];
    std::snprintf(b, sizeof b, "+%.3f s", static_cast<double>(t_ns - t0_) / 1e9);
    return b;
  }
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void detail(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  void event(std::int64_t t_ns, std::string what) { timeline_.push_back({t_ns, std::move(what)}); }
  bool check(bool ok, const std::string& what) {
    std::fprintf(out_, "             [%s] %s\n", ok ? "ok" : "FAIL", what.c_str());
    std::fflush(out_);
    checks_.push_back({ok, what});
    if (!ok) ++failures_;
    return ok;
  }
  [[noreturn]] void abort(const std::string& why) { throw Abort{why}; }

  // the pieces
  std::optional<nlohmann::json> control(int w, const nlohmann::json& req, Failure& f) {
    SupervisorFlags sf;
    sf.socket = sock_[w];
    sf.timeout_ms = 15'000;
    return supervisor_call(sf, req, f);
  }
  nlohmann::json agent_request(bool named) const {
    nlohmann::json req = {{"v", 1},
                          {"op", "run"},
                          {"argv",
                           {self_, "agent", "--db", db_path_, "--name", args_.name, "--interval-ms",
                            std::to_string(t_.agent_interval_ms), "--max-seconds", "120", "--checkpoint-pages",
                            "0", "--public-key", public_key_path_}},
                          {"env", {{"PATH", "/usr/bin:/bin"}}}};
    if (named) req["name"] = args_.name;
    return req;
  }
  /// The started sandbox's pidfd (-1 if it has none), killed at teardown if still there.
  int watch_agent(const nlohmann::json& started, int worker) {
    const int fd = pidfd_open(started.value("pid", -1));
    if (fd >= 0) world_.pidfds.push_back(fd);
    sandbox_worker_[started.value("sandbox", std::string())] = worker;
    return fd;
  }
  /// Waits for the first accepted write at `epoch`; returns its time.
  std::int64_t first_write(Epoch epoch) {
    const auto timeout_ms = static_cast<std::int64_t>(static_cast<double>(kFirstWriteTimeoutMs) * load_factor());
    const std::int64_t deadline = boottime_ns() + timeout_ms * 1'000'000;
    while (boottime_ns() < deadline) {
      check_interrupted();
      const auto t = store_->tally(args_.name, epoch, resource::Verdict::accepted);
      if (t.rows > 0) return t.first_ns;
      maintain();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    abort("no write at epoch " + std::to_string(epoch) + " reached the resource within " +
          std::to_string(timeout_ms) + " ms (agent output is in the supervisor logs)");
  }
  void hold(std::uint64_t ms) {
    const std::int64_t until = boottime_ns() + static_cast<std::int64_t>(ms) * 1'000'000;
    while (boottime_ns() < until) {
      check_interrupted();
      maintain();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  /// While waiting: checkpoint the resource's write-ahead log now and then (the agents do not).
  void maintain() {
    const std::int64_t now = boottime_ns();
    if (store_ == nullptr || now - last_checkpoint_ns_ < kCheckpointEveryNs) return;
    last_checkpoint_ns_ = now;
    store_->checkpoint();
  }
  /// The first line of supervisor `worker`'s log with every needle, waiting up to ~1 s for it.
  std::string await_sup_line(int worker, std::initializer_list<std::string> needles) {
    std::string line;
    for (int tries = 0; tries < 100 && line.empty(); ++tries) {
      line = find_line(world_.sup(worker).stdout_path(), needles);
      if (line.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return line;
  }
  /// "refused: <deny>" for a Deny, "lockd at ADDR is unreachable: ..." for no answer, else the
  /// error: what an answer without the wanted body means.
  std::string lockd_problem(const lockd::Answer& ans, const std::string& what) const {
    if (const auto* d = ans.as<wire::Deny>()) return what + " refused: " + deny_failure(*d, args_.name).message;
    LockdFlags lf;
    lf.lockd = SocketAddress::loopback_v4(port_).str();
    lf.key_file = key_path_;
    lf.timeout_ms = kDemoLockdTimeoutMs;
    return answer_failure(ans, lf, what).message;
  }
  /// The agent's own account of itself in a worker's log: its last `lines` lines.
  std::string agent_lines(int worker, std::size_t lines) {
    std::stringstream ss(slurp(world_.has_sup(worker) ? world_.sup(worker).stdout_path() : fs::path()));
    std::vector<std::string> found;
    for (std::string line; std::getline(ss, line);)
      if (line.rfind("agent ", 0) == 0) found.push_back(line);
    std::string out;
    for (std::size_t i = found.size() > lines ? found.size() - lines : 0; i < found.size(); ++i)
      out += "\n               " + found[i];
    return out;
  }
  std::string who(const std::string& sandbox) const {
    auto it = sandbox_worker_.find(sandbox);
    return sandbox.substr(0, 8) + (it != sandbox_worker_.end() ? std::string(" (") + kWorker[it->second] + ")" : "");
  }
  /// The resource's audit rows for the demo's name; a failed read stops the demo.
  std::vector<resource::AuditRow> audit_rows() {
    auto read = store_->audit(args_.name, resource::kAuditRowsMax);
    if (!read) abort(read.message());
    return std::move(read).value();
  }
  void print_timeline();
  nlohmann::json summary_json(int rc, int stopped_by, double took_s) const;

  DemoArgs args_;
  Timing t_;
  std::int64_t t0_;
  FILE* out_;
  World world_;
  std::string self_, db_path_, sock_[2], shm_[2], key_path_, worker_key_[2];
  WorkerId worker_id_[2];  ///< the supervisors' worker ids (a transfer's reservation names one)
  std::uint16_t port_ = 0;
  std::unique_ptr<lockd::AdminClient> admin_;
  std::shared_ptr<token::TokenVerifier> verifier_ = std::make_shared<token::TokenVerifier>();
  std::string public_key_path_;  // lockd's token public key, where the sandboxes read it
  std::unique_ptr<resource::FencedStore> store_;
  std::map<std::string, int> sandbox_worker_;
  std::int64_t last_checkpoint_ns_ = 0;
  std::optional<resource::AuditReport> audit_;  // once the audit ran
  bool network_ready_ = false;
  struct Event {
    std::int64_t t_ns;
    std::string what;
  };
  std::vector<Event> timeline_;
  struct Check {
    bool ok;
    std::string what;
  };
  std::vector<Check> checks_;
  int failures_ = 0;
  Failure f_;  ///< the last control call's failure
  /// Steps begun: how long each took (-1: it stopped at an error or a signal) and whether its
  /// checks held. Index = position in kSteps.
  struct StepRun {
    std::int64_t took_ns = -1;
    bool ok = false;
  };
  std::vector<StepRun> runs_;

  // What the steps found (0 / unset: that step did not get there); the later steps and the
  // summary read them.
  Epoch e1_ = 0, e2_ = 0, e3_ = 0;
  // set-up: the agent on worker 1
  std::string sb1_;
  std::uint32_t slot1_ = 0;
  int pidfd1_ = -1;
  // 1: the second start's answer
  nlohmann::json dup_;
  // 2: lockd's expiry of epoch e1, the kill, the agent gone
  std::int64_t expiry_ns_ = 0, kill_ns_ = 0, dead_ns_ = 0;
  std::optional<std::int64_t> margin_ns_;
  // 3: the agent on worker 2
  std::string sb2_;
  int pidfd2_ = -1;
  // 4: the replayed and the made-up write
  resource::WriteResult replay_, forged_;
  // 5: the transfer back to worker 1
  std::string sb3_;
  int pidfd3_ = -1;
  bool reassigned_ = false;  ///< the old holder released first: a Reassign, not a transfer
  Epoch fence_epoch_ = 0, named_epoch_ = 0;
  std::int64_t transfer_fence_ns_ = 0, transfer_first_write_ns_ = 0;
  std::uint64_t writes_during_transfer_ = 0;
  std::string keeps_writing_;  ///< the check's text, with the numbers
  bool keeps_writing_ok_ = false;
  // end
  bool released_ = false;
};

constexpr Step kSteps[] = {
    {"set-up", "lockd and two supervisors start, and a named agent writes to the fenced resource on worker 1",
     &Demo::set_up, nullptr},
    {"1", "the same name is started on worker 2: refused, naming the holder and its epoch", &Demo::start_again_act,
     &Demo::start_again_verify},
    {"2", "worker 1 is cut off from lockd: its kill-switch fires before lockd's lease expires", &Demo::cut_off_act,
     &Demo::cut_off_verify},
    {"3", "worker 2 acquires the name at epoch + 1 once lockd's lease has expired", &Demo::take_over_act,
     &Demo::take_over_verify},
    {"4", "the old holder's last write is replayed with its old token: the resource rejects it",
     &Demo::replay_act, &Demo::replay_verify},
    {"5", "worker 1 is reconnected and the name is transferred back gracefully", &Demo::transfer_act,
     &Demo::transfer_verify},
    {"end", "the holder releases the name, and the resource's audit is checked", &Demo::end_act,
     &Demo::end_verify},
};

void Demo::say(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(out_, "[%10s] %s\n", at(boottime_ns()).c_str(), buf);
  std::fflush(out_);
}

void Demo::detail(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(out_, "             %s\n", buf);
  std::fflush(out_);
}

int Demo::run() {
  SignalGuard guard;
  int rc = kOk;
  int stopped_by = 0;     // the signal that interrupted the run
  bool aborted = false;   // stopped at an error before the end
  try {
    body();
  } catch (const Interrupted& i) {
    stopped_by = i.signal;
    std::fprintf(out_, "\ninterrupted by %s: stopping everything the demo started\n", signal_name(i.signal).c_str());
    rc = 128 + i.signal;
  } catch (const Abort& a) {
    if (a.cannot_run_here) {
      std::fprintf(out_, "\nNOT RUN: %s\n", a.why.c_str());
      rc = kDemoCannotRun;
    } else {
      std::fprintf(out_, "\nFAILED: %s\n", a.why.c_str());
      aborted = true;
    }
  } catch (const std::exception& e) {
    std::fprintf(out_, "\nFAILED (unexpected error): %s\n", e.what());
    aborted = true;
  }
  store_.reset();
  admin_.reset();
  const std::string cleaned = world_.teardown();
  if (!cleaned.empty()) std::fprintf(out_, "cleaned up: %s\n", cleaned.c_str());
  const double took_s = static_cast<double>(boottime_ns() - t0_) / 1e9;
  if (rc == kOk) {
    if (aborted)
      std::fprintf(out_, "\ndemo FAILED: stopped at the error above after %zu checks (%d failed), %.1f s\n",
                   checks_.size(), failures_, took_s);
    else if (failures_ == 0)
      std::fprintf(out_, "\ndemo passed: %zu checks held, %.1f s\n", checks_.size(), took_s);
    else
      std::fprintf(out_, "\ndemo FAILED: %d of %zu checks failed (%.1f s)\n", failures_, checks_.size(), took_s);
    rc = failures_ == 0 && !aborted ? kOk : kFailure;
  }
  if (args_.json) std::printf("%s\n", summary_json(rc, stopped_by, took_s).dump().c_str());
  std::fflush(stdout);
  return rc;
}

nlohmann::json Demo::summary_json(int rc, int stopped_by, double took_s) const {
  auto ms_since_start = [this](std::int64_t t_ns) { return (t_ns - t0_) / 1'000'000; };
  auto epoch_or_null = [](Epoch e) { return e == 0 ? nlohmann::json(nullptr) : nlohmann::json(e); };
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : checks_) checks.push_back({{"ok", c.ok}, {"what", c.what}});
  // Every step of the table: null where it did not finish (or never began).
  nlohmann::json steps = nlohmann::json::array();
  for (std::size_t i = 0; i < std::size(kSteps); ++i) {
    const bool finished = i < runs_.size() && runs_[i].took_ns >= 0;
    steps.push_back({{"step", kSteps[i].label},
                     {"title", kSteps[i].title},
                     {"ran", i < runs_.size()},
                     {"ok", finished ? nlohmann::json(runs_[i].ok) : nlohmann::json(nullptr)},
                     {"took_ms", finished ? nlohmann::json(static_cast<double>(runs_[i].took_ns) / 1e6)
                                          : nlohmann::json(nullptr)}});
  }
  nlohmann::json tl = nlohmann::json::array();
  for (const auto& e : timeline_) tl.push_back({{"t_ms", ms_since_start(e.t_ns)}, {"event", e.what}});
  // The audit of the resource, as printed at the end; null when the run stopped before it.
  nlohmann::json audit = nullptr;
  if (audit_) {
    nlohmann::json epochs = nlohmann::json::array();
    for (const auto& e : audit_->epochs) {
      nlohmann::json holders = nlohmann::json::array();
      for (const auto& h : e.holders) holders.push_back(h);
      epochs.push_back({{"epoch", e.epoch},
                        {"holder", e.holders.size() == 1 ? nlohmann::json(e.holders[0]) : nlohmann::json(nullptr)},
                        {"holders", holders},
                        {"worker", e.holders.size() == 1 && sandbox_worker_.count(e.holders[0])
                                       ? nlohmann::json(sandbox_worker_.at(e.holders[0]) + 1)
                                       : nlohmann::json(nullptr)},
                        {"accepted", e.accepted},
                        {"stale", e.rejected},
                        {"first_ms", e.accepted ? nlohmann::json(ms_since_start(e.first_ns)) : nlohmann::json(nullptr)},
                        {"last_ms", e.accepted ? nlohmann::json(ms_since_start(e.last_ns)) : nlohmann::json(nullptr)}});
    }
    nlohmann::json rejected = nlohmann::json::array();
    for (const auto& r : audit_->rejected_rows)
      rejected.push_back({{"t_ms", ms_since_start(r.time_ns)},
                          {"epoch", r.epoch},
                          {"holder", r.holder},
                          {"verdict", std::string(resource::to_string(r.verdict))},
                          {"reason", r.reason},
                          {"payload", r.payload}});
    audit = {{"accepted", audit_->accepted}, {"rejected", audit_->rejected}, {"fences", audit_->fences},
             {"epochs", epochs},           {"rejected_writes", rejected},  {"violations", audit_->violations}};
  }
  return {{"passed", rc == kOk},
          {"exit_code", rc},
          {"interrupted", stopped_by != 0},
          {"signal", stopped_by != 0 ? nlohmann::json(signal_name(stopped_by)) : nlohmann::json(nullptr)},
          {"seconds", took_s},
          {"network", !network_ready_ ? nlohmann::json(nullptr)
                                      : nlohmann::json(world_.net.mode == Network::Mode::netns ? "netns" : "loopback")},
          {"epochs", {epoch_or_null(e1_), epoch_or_null(e2_), epoch_or_null(e3_)}},
          {"kill_margin_ms", margin_ns_ ? nlohmann::json(static_cast<double>(*margin_ns_) / 1e6) : nlohmann::json(nullptr)},
          {"steps", steps},
          {"checks", checks},
          {"audit", audit},
          {"timeline", tl}};
}

void Demo::body() {
  std::fprintf(out_,
               "leasehold demo: a named agent, two workers, a fenced SQLite resource%s\n"
               "  lease TTL %llu ms, kill-switch after %llu ms without an acknowledged heartbeat, "
               "heartbeat every %llu ms,\n  agent writes every %llu ms. Times are CLOCK_BOOTTIME offsets "
               "from the start.\n",
               args_.fast ? " (--fast)" : "", static_cast<unsigned long long>(t_.ttl_ms),
               static_cast<unsigned long long>(t_.kill_after_ms), static_cast<unsigned long long>(t_.heartbeat_ms),
               static_cast<unsigned long long>(t_.agent_interval_ms));
  Failure f;
  if (!check_new_name(args_.name, f)) abort(f.message);
  for (const Step& step : kSteps) {
    const bool numbered = std::isdigit(static_cast<unsigned char>(step.label[0])) != 0;
    std::fprintf(out_, "\n%s%s: %s\n", numbered ? "step " : "", step.label, step.title);
    runs_.emplace_back();
    const std::int64_t begun = boottime_ns();
    const int failures_before = failures_;
    (this->*step.act)();
    if (step.verify != nullptr) (this->*step.verify)();
    runs_.back() = {boottime_ns() - begun, failures_ == failures_before};
  }
  print_timeline();
}

// ---- set-up: lockd, two supervisors, the agent on worker 1 -----------------------------------

void Demo::set_up() {
  self_ = self_exe();
  const std::string lockd_bin = locate_service(args_.lockd_bin, "leasehold-lockd", "lockd");
  const std::string sup_bin = locate_service(args_.supervisor_bin, "leasehold-supervisor", "supervisor");
  if (lockd_bin.empty() || sup_bin.empty())
    abort(std::string("cannot find ") + (lockd_bin.empty() ? "leasehold-lockd" : "leasehold-supervisor") +
          " next to " + self_ + " (build tree or install dir) or on PATH; build them "
          "(cmake --build --preset release) or pass --lockd-bin / --supervisor-bin");
  char tmpl[] = "/tmp/leasehold-demo.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) abort(std::string("mkdtemp: ") + std::strerror(errno));
  world_.tmp = tmpl;
  world_.keep = args_.keep;
  world_.dep.emplace(world_.tmp);
  harness::Deployment& dep = *world_.dep;
  if (const Status e = dep.make_cluster_key(); !e.ok()) abort(e.message());
  key_path_ = dep.cluster_key_file().string();
  // Each supervisor holds only its own worker key, derived from the cluster key (which stays
  // with lockd and the demo's admin client), as `leasehold-lockd --derive-worker-key` does.
  for (int i = 0; i < 2; ++i) {
    const std::string file = "w" + std::to_string(i + 1) + ".key";
    worker_key_[i] = world_.tmp + "/" + file;
    worker_id_[i] = random_worker_id();
    if (const Status e = dep.make_worker_key(file, worker_id_[i]); !e.ok()) abort(e.message());
  }
  // The agents are isolated sandboxes running as unprivileged uids of their own: they may pass
  // through the temp dir (not read the key or lockd's store in it) and write the resource in
  // shared/, whose files any uid may write.
  ::chmod(world_.tmp.c_str(), 0711);
  const std::string shared = world_.tmp + "/shared";
  if (::mkdir(shared.c_str(), 0777) != 0 || ::chmod(shared.c_str(), 0777) != 0)
    abort("cannot create " + shared + ": " + std::strerror(errno));
  db_path_ = shared + "/resource.db";
  {
    resource::StoreOptions so;
    so.durable = false;
    so.verifier = verifier_;  // lockd's public key is added once lockd has written it
    auto opened = resource::FencedStore::open(db_path_, so);
    if (!opened) abort(opened.message());
    store_ = std::move(opened).value();
    for (const char* suffix : {"", "-wal", "-shm"}) ::chmod((db_path_ + suffix).c_str(), 0666);
  }

  const std::string tag = std::to_string(::getpid());
  world_.net.tick = check_interrupted;
  if (const Status e = world_.net.setup(args_.network, tag); !e.ok()) abort(e.message());
  network_ready_ = true;
  say("network: %s", world_.net.describe().c_str());
  if (world_.net.mode == Network::Mode::loopback) {
    detail("%s: %s", args_.network == "loopback" ? "not using network namespaces" : "falling back to loopback",
           world_.net.why.c_str());
    if (world_.net.filter.empty())
      throw Abort{"cannot cut a worker off lockd here: network namespaces unavailable (" + world_.net.why +
                      ") and no packet filter (nft or iptables, as root)",
                  true};
  }

  harness::LockdSpec ls;
  ls.bin = lockd_bin;
  ls.listen = world_.net.mode == Network::Mode::netns ? "0.0.0.0:0" : "127.0.0.1:0";
  ls.ttl_ms = t_.ttl_ms;
  ls.ready_timeout = std::chrono::milliseconds(kStartTimeoutMs);
  const harness::Started lockd = dep.start_lockd(ls, check_interrupted);
  world_.lockd_started = lockd.kind != harness::Started::Kind::cannot_start;
  if (lockd.kind == harness::Started::Kind::bad_output)
    abort(lockd_bin + " printed \"listening " + dep.lockd_text() + "\", not 'listening ADDR:PORT': is it leasehold-lockd?");
  if (!lockd.ok()) abort(lockd.error);
  port_ = dep.lockd_address().port();
  say("lockd listening on port %u (SQLite store %s/lockd.db, pid %d)", port_, world_.tmp.c_str(), dep.lockd().pid());
  {
    // lockd generated its token signing key beside its store; the resource (and the agent's
    // store) verify tokens with the public key alone, copied where the sandboxes can read it.
    const std::string pub = world_.tmp + "/lockd.db.signing.key.pub";
    public_key_path_ = shared + "/lockd-token.pub";
    std::error_code ec;
    std::filesystem::copy_file(pub, public_key_path_, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) abort("cannot copy lockd's public key " + pub + ": " + ec.message());
    ::chmod(public_key_path_.c_str(), 0644);
    if (const Status why = verifier_->add_public_key_file(public_key_path_); !why.ok()) abort(why.message());
    say("lockd signs every grant's fencing token (Ed25519, key id %s); the resource verifies them with the public key alone",
        token::key_id_text(verifier_->key_ids().front()).c_str());
  }
  event(boottime_ns(), "lockd up");
  admin_ = std::make_unique<lockd::AdminClient>(SocketAddress::loopback_v4(port_), *dep.key(), WorkerId{},
                                                static_cast<std::int64_t>(kDemoLockdTimeoutMs) * 1'000'000);
  for (int i = 0; i < 2; ++i) {
    const std::string w = "w" + std::to_string(i + 1);
    sock_[i] = world_.tmp + "/" + w + ".sock";
    shm_[i] = world_.tmp + "/" + w + ".table";
    harness::SupervisorSpec ss;
    ss.bin = sup_bin;
    ss.label = std::string("leasehold-supervisor (") + kWorker[i] + ")";
    ss.lockd = world_.net.lockd_address(i, port_);
    ss.key_file = worker_key_[i];
    ss.control_socket = sock_[i];
    ss.shm = shm_[i];
    ss.log = world_.tmp + "/" + w + ".log";
    ss.ttl_ms = t_.ttl_ms;
    ss.heartbeat_interval_ms = t_.heartbeat_ms;
    ss.kill_after_ms = t_.kill_after_ms;
    ss.netns = world_.net.netns[i];
    ss.ready_timeout = std::chrono::milliseconds(kStartTimeoutMs);
    ss.extra_args = {
        // Isolated sandboxes (the default); as root each worker's from its own uid range, so
        // the two workers' sandboxes never share a uid, nor those of another demo running now
        // (the supervisor refuses a range that overlaps a live one's).
        "--uid-range", demo_uid_range(i),
        // The agents' output stays with the rest of the run (removed with it, kept by --keep).
        "--sandbox-log-dir", world_.tmp + "/" + w + "-sandbox-logs"};
    if (const harness::Started s = dep.start_supervisor(ss, nullptr, check_interrupted); !s.ok()) abort(s.error);
    auto st = control(i, {{"v", 1}, {"op", "status"}}, f_);
    if (!st || !st->value("ok", false)) abort(std::string(kWorker[i]) + " status: " + (st ? st->dump() : f_.message));
    say("%s: supervisor pid %d%s%s, lockd at %s, kill mode %s", kWorker[i], world_.sup(i).pid(),
        world_.net.mode == Network::Mode::netns ? " in " : "", world_.net.netns[i].c_str(), ss.lockd.c_str(),
        st->value("cgroup", std::string("?")).c_str());
    detail("isolation %s", st->value("isolation_text", std::string("?")).c_str());
  }
  event(boottime_ns(), "supervisors up");
  start_agent();
}

void Demo::start_agent() {
  say("%s: leasehold run --name %s -- leasehold agent --db resource.db ...", kWorker[0], args_.name.c_str());
  auto a1 = control(0, agent_request(true), f_);
  if (!a1) abort(f_.message);
  if (!a1->value("ok", false)) abort(supervisor_failure(*a1, "run on worker 1").message);
  sb1_ = a1->value("sandbox", std::string());
  e1_ = a1->value("epoch", Epoch{0});
  slot1_ = a1->value("slot", 0u);
  pidfd1_ = watch_agent(*a1, 0);
  event(boottime_ns(), "worker 1 acquired \"" + args_.name + "\" at epoch " + std::to_string(e1_) + ", agent " +
                       sb1_.substr(0, 8) + " started");
  detail("granted: epoch %llu, sandbox %s, pid %d, shm slot %u", static_cast<unsigned long long>(e1_), sb1_.c_str(),
         a1->value("pid", -1), slot1_);
  const std::int64_t w1 = first_write(e1_);
  say("agent writing: first accepted write at %s with token {%s, epoch %llu, %s}", at(w1).c_str(),
      args_.name.c_str(), static_cast<unsigned long long>(e1_), sb1_.substr(0, 8).c_str());
  event(w1, "first accepted write at epoch " + std::to_string(e1_));
  hold(t_.hold_ms);
}

// ---- 1: the same name on worker 2 --------------------------------------------------------------

void Demo::start_again_act() {
  auto dup = control(1, agent_request(true), f_);
  if (!dup) abort(f_.message);
  dup_ = std::move(*dup);
  const bool refused = answer_error(dup_) == ControlError::held;
  say("%s answered: %s", kWorker[1],
      refused ? supervisor_failure(dup_, "run \"" + args_.name + "\"").message.c_str() : dup_.dump().c_str());
  if (refused)
    event(boottime_ns(), "worker 2 refused: held by " + sb1_.substr(0, 8) + " at epoch " + std::to_string(e1_));
}

void Demo::start_again_verify() {
  check(answer_error(dup_) == ControlError::held, "refused: nothing started on worker 2");
  check(dup_.value("holder", std::string()) == sb1_ && dup_.value("epoch", Epoch{0}) == e1_,
        "the refusal names the holder " + sb1_.substr(0, 8) + " and epoch " + std::to_string(e1_));
}

// ---- 2: cut worker 1 off -----------------------------------------------------------------------

void Demo::cut_off_act() {
  std::optional<shm::TableReader> table1;
  try {
    table1.emplace(shm::TableReader::open(shm_[0]));
  } catch (const std::exception& e) {
    abort(std::string("worker 1's shm table: ") + e.what());
  }
  const std::int64_t t_cut = boottime_ns();
  if (const Status e = world_.net.cut_off(0, world_.sup(0).pid(), port_); !e.ok()) abort(e.message());
  say("%s cut off (%s)", kWorker[0],
      world_.net.mode == Network::Mode::netns ? ("link " + world_.net.host_if[0] + " down").c_str()
                                              : (world_.net.filter + " drop rules").c_str());
  event(t_cut, "worker 1 cut off from lockd");
  // lockd's view right after the cut: no refresh can reach it any more, so its expiry is fixed.
  const std::int64_t t_show = boottime_ns();
  const lockd::Answer shown = admin_->show(args_.name);
  const auto* info = shown.as<wire::NameInfo>();
  if (info == nullptr || info->record.state != LockPhase::held)
    abort("lockd does not show \"" + args_.name + "\" held right after the cut: " +
          (shown.ok() ? std::string(wire::to_string(wire::type_of(shown.body))) : shown.message()));
  // ttl_left is rounded down and measured after our send: the true expiry is at or after this.
  expiry_ns_ = t_show + static_cast<std::int64_t>(info->record.ttl_left_ms) * 1'000'000;
  detail("lockd: held by %s at epoch %llu, lease expires at %s (ttl left %u ms)",
         info->record.holder.str().substr(0, 8).c_str(), static_cast<unsigned long long>(info->record.epoch),
         at(expiry_ns_).c_str(), info->record.ttl_left_ms);
  std::int64_t t_revoked = -1;
  dead_ns_ = -1;
  const std::int64_t watch_until = expiry_ns_ + 3'000'000'000;
  while (boottime_ns() < watch_until && (t_revoked < 0 || dead_ns_ < 0)) {
    check_interrupted();
    shm::SlotSnapshot s;
    if (t_revoked < 0 && table1->snapshot(slot1_, s) == shm::TableErrc::ok &&
        (s.revoked || s.sandbox.str() != sb1_ || s.state != shm::SlotState::published))
      t_revoked = boottime_ns();
    pollfd p{pidfd1_, POLLIN, 0};
    if (dead_ns_ < 0 && pidfd1_ >= 0 && ::poll(&p, 1, 0) > 0) dead_ns_ = boottime_ns();
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  if (t_revoked < 0 || dead_ns_ < 0) abort("worker 1's kill-switch did not fire within 3 s after the lease expiry");
  // The supervisor's own record of the kill (CLOCK_BOOTTIME, same clock).
  kill_ns_ = t_revoked;
  std::string kill_path = "?";
  if (const std::string line = await_sup_line(0, {"event=killed", "sandbox=" + sb1_}); !line.empty()) {
    const std::string issued = field(line, "issued_ns");
    if (!issued.empty() && issued != "0") kill_ns_ = static_cast<std::int64_t>(std::stoull(issued));
    kill_path = field(line, "path");
  }
  margin_ns_ = expiry_ns_ - kill_ns_;
  say("kill-switch fired on %s at %s (%s; slot revoked at %s, agent process gone at %s)", kWorker[0],
      at(kill_ns_).c_str(), kill_path.c_str(), at(t_revoked).c_str(), at(dead_ns_).c_str());
  event(kill_ns_, "worker 1 kill-switch fired (" + kill_path + ")");
  event(dead_ns_, "agent " + sb1_.substr(0, 8) + " gone");
  detail("margin: lockd expiry %s - kill %s = %.0f ms (at most ttl - kill_after = %llu ms)", at(expiry_ns_).c_str(),
         at(kill_ns_).c_str(), static_cast<double>(*margin_ns_) / 1e6,
         static_cast<unsigned long long>(t_.ttl_ms - t_.kill_after_ms));
}

void Demo::cut_off_verify() {
  check(*margin_ns_ > 0, "the kill-switch fired before lockd's lease expiry");
  check(dead_ns_ < expiry_ns_, "the agent process was gone before the lease could be given to anyone else");
  const auto e1_tally = store_->tally(args_.name, e1_, resource::Verdict::accepted);
  check(e1_tally.last_ns <= dead_ns_, "no write of epoch " + std::to_string(e1_) + " landed after the agent was killed");
}

// ---- 3: worker 2 takes over --------------------------------------------------------------------

void Demo::take_over_act() {
  std::optional<nlohmann::json> a2;
  int held_answers = 0;
  const std::int64_t acquire_until = expiry_ns_ + 5'000'000'000;
  // Watch lockd until the lease is gone (each refused `run` would cost worker 2 a shm slot
  // that then cools down), then start the agent there.
  while (boottime_ns() < acquire_until) {
    check_interrupted();
    const lockd::Answer s = admin_->show(args_.name);
    const auto* i = s.as<wire::NameInfo>();
    if (s.as<wire::Deny>() != nullptr || (i != nullptr && i->record.state != LockPhase::held)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::int64_t t_free = boottime_ns();
  detail("lockd: the lease expired; \"%s\" is free (seen at %s)", args_.name.c_str(), at(t_free).c_str());
  event(t_free, "lockd: lease of epoch " + std::to_string(e1_) + " expired, name free");
  while (boottime_ns() < acquire_until) {
    check_interrupted();
    a2 = control(1, agent_request(true), f_);
    if (!a2) abort(f_.message);
    if (a2->value("ok", false)) break;
    if (answer_error(*a2) != ControlError::held) abort(supervisor_failure(*a2, "run on worker 2").message);
    ++held_answers;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!a2 || !a2->value("ok", false)) abort("worker 2 could not acquire the name within 5 s after the expiry");
  const std::int64_t t_grant2 = boottime_ns();
  sb2_ = a2->value("sandbox", std::string());
  e2_ = a2->value("epoch", Epoch{0});
  pidfd2_ = watch_agent(*a2, 1);
  const auto lockd_expire = find_line(world_.dep->lockd().stdout_path(), {"event=expire", "name=" + args_.name});
  if (!lockd_expire.empty())
    detail("lockd logged the expiry at %s", at(std::stoll(field(lockd_expire, "ts_boot_ns"))).c_str());
  say("%s acquired \"%s\" at epoch %llu (sandbox %s, pid %d%s)", kWorker[1], args_.name.c_str(),
      static_cast<unsigned long long>(e2_), sb2_.substr(0, 8).c_str(), a2->value("pid", -1),
      held_answers > 0 ? (", after " + std::to_string(held_answers) + " \"held\" answers").c_str() : "");
  event(t_grant2, "worker 2 acquired at epoch " + std::to_string(e2_) + ", agent " + sb2_.substr(0, 8) + " started");
  const std::int64_t w2 = first_write(e2_);
  say("agent continues on %s: first accepted write at epoch %llu at %s", kWorker[1],
      static_cast<unsigned long long>(e2_), at(w2).c_str());
  event(w2, "first accepted write at epoch " + std::to_string(e2_));
  hold(t_.hold_ms);
}

void Demo::take_over_verify() {
  check(e2_ == e1_ + 1, "the new grant is at epoch " + std::to_string(e1_) + "+1");
}

// ---- 4: replay a stale write, make up an epoch --------------------------------------------------

void Demo::replay_act() {
  std::string last_payload = "replayed";
  for (const auto& r : audit_rows())
    if (r.verdict == resource::Verdict::accepted && r.epoch == e1_) last_payload = r.payload;
  const SandboxId holder1 = SandboxId::parse(sb1_).value_or(SandboxId{});
  say("replaying the last write of epoch %llu with its token {%s, epoch %llu, %s}",
      static_cast<unsigned long long>(e1_), args_.name.c_str(), static_cast<unsigned long long>(e1_),
      sb1_.substr(0, 8).c_str());
  replay_ = store_->write({args_.name, e1_, holder1}, last_payload);
  say("resource: %s%s%s", std::string(resource::to_string(replay_.verdict)).c_str(), replay_.reason.empty() ? "" : ": ",
      replay_.reason.c_str());
  event(replay_.time_ns, "stale replay of epoch " + std::to_string(e1_) + " rejected");
  // The old holder cannot get around the fence by making up an epoch: it has no token lockd
  // signed for it.
  const Epoch made_up = e2_ + 1000;
  forged_ = store_->write({args_.name, made_up, holder1}, "made-up epoch");
  say("old holder writes with a made-up epoch %llu: resource: %s%s%s", static_cast<unsigned long long>(made_up),
      std::string(resource::to_string(forged_.verdict)).c_str(), forged_.reason.empty() ? "" : ": ",
      forged_.reason.c_str());
  event(forged_.time_ns, "made-up epoch " + std::to_string(made_up) + " rejected (" +
                             forged_.reason.substr(0, forged_.reason.find(':')) + ")");
}

void Demo::replay_verify() {
  check(replay_.verdict == resource::Verdict::stale && replay_.highest == e2_,
        "the stale token is rejected where the write lands (highest seen " + std::to_string(replay_.highest) + ")");
  check(forged_.verdict == resource::Verdict::forged && forged_.highest == e2_,
        "a made-up epoch without lockd's signature is rejected (the fence stays at " +
            std::to_string(forged_.highest) + ")");
}

// ---- 5: graceful transfer back to worker 1 ------------------------------------------------------

void Demo::transfer_act() {
  if (const Status e = world_.net.reconnect(0); !e.ok()) abort(e.message());
  const std::int64_t t_reconnect = boottime_ns();
  {
    // Wait until worker 1's path to lockd works again (link up, neighbours resolved), so the
    // transfer does not race the network coming back.
    const auto lockd_addr = SocketAddress::parse(world_.net.lockd_address(0, port_));
    const std::int64_t until = boottime_ns() + 10'000'000'000;
    bool up = false;
    while (!up && boottime_ns() < until) {
      check_interrupted();
      up = lockd_addr && lockd_answers_from(world_.net.netns[0], *lockd_addr, key_path_, 300);
    }
    if (!up) abort("worker 1 still cannot reach lockd 10 s after reconnecting");
  }
  say("%s reconnected (link restored at %s); lockd answers from its side again", kWorker[0], at(t_reconnect).c_str());
  event(t_reconnect, "worker 1's link to lockd restored");
  event(boottime_ns(), "lockd reachable from worker 1 again");
  auto b1 = control(0, agent_request(false), f_);
  if (!b1) abort(f_.message);
  if (!b1->value("ok", false)) abort(supervisor_failure(*b1, "run on worker 1").message);
  sb3_ = b1->value("sandbox", std::string());
  pidfd3_ = watch_agent(*b1, 0);
  say("%s: an unnamed agent %s waits for the name (pid %d)", kWorker[0], sb3_.substr(0, 8).c_str(),
      b1->value("pid", -1));
  const lockd::Answer before = admin_->show(args_.name);
  const auto* binfo = before.as<wire::NameInfo>();
  if (binfo == nullptr || binfo->record.state != LockPhase::held || binfo->record.holder.str() != sb2_)
    abort("before the transfer, lockd should show \"" + args_.name + "\" held by " + sb2_);
  const NameId name_id = binfo->record.name_id;
  // Fence first: the resource rejects epoch e2 from now on, so nothing of the old holder lands
  // while the name is in transfer (lockd allocates exactly e2+1 at begin; checked below).
  const resource::WriteResult fence = store_->advance_fence(args_.name, e2_ + 1, "transfer begin");
  transfer_fence_ns_ = fence.time_ns;
  fence_epoch_ = fence.highest;
  const SandboxId to = SandboxId::parse(sb3_).value_or(SandboxId{});
  if (args_.old_holder_releases_first) {
    // Lose the race on purpose: let the fenced-out holder stop and its supervisor release the
    // name before the transfer begins.
    if (pidfd2_ < 0 || wait_exit(pidfd2_, t_.ttl_ms + 2000) < 0) abort("the fenced-out holder did not stop");
    std::string released;
    for (int tries = 0; tries < 500 && released.empty(); ++tries) {
      check_interrupted();
      released = find_line(world_.sup(1).stdout_path(), {"event=released", "sandbox=" + sb2_});
      if (released.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    detail("(--old-holder-releases-first) worker 2 released it first: %s", released.c_str());
  }
  const lockd::Answer begun = admin_->transfer_begin(name_id, binfo->record.holder, e2_, to, worker_id_[0]);
  const std::int64_t t_begin = boottime_ns();
  const auto* ts = begun.as<wire::TransferState>();
  // Fencing first has a race of its own: the old holder may write, be rejected, stop itself,
  // and have its supervisor release the name before lockd sees the transfer begin (a loaded
  // machine widens that window). Then lockd no longer holds the name for it, and the receiver
  // gets it the way a completed transfer would have left it: free, reserved for it, epoch +1
  // (Reassign, DESIGN.md "Lock states").
  const auto* begin_deny = begun.as<wire::Deny>();
  reassigned_ = ts == nullptr && begin_deny != nullptr &&
                (begin_deny->refusal == Refusal::unknown_name || begin_deny->refusal == Refusal::not_held) &&
                pidfd2_ >= 0 && exited(pidfd2_);
  if (ts == nullptr && !reassigned_) abort(lockd_problem(begun, "transfer begin"));
  event(fence.time_ns, "resource fence raised to epoch " + std::to_string(e2_ + 1));
  if (ts != nullptr) {
    e3_ = ts->new_epoch;
    say("transfer begun: epoch %llu -> %llu at the start; resource told first (fence %llu at %s)",
        static_cast<unsigned long long>(e2_), static_cast<unsigned long long>(e3_),
        static_cast<unsigned long long>(fence.highest), at(fence.time_ns).c_str());
    event(t_begin, "transfer begun at lockd: epoch " + std::to_string(e3_));
  } else {
    say("transfer begin: lockd answered %s: the old holder %s, fenced out by the resource (fence %llu at %s), had "
        "already stopped and its supervisor released the name",
        std::string(to_string(begin_deny->refusal)).c_str(), sb2_.substr(0, 8).c_str(),
        static_cast<unsigned long long>(fence.highest), at(fence.time_ns).c_str());
    const lockd::Answer reassigned = admin_->reassign(name_id, to, worker_id_[0]);
    const auto* ok = reassigned.as<wire::Ok>();
    if (ok == nullptr) abort(lockd_problem(reassigned, "reassign"));
    e3_ = ok->epoch;
    const std::int64_t t_reassign = boottime_ns();
    if (e3_ != fence.highest) fence_epoch_ = store_->advance_fence(args_.name, e3_, "reassign").highest;
    say("lockd reassigned \"%s\" to %s at epoch %llu: free and reserved for it, as a completed transfer leaves it",
        args_.name.c_str(), sb3_.substr(0, 8).c_str(), static_cast<unsigned long long>(e3_));
    event(t_reassign, "old holder released first; lockd reassigned the name to " + sb3_.substr(0, 8) + " at epoch " +
                          std::to_string(e3_));
  }
  // The old holder stops: its next write is rejected as stale (it stops itself), or its
  // supervisor's next heartbeat is answered `lost` (it is killed) - whichever comes first.
  std::int64_t t_old_gone = pidfd2_ >= 0 ? wait_exit(pidfd2_, t_.ttl_ms + 2000) : -1;
  if (t_old_gone < 0) abort("the old holder did not stop within its lease TTL after the transfer began");
  const std::string exit_line = await_sup_line(1, {"event=exited", "sandbox=" + sb2_});
  if (const auto pos = exit_line.find(" ts_boot_ns="); pos != std::string::npos)
    t_old_gone = std::min<std::int64_t>(t_old_gone, std::stoll(exit_line.substr(pos + 12)));
  const auto reason_at = exit_line.find("reason=");
  const std::string how = field(exit_line, "status") == "3"
                              ? "its next write was rejected as stale, so it stopped itself"
                              : "its supervisor stopped it: " + (reason_at == std::string::npos ? std::string("?")
                                                                                                : exit_line.substr(reason_at + 7));
  say("old holder %s on %s stopped at %s: %s", sb2_.substr(0, 8).c_str(), kWorker[1], at(t_old_gone).c_str(), how.c_str());
  event(t_old_gone, "old holder " + sb2_.substr(0, 8) + " stopped");
  if (ts != nullptr) {
    // lockd completes the transfer only once worker 2 confirmed the old holder dead (its
    // KillConfirmed, or its Release of the old grant), or the old lease + lock-delay ended.
    lockd::Answer done;
    const std::int64_t complete_until = boottime_ns() + static_cast<std::int64_t>(t_.ttl_ms + 2000) * 1'000'000;
    for (;;) {
      check_interrupted();
      done = admin_->transfer_complete(name_id, e3_);
      const auto* d = done.as<wire::Deny>();
      if (d == nullptr || d->refusal != Refusal::lock_delay || boottime_ns() >= complete_until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done.as<wire::TransferState>() == nullptr) abort(lockd_problem(done, "transfer complete"));
    const std::int64_t t_complete = boottime_ns();
    const lockd::Answer after = admin_->show(args_.name);
    const auto* ai = after.as<wire::NameInfo>();
    const bool confirmed = ai != nullptr && ai->record.revoke_ended == wire::RevokeEnd::kill_confirmed;
    say("transfer complete: \"%s\" free at epoch %llu, reserved for %s (%s)", args_.name.c_str(),
        static_cast<unsigned long long>(e3_), sb3_.substr(0, 8).c_str(),
        confirmed ? "worker 2 confirmed the old holder dead" : "the old lease + lock-delay ended");
    event(t_complete, "transfer complete: free, reserved for " + sb3_.substr(0, 8));
  }
  std::optional<nlohmann::json> named;
  const std::int64_t name_until = boottime_ns() + 10'000'000'000;
  while (boottime_ns() < name_until) {
    check_interrupted();
    named = control(0, {{"v", 1}, {"op", "name"}, {"sandbox", sb3_}, {"name", args_.name}}, f_);
    if (!named) abort(f_.message);
    if (answer_error(*named) != ControlError::unreachable) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the link is coming back
  }
  if (!named || !named->value("ok", false))
    abort(named ? supervisor_failure(*named, "name on worker 1").message : "name on worker 1: no answer");
  named_epoch_ = named->value("epoch", Epoch{0});
  say("%s: leasehold name %s %s -> epoch %llu", kWorker[0], sb3_.substr(0, 8).c_str(), args_.name.c_str(),
      static_cast<unsigned long long>(named_epoch_));
  event(boottime_ns(), "worker 1 holds it again at epoch " + std::to_string(e3_) + " (agent " + sb3_.substr(0, 8) + ")");
  transfer_first_write_ns_ = first_write(e3_);
  say("agent continues on %s: first accepted write at epoch %llu at %s", kWorker[0],
      static_cast<unsigned long long>(e3_), at(transfer_first_write_ns_).c_str());
  event(transfer_first_write_ns_, "first accepted write at epoch " + std::to_string(e3_));
  writes_during_transfer_ = 0;
  for (const auto& r : audit_rows())
    if (r.verdict == resource::Verdict::accepted && r.time_ns >= transfer_fence_ns_ && r.time_ns < transfer_first_write_ns_)
      ++writes_during_transfer_;
  detail("transfer window: %s .. %s (%.0f ms): %llu writes accepted", at(transfer_fence_ns_).c_str(),
         at(transfer_first_write_ns_).c_str(), static_cast<double>(transfer_first_write_ns_ - transfer_fence_ns_) / 1e6,
         static_cast<unsigned long long>(writes_during_transfer_));
  hold(t_.hold_ms);
  // It keeps writing: a number of writes over at least half the hold time. On a loaded
  // machine the agent may wait for a CPU or for the disk, so the deadline grows with the load.
  const std::int64_t need_writes = static_cast<std::int64_t>(t_.hold_ms / t_.agent_interval_ms / kKeepWritingDivisor);
  const std::int64_t need_span_ns = static_cast<std::int64_t>(t_.hold_ms) * 500'000;
  const double load = load_factor();
  const auto window_ms = static_cast<std::int64_t>(static_cast<double>(t_.hold_ms * kKeepWritingSlack) * load);
  const std::int64_t deadline = transfer_first_write_ns_ + window_ms * 1'000'000;
  resource::FencedStore::Tally e3_tally;
  for (;;) {
    e3_tally = store_->tally(args_.name, e3_, resource::Verdict::accepted);
    const bool enough = e3_tally.rows >= need_writes && e3_tally.last_ns - e3_tally.first_ns >= need_span_ns;
    if (enough || pidfd3_ < 0 || exited(pidfd3_) || boottime_ns() >= deadline) break;
    check_interrupted();
    maintain();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::int64_t span_ns = e3_tally.rows > 0 ? e3_tally.last_ns - e3_tally.first_ns : 0;
  const bool alive = pidfd3_ >= 0 && !exited(pidfd3_);
  char what[320];
  std::snprintf(what, sizeof what,
                "the agent keeps writing on worker 1 at epoch %llu (%lld writes over %.0f ms; needed %lld over "
                "%lld ms, within %lld ms at load factor %.1f)%s",
                static_cast<unsigned long long>(e3_), static_cast<long long>(e3_tally.rows),
                static_cast<double>(span_ns) / 1e6, static_cast<long long>(need_writes),
                static_cast<long long>(need_span_ns / 1'000'000), static_cast<long long>(window_ms), load,
                alive ? "" : "; the agent exited");
  keeps_writing_ = what;
  keeps_writing_ok_ = alive && e3_tally.rows >= need_writes && span_ns >= need_span_ns;
}

void Demo::transfer_verify() {
  if (!reassigned_)
    check(e3_ == e2_ + 1 && fence_epoch_ == e3_,
          "the epoch advanced at the start of the transfer, and the resource knew it first");
  else
    check(e3_ == e2_ + 1 && fence_epoch_ == e3_,
          "the epoch advanced (by a reassign: the old holder had released), and the resource knew it first");
  check(named_epoch_ == e3_, std::string("the receiver holds the name at the epoch ") +
                                 (reassigned_ ? "of the reassign" : "allocated at the begin"));
  check(writes_during_transfer_ == 0, "no write was accepted during the transfer");
  if (!check(keeps_writing_ok_, keeps_writing_))
    detail("the agent's last words on worker 1:%s", agent_lines(0, 5).c_str());
}

// ---- end: release, audit ------------------------------------------------------------------------

void Demo::end_act() {
  auto rel = control(0, {{"v", 1}, {"op", "release"}, {"name", args_.name}}, f_);
  released_ = rel && rel->value("ok", false);
  if (released_) {
    say("released \"%s\" on %s: agent stopped, name returned to lockd", args_.name.c_str(), kWorker[0]);
    event(boottime_ns(), "released by worker 1");
  } else {
    say("release on worker 1: %s", rel ? supervisor_failure(*rel, "release").message.c_str() : f_.message.c_str());
  }
  const std::vector<resource::AuditRow> rows = audit_rows();
  audit_ = resource::check_audit(rows);
  const resource::AuditReport& rep = *audit_;
  std::fprintf(out_, "\naudit of \"%s\" in %s (%zu rows: %llu accepted, %llu rejected, %llu fence announcements)\n",
               args_.name.c_str(), args_.keep ? db_path_.c_str() : "resource.db", rows.size(),
               static_cast<unsigned long long>(rep.accepted), static_cast<unsigned long long>(rep.rejected),
               static_cast<unsigned long long>(rep.fences));
  Table t({"EPOCH", "HOLDER", "ACCEPTED", "STALE", "FIRST", "LAST"});
  for (const auto& e : rep.epochs) {
    std::string holders;
    for (const auto& h : e.holders) holders += (holders.empty() ? "" : ",") + who(h);
    t.add({std::to_string(e.epoch), holders.empty() ? "-" : holders, std::to_string(e.accepted),
           std::to_string(e.rejected), e.accepted ? at(e.first_ns) : "-", e.accepted ? at(e.last_ns) : "-"});
  }
  std::fputs(t.indent(2).str().c_str(), out_);
  std::fprintf(out_, "rejected writes:\n");
  for (const auto& r : rep.rejected_rows)
    std::fprintf(out_, "  %s  epoch %llu  holder %s  %s  payload \"%s\"\n", at(r.time_ns).c_str(),
                 static_cast<unsigned long long>(r.epoch), who(r.holder).c_str(), r.reason.c_str(), r.payload.c_str());
  if (rep.rejected_rows.empty()) std::fprintf(out_, "  (none)\n");
  std::fprintf(out_, "checks:\n");
}

void Demo::end_verify() {
  check(released_, "the holder released the name at the end");
  const resource::AuditReport& rep = *audit_;
  for (const auto& v : rep.violations) check(false, v);
  check(rep.ok(), "epochs never decrease in acceptance order, and one holder per epoch");
  bool overlap = false;
  for (const auto& v : rep.violations) overlap = overlap || v.find("overlap") != std::string::npos;
  check(!overlap, "zero overlapping epochs: accepted-write time ranges of different epochs are disjoint");
  std::size_t with_writes = 0;
  for (const auto& e : rep.epochs) with_writes += e.accepted > 0 ? 1 : 0;
  check(with_writes == 3 && rep.epochs.size() >= 3,
        "three epochs wrote (" + std::to_string(e1_) + ", " + std::to_string(e2_) + ", " + std::to_string(e3_) + ")");
  bool replay_seen = false;
  for (const auto& r : rep.rejected_rows) replay_seen = replay_seen || (r.epoch == e1_ && r.verdict == resource::Verdict::stale);
  check(replay_seen, "the replayed stale write is in the audit as rejected");
  check(rep.forged == 1, "the made-up epoch is in the audit as forged");
  check(rep.unverified == 0, "every accepted write carried a token lockd signed (" + std::to_string(rep.verified) +
                                 " verified)");
  std::fprintf(out_, "audit: %s\n", rep.summary().c_str());
}

void Demo::print_timeline() {
  std::fprintf(out_, "\ntimeline:\n");
  std::stable_sort(timeline_.begin(), timeline_.end(), [](const Event& a, const Event& b) { return a.t_ns < b.t_ns; });
  for (const auto& e : timeline_) std::fprintf(out_, "  %10s  %s\n", at(e.t_ns).c_str(), e.what.c_str());
}

/// `leasehold demo --list-steps`: the table, one step per line ("LABEL  TITLE"), or JSON.
void list_steps(bool json) {
  if (json) {
    nlohmann::json steps = nlohmann::json::array();
    for (const Step& s : kSteps) steps.push_back({{"step", s.label}, {"title", s.title}, {"checks", s.verify != nullptr}});
    std::printf("%s\n", steps.dump().c_str());
    return;
  }
  Table t({"STEP", "TITLE"});
  for (const Step& s : kSteps) t.add({s.label, s.title});
  std::fputs(t.str().c_str(), stdout);
}

const Command kDemo([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<DemoArgs>();
  auto* sub = app.add_subcommand(
      "demo", "End to end: lockd, two supervisors (network namespaces where possible), a named agent "
              "writing to a fenced SQLite resource; refusal, kill-switch, takeover, stale write, "
              "transfer; then the audit. Exit 0 only if every check holds, 1 if one failed, 2 for a bad "
              "flag, 77 if this machine cannot cut a worker off (no network namespaces and no "
              "nft/iptables), 128+signal when interrupted (SIGINT 130, SIGHUP 129, SIGTERM 143)");
  // --list-steps runs nothing, so it refuses the options of a run (exit 2) rather than ignore
  // them; --json goes with it. It is defined first: CLI11 checks exclusions in definition order,
  // so the message always reads "--list-steps excludes --<option>".
  CLI::Option* list = sub->add_flag("--list-steps", a->list_steps,
                                    "print the scenario's steps (the README's list) and exit without running "
                                    "anything; with --json as an array of {step, title, checks}");
  list->excludes(sub->add_flag("--fast", a->fast, "short TTLs (CI): lease 1.5 s, kill-switch after 0.9 s"));
  list->excludes(
      sub->add_flag("--keep", a->keep, "keep the temp dir (logs, lockd.db, resource.db) and print its path"));
  sub->add_flag("--json", a->json, "print a JSON summary on stdout (the narrative goes to stderr)");
  list->excludes(
      sub->add_option("--network", a->network, "auto | netns | loopback (default auto: namespaces if possible)"));
  list->excludes(sub->add_option("--name", a->name, "the name the agent holds (default orders)"));
  list->excludes(sub->add_option("--lockd-bin", a->lockd_bin,
                                 "path of leasehold-lockd (default: next to this binary, or PATH)"));
  list->excludes(
      sub->add_option("--supervisor-bin", a->supervisor_bin, "path of leasehold-supervisor (default: likewise)"));
  // Hidden, so CLI11 would name it "" in an exclusion error: the callback refuses it instead.
  sub->add_flag("--old-holder-releases-first", a->old_holder_releases_first,
                "in step 5, let the fenced-out holder stop and release before the transfer begins (tests "
                "that race)")
      ->group("");
  sub->callback([a, exit_code] {
    if (a->list_steps) {
      if (a->old_holder_releases_first) {
        *exit_code = report("demo", {kUsage, "--list-steps excludes --old-holder-releases-first"});
        return;
      }
      list_steps(a->json);
      *exit_code = kOk;
      return;
    }
    // Usage errors stop here, before anything is started or printed.
    Failure f;
    if (a->network != "auto" && a->network != "netns" && a->network != "loopback") {
      *exit_code = report("demo", {kUsage, "--network must be auto, netns or loopback (got \"" + a->network + "\")"});
      return;
    }
    if (!check_new_name(a->name, f)) {
      *exit_code = report("demo", f);
      return;
    }
    for (const auto& [flag, path] :
         {std::pair{"--lockd-bin", a->lockd_bin}, std::pair{"--supervisor-bin", a->supervisor_bin}}) {
      if (!path.empty() && ::access(path.c_str(), X_OK) != 0) {
        *exit_code = report("demo", {kUsage, std::string(flag) + " " + path + ": not an executable file (" +
                                                 std::strerror(errno) + ")"});
        return;
      }
    }
    Demo d(*a);
    *exit_code = d.run();
  });
});

}  // namespace
}  // namespace leasehold::cli
