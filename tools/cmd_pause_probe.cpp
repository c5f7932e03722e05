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
// the supervisor's shm stats. The deployment and the trials are the harness's
// (leasehold/harness/pause_deployment.hpp, pause_trial.hpp); this file is the command line;
// include/leasehold/pause/model.hpp turns what they saw into the trial's outcome; pause/README.md
// defines every column and the two budgets.
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

#include "leasehold/harness/freeze.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/harness/pause_deployment.hpp"
#include "leasehold/harness/pause_output.hpp"
#include "leasehold/harness/pause_sandbox.hpp"
#include "leasehold/harness/pause_trial.hpp"

#include "leasehold/pause/model.hpp"
#include "leasehold/pause/report.hpp"
#include "leasehold/shm/table.hpp"
#include "leasehold/supervisor/config.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace leasehold::cli {
namespace {

namespace pp = leasehold::pause;
using harness::Freezer;
using harness::ObserverPriority;
using harness::ProbeLock;
using harness::TrialRunner;

constexpr std::uint32_t kRepeatMax = 100;

using harness::Interrupted;
using harness::now_ns;
/// The `tick` of every wait: Ctrl-C (SIGINT, SIGTERM) ends the sweep (run_probe's InterruptScope).
void check_interrupted() { harness::InterruptScope::check(); }

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

/// The exit code of a failure of the harness's deployment functions, by the Errc
/// harness/pause_deployment.hpp documents for each: invalid_argument → kUsage; timeout, refused
/// (lockd does not answer with the key, or is not the supervisor's) → kUnreachable; not_found (the
/// supervisor is stopped) → kNoSupervisor; anything else → kInternal. kOk for a success.
Failure probe_failure(const Status& st) {
  switch (st.code()) {
    case Errc::ok: return {};
    case Errc::invalid_argument: return {kUsage, st.message()};
    case Errc::timeout:
    case Errc::refused: return {kUnreachable, st.message()};
    case Errc::not_found: return {kNoSupervisor, st.message()};
    default: return {kInternal, st.message()};
  }
}

/// Asks the supervisor for its status and reads it into the deployment (pid, shm, timing); the
/// flags given win over its ρ and kill latency budget, and always do standalone.
Failure read_status(const ProbeArgs& a, harness::PauseDeployment& d) {
  Failure f;
  auto st = control(d.socket, {{"op", "status"}}, f);
  if (!st) return f;
  if (!st->value("ok", false)) return supervisor_failure(*st, "status");
  harness::StatusOverrides o;
  if (a.standalone || a.clock_rate_bound_set) o.clock_rate_bound = a.clock_rate_bound;
  if (a.standalone || a.kill_latency_budget_set) o.kill_latency_budget_ms = a.kill_latency_budget_ms;
  return probe_failure(harness::read_status(*st, o, d));
}

/// The command line alone, checked before anything starts (kUsage naming the flag).
Failure check_args(const ProbeArgs& a, const pp::Timing& t) {
  if (a.repeat == 0 || a.repeat > kRepeatMax) return {kUsage, "--repeat must be 1.." + std::to_string(kRepeatMax)};
  if (a.steps == 0 || a.steps > pp::kStepsMax) return {kUsage, "--steps must be 1.." + std::to_string(pp::kStepsMax)};
  if (!(a.clock_rate_bound >= 0.0 && a.clock_rate_bound <= pp::kClockRateBoundMax))
    return {kUsage, "--clock-rate-bound " + harness::rho_text(a.clock_rate_bound) + " is out of range 0.." +
                        harness::rho_text(pp::kClockRateBoundMax) + " (rho, dimensionless: DESIGN.md \"Time\")"};
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
                          " leaves a pause budget of " + pp::ms_text(pp::configured_budget_ns(t)) +
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

/// One run of the probe: what its phases (prepare, deploy, arm, baseline, trials, report) hand
/// on to each other. Members are destroyed in reverse: the trial context, the stress load, the
/// table, the freezer (thawing the supervisor and moving it home), the lock, the deployment.
struct ProbeRun {
  explicit ProbeRun(ProbeArgs args) : a(std::move(args)), priority(a.observer_priority) {}
  ProbeArgs a;
  harness::PauseDeployment d;
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
  ObserverPriority priority;
  std::unique_ptr<TrialRunner> runner;
  pp::SweepReport rep;
  bool interrupted = false;
};

/// The command line, the output directory and the CSV path, checked (and the directory made)
/// before anything starts.
Failure prepare(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  harness::PauseDeployment& d = r.d;
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
  if (Failure f = probe_failure(harness::prepare_out_dir(r.out, r.log_dir)); f.failed()) return f;
  if (!a.csv_path.empty()) {
    struct stat st {};
    const std::string dir = harness::dir_of(a.csv_path);
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
  harness::PauseDeployment& d = r.d;
  Failure f;
  if (a.standalone) {
    stderr_progress(a.quiet, "starting lockd and a supervisor in a temp dir...\n");
    harness::StandaloneSpec spec;
    spec.lockd_bin = locate_service(a.lockd_bin, "leasehold-lockd", "lockd");
    spec.supervisor_bin = locate_service(a.supervisor_bin, "leasehold-supervisor", "supervisor");
    spec.located_from = self_exe();
    if (f = probe_failure(harness::start_standalone(spec, d, check_interrupted)); f.failed()) return f;
    if (f = read_status(a, d); f.failed()) return f;
  } else {
    SupervisorFlags sf;
    sf.socket = a.supervisor_socket;
    resolve(sf);
    d.socket = sf.socket;
    const bool lockd_given = !a.lockd.empty() || std::getenv(kLockdEnv) != nullptr;
    LockdFlags lf;
    lf.lockd = a.lockd;
    lf.key_file = a.key_file;
    resolve(lf);
    const auto warn = [](const std::string& s) { std::fprintf(stderr, "pause-probe: warning: %s\n", s.c_str()); };
    if (f = probe_failure(harness::load_deployment_key(lf.key_file, d)); f.failed()) return f;
    if (f = probe_failure(harness::recover_left_frozen(d.socket, warn)); f.failed()) return f;
    if (f = read_status(a, d); f.failed()) return f;
    // Without --lockd (or $LEASEHOLD_LOCKD) the supervisor's own lockd (its status).
    const std::string lockd = lockd_given ? lf.lockd : !d.status_lockd.empty() ? d.status_lockd : kLockdDefault;
    if (f = probe_failure(harness::settle_lockd(lockd, d)); f.failed()) return f;
    auto lock = ProbeLock::take(d.supervisor_pid, d.socket);
    if (!lock) return {lock.code() == Errc::busy ? kRefused : kInternal, lock.message()};
    r.lock = std::move(lock).value();
  }
  r.budget_ns = pp::configured_budget_ns(d.timing);
  if (r.budget_ns <= 0)
    return {kUsage, "the configured pause budget is " + pp::ms_text(r.budget_ns) + ": the timing breaks DESIGN.md's safety condition"};
  return {};
}

/// The trial plan, the freezer, the supervisor's shm table and the stress load (bounded in time).
Failure arm(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  const harness::PauseDeployment& d = r.d;
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

  auto freezer = Freezer::make(d.supervisor_pid, a.freeze);
  if (!freezer) return {kUsage, freezer.message()};
  r.freezer = std::move(freezer).value();
  r.why = r.freezer->why();

  try {
    r.table.emplace(shm::TableReader::open(d.shm_path, shm::OpenOptions{2'000'000'000, 1'000'000}));
  } catch (const shm::TableError& e) {
    return {kTableError, std::string("the supervisor's shm table: ") + e.what()};
  }

  if (a.stress) {
    harness::StressSpec spec{a.stress_args, a.stress_timeout_s, r.plan, d.timing,
                             (a.standalone ? d.dir() : r.out) + "/stress-ng.log"};
    auto text = harness::start_stress(spec, r.stress, [&a](const std::string& s) { stderr_progress(a.quiet, "warning: " + s + "\n"); });
    if (!text) return probe_failure(text.status());
    r.stress_text = *text;
    if (!r.stress_text.empty()) {
      stderr_progress(a.quiet, "stress: " + r.stress_text + "\n");
      harness::sleep_until_ns(now_ns() + 500'000'000, check_interrupted);  // the load ramps up before the first trial
    }
  }
  return {};
}

/// The report's header, the progress line about the deployment, the trial runner and the
/// baseline window (a named sandbox without pauses).
void baseline(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  harness::PauseDeployment& d = r.d;
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
                               pp::ms_text(r.budget_ns) + "; " + std::to_string(r.plan.size()) + " trial(s)\n");

  r.priority.raise();  // this thread times the freeze against valid_until
  const std::string socket = d.socket;
  auto request = [socket](const nlohmann::json& req, harness::milliseconds timeout) -> Result<nlohmann::json> {
    Failure f;
    auto answer = control(socket, req, f, static_cast<std::uint64_t>(timeout.count()));
    if (answer) return std::move(*answer);
    return Status{Errc::io_error, f.message.empty() ? std::string("no answer from ") + socket : f.message};
  };
  harness::TrialTarget target = harness::trial_target(d, std::move(request), {self_exe(), "pause-probe-sandbox"});
  harness::TrialSettings settings;
  settings.phase = r.phase;
  settings.tag = std::to_string(::getpid()) + "-" + std::to_string(now_ns() % 1'000'000'000);
  settings.log_dir = r.log_dir;
  settings.seed = a.seed;
  settings.contend_interval_ms = a.contend_interval_ms;
  settings.guard_ms = a.guard_ms;
  settings.tick = check_interrupted;
  r.runner = std::make_unique<TrialRunner>(std::move(target), std::move(settings), *r.freezer, *r.table, r.priority);
  if (a.baseline_ms > 0) {
    stderr_progress(a.quiet, "baseline: a named sandbox for " + std::to_string(a.baseline_ms) +
                                 " ms without pauses (rt lateness and heartbeat RTT)\n");
    if (const Status e = r.runner->baseline(a.baseline_ms); !e.ok())
      stderr_progress(a.quiet, "warning: baseline: " + e.message() + "\n");
  }
}

/// Every trial of the plan (Ctrl-C ends the sweep: r.interrupted), then the clean windows
/// closed, the stress load and the freezer gone, and the verdict.
void trials(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  r.interrupted = r.runner->sweep(r.plan, r.budget_ns, r.rep, [&a](const std::string& s) { stderr_progress(a.quiet, s); });
  r.runner->close_windows();
  r.stress.terminate(std::chrono::milliseconds(1000));
  r.freezer.reset();

  if (r.priority.refused())
    stderr_progress(a.quiet, "warning: SCHED_FIFO refused for the observer threads: under load, deaths and grants "
                             "may be seen late (the supervisor's own kill record still bounds the death)\n");
  r.runner->judge(r.rep, r.interrupted, r.plan.size());
}

/// The CSV, the plot (gnuplot's PNG, else an SVG), the JSON and the table; the exit code.
int report_sweep(ProbeRun& r) {
  const ProbeArgs& a = r.a;
  const pp::SweepReport& rep = r.rep;
  const auto files = harness::write_sweep(rep, {r.out, a.csv_path, a.plot, r.log_dir}, r.interrupted,
                                         [&a](const std::string& s) { stderr_progress(a.quiet, s); });
  if (!files) return report("pause-probe", {kFailure, files.message()});
  std::string text = "\n" + pp::to_table(rep) + "\n" + pp::budget_text(rep) + pp::threshold_text(rep);
  text += "files                    " + files->csv + "  " + files->plot + "  " + files->json + "\n";
  text += "verdict                  " + rep.verdict.line + "\n";
  if (a.json) {
    std::fputs(text.c_str(), stderr);
    std::printf("%s\n", files->summary.dump(2).c_str());
  } else {
    std::fputs(text.c_str(), stdout);
  }
  std::fflush(stdout);
  if (r.interrupted) return kFailure;
  return rep.verdict.ok ? kOk : kFailure;
}

int run_probe(ProbeArgs args) {
  harness::InterruptScope signals;
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
    r.runner.reset();
    r.stress.kill9();
    r.table.reset();
    r.freezer.reset();
    r.lock.reset();
    std::fputs("leasehold pause-probe: interrupted; cleaned up\n", stderr);
    return kFailure;
  }
}

// ---- the probe sandbox -------------------------------------------------------------------------

/// harness/pause_sandbox.hpp; a log it cannot open is a usage error, a table it cannot read kTableError.
int run_sandbox(const harness::PauseSandboxOptions& a) {
  const Status st = harness::run_pause_sandbox(a);
  if (st.ok()) return kOk;
  std::fprintf(stderr, "leasehold pause-probe-sandbox: %s\n", st.message().c_str());
  return st.code() == Errc::invalid_argument ? kUsage : kTableError;
}

// ---- registration ------------------------------------------------------------------------------

/// The options whose presence the checks need (a default cannot tell "given" from "not given").
struct GivenOptions {
  CLI::Option* kill_latency_budget = nullptr;
  CLI::Option* clock_rate_bound = nullptr;
  CLI::Option* pauses = nullptr;
  std::vector<CLI::Option*> standalone_only;  ///< refused against a running supervisor
};

/// Which deployment: --standalone, or a running one (--supervisor, --lockd, --key-file), and the
/// binaries a standalone one runs.
void add_deployment_options(CLI::App* sub, ProbeArgs& a, GivenOptions& given) {
  sub->add_flag("--standalone", a.standalone,
                "start lockd and a supervisor in a temp dir, with their own key; everything is removed on exit");
  sub->add_option("--supervisor", a.supervisor_socket,
                  std::string("control socket of a running supervisor (env ") + kSupervisorEnv + ")");
  sub->add_option("--lockd", a.lockd, std::string("lockd address HOST:PORT of that deployment (env ") + kLockdEnv + ")");
  sub->add_option("--key-file", a.key_file, std::string("its HMAC key file (env ") + kKeyFileEnv + ")");
  given.standalone_only.push_back(sub->add_option("--lockd-bin", a.lockd_bin, "standalone: leasehold-lockd to run (default: next to this binary, or $PATH)"));
  given.standalone_only.push_back(sub->add_option("--supervisor-bin", a.supervisor_bin, "standalone: leasehold-supervisor to run"));
}

/// The timing: the standalone supervisor's flags, and the inputs of the pause budget.
void add_timing_options(CLI::App* sub, ProbeArgs& a, GivenOptions& given) {
  given.standalone_only.push_back(sub->add_option("--ttl-ms", a.ttl_ms, "standalone: lease TTL, ms")->capture_default_str()->check(CLI::Range(100, 600'000)));
  given.standalone_only.push_back(sub->add_option("--kill-after-ms", a.kill_after_ms,
                                                  "standalone: kill_after, ms; 0 = 70 % of the TTL (the default)")
                                      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{600'000})));
  given.standalone_only.push_back(sub->add_option("--heartbeat-interval-ms", a.heartbeat_interval_ms,
                                                  "standalone: heartbeat interval, ms; 0 = kill_after/7 (the default)")
                                      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{600'000})));
  given.kill_latency_budget = sub->add_option("--kill-latency-budget-ms", a.kill_latency_budget_ms,
                                              "kill latency budget, ms (standalone: passed to the supervisor; external: "
                                              "default the supervisor's own, from its status)")
                                  ->capture_default_str();
  given.clock_rate_bound = sub->add_option("--clock-rate-bound", a.clock_rate_bound,
                                           "rho, dimensionless, 0..0.1 (external: default the supervisor's own, from its status)")
                               ->capture_default_str();
}

/// The sweep: the pauses, how they are placed and frozen, the observers and the baseline.
void add_sweep_options(CLI::App* sub, ProbeArgs& a, GivenOptions& given) {
  sub->add_option("--steps", a.steps, "default sweep: this many steps from 0 to 2*ttl")->capture_default_str();
  given.pauses = sub->add_option("--pauses", a.pauses, "pause lengths instead of the default sweep: e.g. 0,250,500ms,1.5s");
  sub->add_option("--repeat", a.repeat, "trials per pause length")->capture_default_str();
  sub->add_option("--phase", a.phase,
                  "worst: drop refreshes at the probe's relay and freeze --guard-ms before valid_until (standalone; "
                  "the default there); random: freeze at a random moment of the heartbeat cycle")
      ->check(CLI::IsMember({"auto", "worst", "random"}));
  given.standalone_only.push_back(sub->add_option("--guard-ms", a.guard_ms,
                                                  "worst phase (standalone): start the freeze this long before "
                                                  "valid_until, ms; below kill_after")
                                      ->capture_default_str());
  sub->add_option("--baseline-ms", a.baseline_ms,
                  "before the sweep, run a named sandbox this long without pauses (clean lateness/RTT samples); 0 = none")
      ->capture_default_str();
  sub->add_option("--observer-priority", a.observer_priority,
                  "SCHED_FIFO priority of the probe's observer threads (0: normal priority)")
      ->capture_default_str()->check(CLI::Range(0, 98));
  sub->add_option("--freeze", a.freeze, "auto | cgroup | sigstop")->check(CLI::IsMember({"auto", "cgroup", "sigstop"}))->capture_default_str();
  sub->add_option("--contend-interval-ms", a.contend_interval_ms,
                  "the contender's acquire attempts, one per this many ms")->capture_default_str()->check(CLI::Range(1, 1000));
  sub->add_option("--seed", a.seed, "random phase seed (default: from the clock)");
}

/// The stress load during the sweep.
void add_stress_options(CLI::App* sub, ProbeArgs& a) {
  sub->add_flag("--stress", a.stress, "run stress-ng during the sweep (bounded in time)");
  sub->add_option("--stress-args", a.stress_args, "stress-ng arguments")->capture_default_str();
  sub->add_option("--stress-timeout-s", a.stress_timeout_s, "stress-ng --timeout, s (default: the sweep's estimate)");
}

/// Where the results go and what is printed.
void add_output_options(CLI::App* sub, ProbeArgs& a) {
  sub->add_option("--out", a.out_dir,
                  "output directory, created if missing (default ./pause-probe-<date>-<time>); an existing one is "
                  "reused: the probe's files in it (CSV, JSON, plot, sandbox logs) are replaced");
  sub->add_option("--csv", a.csv_path, "CSV path (default <out>/pause-probe.csv)");
  sub->add_option("--plot", a.plot, "auto (PNG through gnuplot, else SVG) | png | svg")->check(CLI::IsMember({"auto", "png", "svg"}));
  sub->add_flag("--json", a.json, "print the JSON summary on stdout (the table goes to stderr)");
  sub->add_flag("--quiet", a.quiet, "no progress lines");
}

const Command kPauseProbe([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ProbeArgs>();
  auto* sub = app.add_subcommand(
      "pause-probe",
      "Measure the pause tolerance: for each pause length, run a named sandbox, freeze the supervisor "
      "(cgroup v2 freeze, else SIGSTOP) that long, resume, and record whether the kill-switch fired "
      "before lockd's expiry, the margin, the mutex-violation window, recovery, and the sandbox's own "
      "check_deadline answers; writes a table, CSV, JSON and a plot (DESIGN.md \"Time\"; pause/README.md)");
  GivenOptions given;
  add_deployment_options(sub, *a, given);
  add_timing_options(sub, *a, given);
  add_sweep_options(sub, *a, given);
  add_stress_options(sub, *a);
  add_output_options(sub, *a);
  sub->callback([a, given, exit_code] {
    a->kill_latency_budget_set = given.kill_latency_budget->count() > 0;
    a->clock_rate_bound_set = given.clock_rate_bound->count() > 0;
    a->pauses_set = given.pauses->count() > 0;
    a->standalone_only_given.clear();
    for (const CLI::Option* o : given.standalone_only)
      if (o->count() > 0) a->standalone_only_given.push_back(o->get_name());
    *exit_code = run_probe(*a);
  });
});

const Command kPauseProbeSandbox([](CLI::App& app, int* exit_code) {
  auto a = std::make_shared<harness::PauseSandboxOptions>();
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
