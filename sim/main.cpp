// leasehold-sim: runs the deterministic simulator (leasehold/sim/world.hpp) for one seed or a range.
//
//   leasehold-sim --seed 42 --trace      replay one run with a readable trace
//   leasehold-sim --seeds 1..10000 --jobs 2
//
// Exit codes: 0 no invariant violated, 1 a violation (each failing seed is printed with the
// first invariant it broke), 2 usage or a malformed argument, 70 internal error.
#include "leasehold/lease/assert.hpp"
#include "leasehold/sim/world.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using leasehold::sim::FaultCounts;
using leasehold::sim::RunResult;
using leasehold::sim::SimConfig;

constexpr int kOk = 0, kViolation = 1, kUsage = 2, kInternal = 70;

struct Range {
  std::uint64_t first = 0, last = 0;
};

std::optional<Range> parse_range(const std::string& text) {
  const auto dots = text.find("..");
  if (dots == std::string::npos) return std::nullopt;
  try {
    std::size_t used = 0;
    const std::string a = text.substr(0, dots), b = text.substr(dots + 2);
    if (a.empty() || b.empty() || a[0] == '-' || b[0] == '-') return std::nullopt;
    Range r;
    r.first = std::stoull(a, &used);
    if (used != a.size()) return std::nullopt;
    r.last = std::stoull(b, &used);
    if (used != b.size() || r.last < r.first) return std::nullopt;
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// One result as a line for the pipe from a worker process.
std::string encode(const RunResult& r) {
  std::string s = std::to_string(r.seed) + ' ' + std::to_string(r.trace_hash) + ' ' + std::to_string(r.events) + ' ' +
                  std::to_string(r.simulated_ns);
#define LEASEHOLD_SIM_PUT(name, text) s += ' ' + std::to_string(r.counts.name);
  LEASEHOLD_SIM_FAULT_COUNTS(LEASEHOLD_SIM_PUT)
#undef LEASEHOLD_SIM_PUT
  if (r.violation) {
    std::string detail = r.violation->detail;
    for (char& c : detail)
      if (c == '\n' || c == '\t') c = ' ';
    s += " V " + r.violation->invariant + ' ' + std::to_string(r.violation->at_ns) + '\t' + detail;
  }
  return s + '\n';
}

std::optional<RunResult> decode(const std::string& line) {
  RunResult r;
  const char* p = line.c_str();
  char* end = nullptr;
  auto num = [&](std::uint64_t& out) {
    out = std::strtoull(p, &end, 10);
    if (end == p) return false;
    p = end;
    return true;
  };
  std::uint64_t sim_ns = 0;
  if (!num(r.seed) || !num(r.trace_hash) || !num(r.events) || !num(sim_ns)) return std::nullopt;
  r.simulated_ns = static_cast<std::int64_t>(sim_ns);
#define LEASEHOLD_SIM_GET(name, text) \
  if (!num(r.counts.name)) return std::nullopt;
  LEASEHOLD_SIM_FAULT_COUNTS(LEASEHOLD_SIM_GET)
#undef LEASEHOLD_SIM_GET
  if (std::strncmp(p, " V ", 3) == 0) {
    p += 3;
    const char* sp = std::strchr(p, ' ');
    const char* tab = std::strchr(p, '\t');
    if (sp == nullptr || tab == nullptr) return std::nullopt;
    leasehold::sim::Violation v;
    v.invariant.assign(p, sp);
    v.at_ns = std::strtoll(sp + 1, nullptr, 10);
    v.detail.assign(tab + 1);
    r.violation = v;
  }
  return r;
}

/// The seed being run in this process, for the abort handler: a LEASEHOLD_ASSERT in the real
/// code is one way the simulator finds a bug, and the seed must not be lost then.
volatile std::sig_atomic_t g_running = 0;
std::uint64_t g_seed = 0;

extern "C" void on_abort(int sig) {
  if (g_running != 0) {
    char line[96];
    const int n = std::snprintf(line, sizeof line, "seed %" PRIu64 ": aborted (an assertion or a crash in the run)\n", g_seed);
    if (n > 0) (void)!::write(STDERR_FILENO, line, static_cast<std::size_t>(n));
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

/// One seed; an exception from the run becomes that seed's failure (internal_error).
RunResult run_one(const SimConfig& cfg, const leasehold::sim::TraceFn& trace = {}) {
  g_seed = cfg.seed;
  g_running = 1;
  RunResult r;
  try {
    r = leasehold::sim::run_seed(cfg, trace);
  } catch (const std::exception& e) {
    r.seed = cfg.seed;
    r.violation = leasehold::sim::Violation{"internal_error", 0, e.what()};
  }
  g_running = 0;
  return r;
}

/// A strict unsigned decimal: digits only, no sign, no overflow.
std::optional<std::uint64_t> parse_u64(const std::string& text) {
  if (text.empty() || text.size() > 20 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  try {
    std::size_t used = 0;
    const std::uint64_t v = std::stoull(text, &used);
    if (used != text.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// The command line that replays seed `seed` exactly: a run depends on the seed and on the
/// options that change what is drawn (`extra`: --mode, --duration-s, --no-faults as given).
std::string replay_command(std::uint64_t seed, const std::string& extra) {
  return std::string(leasehold::sim::ablation_name().empty() ? "leasehold-sim"
                                                              : "leasehold-sim-" + std::string(leasehold::sim::ablation_name())) +
         " --seed " + std::to_string(seed) + extra;
}

std::string failure_line(const RunResult& r, const std::string& extra) {
  char at[32];
  std::snprintf(at, sizeof at, "%.6f", static_cast<double>(r.violation->at_ns) / 1e9);
  return "seed " + std::to_string(r.seed) + ": " + r.violation->invariant + " violated at " + at + " s: " +
         r.violation->detail + " (replay: " + replay_command(r.seed, extra) + " --trace)";
}

std::string hex64(std::uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, v);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  // Every slow assertion of the linked libraries (the codec's round trip, the sandbox table's
  // cross-check) runs here, before the sweep's threads start.
  leasehold::enable_slow_asserts();
  CLI::App app{
      "leasehold-sim: the deterministic simulator of lockd, supervisors, sandboxes and a fenced resource.\n"
      "One seed drives the network, the clocks, the disk and the processes, so a failure replays exactly.\n"
      "Exit codes: 0 no invariant violated, 1 a violation (each failing seed printed with the first\n"
      "invariant it broke), 2 usage, 70 internal error."};
  app.set_version_flag("--version", "leasehold-sim " LEASEHOLD_VERSION);
  std::optional<std::uint64_t> seed;
  std::string seed_text;
  std::string seeds_text;
  bool trace = false, json = false, stop_at_first = false, quiet = false, no_faults = false;
  unsigned jobs = 1;
  double duration_s = 0;
  auto* seed_opt = app.add_option("--seed", seed_text, "replay one run (0 <= N < 2^64)");
  auto* seeds_opt = app.add_option("--seeds", seeds_text, "sweep the seeds A..B (inclusive)");
  seed_opt->excludes(seeds_opt);
  app.add_flag("--trace", trace, "print the run's trace (with --seed; on stderr with --json)")->needs(seed_opt);
  app.add_flag("--json", json, "print a JSON summary on stdout");
  app.add_option("--jobs", jobs, "worker processes for a sweep (default 1)")->check(CLI::Range(1u, 256u))->excludes(seed_opt);
  app.add_flag("--stop-at-first", stop_at_first, "end a sweep at the first failing seed");
  app.add_flag("--quiet", quiet, "no progress on stderr");
  app.add_option("--duration-s", duration_s, "simulated seconds per run (default 120; faults heal 30 s before the end)")
      ->check(CLI::Range(40.0, 86400.0));
  app.add_flag("--no-faults", no_faults, "a reliable network, no pauses, crashes or clock skew");
  unsigned replicas = 0;
  app.add_option("--lockd-replicas", replicas,
                 "lockd on etcd: this many lockd replicas of one shard on a simulated etcd, with failovers "
                 "(2..5; default 1: one lockd on its disk, 3 in the builds of the cluster's ablations)")
      ->check(CLI::Range(1u, 5u));
  std::int64_t leader_lease_s = 0;
  app.add_option("--leader-lease-s", leader_lease_s,
                 "lockd on etcd: the replicas' leadership lease L in s (default: each seed draws 1 or 2, lockd's own default)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{10}));
  std::string mode = "mixed";
  app.add_option("--mode", mode,
                 "lock mode of lockd and the supervisors: lease, preemptible, or mixed (default: each seed draws "
                 "one, 30% preemptible; a seed replays with the mode it had in the sweep)")
      ->check(CLI::IsMember({"lease", "preemptible", "mixed"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }
  if (!seed_text.empty()) {
    seed = parse_u64(seed_text);
    if (!seed) {
      std::fprintf(stderr, "leasehold-sim: --seed: expected an unsigned decimal below 2^64, got \"%s\"\n", seed_text.c_str());
      return kUsage;
    }
  }
  if (!std::isfinite(duration_s)) {
    std::fprintf(stderr, "leasehold-sim: --duration-s must be a number of seconds in 40..86400\n");
    return kUsage;
  }
  std::signal(SIGABRT, on_abort);
  std::signal(SIGSEGV, on_abort);
  if (!seed && seeds_text.empty()) {
    std::fprintf(stderr, "leasehold-sim: give --seed N or --seeds A..B (see --help)\n");
    return kUsage;
  }
  Range range;
  if (seed) {
    range = Range{*seed, *seed};
  } else if (auto r = parse_range(seeds_text)) {
    range = *r;
  } else {
    std::fprintf(stderr, "leasehold-sim: --seeds: expected A..B with 0 <= A <= B, got \"%s\"\n", seeds_text.c_str());
    return kUsage;
  }

  // What a replay of one of these seeds must repeat besides the seed.
  std::string replay_extra;
  if (mode != "mixed") replay_extra += " --mode " + mode;
  if (duration_s > 0) {
    char d[48];
    std::snprintf(d, sizeof d, " --duration-s %g", duration_s);
    replay_extra += d;
  }
  if (no_faults) replay_extra += " --no-faults";
  if (replicas != 0) replay_extra += " --lockd-replicas " + std::to_string(replicas);
  if (leader_lease_s != 0) replay_extra += " --leader-lease-s " + std::to_string(leader_lease_s);
  SimConfig base;
  if (duration_s > 0) {
    base.duration_ns = static_cast<std::int64_t>(duration_s * 1e9);
    base.heal_ns = base.duration_ns - 30 * leasehold::sim::kS;
  }
  base.faults = !no_faults;
  // The cluster's ablations (a leader serving past its leadership lease, writes not guarded on
  // the leader's revision) exist only with several lockd.
  const std::string_view ablation = leasehold::sim::ablation_name();
  if (replicas == 0) replicas = ablation == "no-self-fence" || ablation == "unguarded-writes" ? 3 : 1;
  base.lockd_replicas = replicas;
  if (leader_lease_s != 0 && replicas < 2) {
    std::fprintf(stderr, "leasehold-sim: --leader-lease-s is the lease of several lockd replicas: give --lockd-replicas 2..5 too\n");
    return kUsage;
  }
  if (leader_lease_s != 0) base.leader_lease_s = leader_lease_s;
  if (mode == "lease") base.preemptible_share = 0;
  if (mode == "preemptible") base.preemptible_share = 1;
  if (const leasehold::Status why = base.validate(); !why.ok()) {
    std::fprintf(stderr, "leasehold-sim: bad configuration: %s\n", why.message().c_str());
    return kUsage;
  }

  const auto wall_start = std::chrono::steady_clock::now();
  // The number of seeds; 0 stands for all 2^64 of them (a sweep that never ends).
  const std::uint64_t total = range.last - range.first + 1;
  std::vector<RunResult> failures;
  FaultCounts sum;
  std::uint64_t done = 0, events = 0;
  std::int64_t simulated_ns = 0;
  std::uint64_t one_hash = 0;
  auto take = [&](const RunResult& r) {
    ++done;
    sum += r.counts;
    events += r.events;
    simulated_ns += r.simulated_ns;
    one_hash = r.trace_hash;
    if (r.violation) {
      failures.push_back(r);
      // With --json, stdout is the JSON document alone.
      std::fprintf(json ? stderr : stdout, "%s\n", failure_line(r, replay_extra).c_str());
      std::fflush(json ? stderr : stdout);
    }
  };
  auto progress = [&](bool last) {
    if (quiet || total == 1) return;
    static auto next = std::chrono::steady_clock::now();
    const auto now = std::chrono::steady_clock::now();
    if (!last && now < next) return;
    next = now + std::chrono::seconds(2);
    const double wall = std::chrono::duration<double>(now - wall_start).count();
    const std::string of = total == 0 ? std::string("2^64") : std::to_string(total);
    std::fprintf(stderr, "leasehold-sim: %" PRIu64 "/%s seeds, %zu failing, %.1f s\n", done, of.c_str(),
                 failures.size(), wall);
  };

  try {
    if (seed) {
      SimConfig cfg = base;
      cfg.seed = *seed;
      leasehold::sim::TraceFn fn;
      // With --json, stdout is the JSON document alone: the trace goes to stderr then.
      FILE* const trace_to = json ? stderr : stdout;
      if (trace) fn = [trace_to](std::string_view line) {
        std::fprintf(trace_to, "%.*s\n", static_cast<int>(line.size()), line.data());
      };
      take(run_one(cfg, fn));
    } else if (jobs == 1) {
      for (std::uint64_t s = range.first; s <= range.last; ++s) {
        SimConfig cfg = base;
        cfg.seed = s;
        take(run_one(cfg));
        progress(false);
        if (stop_at_first && !failures.empty()) break;
        if (s == range.last) break;
      }
    } else {
      // Worker processes take every jobs-th seed and stream one line per result.
      std::fflush(stdout);
      std::vector<pid_t> pids;
      std::vector<FILE*> pipes;
      for (unsigned j = 0; j < jobs; ++j) {
        int fds[2];
        if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
        const pid_t pid = ::fork();
        if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
        if (pid == 0) {
          ::close(fds[0]);
          FILE* out = ::fdopen(fds[1], "w");
          for (std::uint64_t s = range.first + j; s >= range.first && s <= range.last; s += jobs) {
            SimConfig cfg = base;
            cfg.seed = s;
            const std::string line = encode(run_one(cfg));
            std::fputs(line.c_str(), out);
            std::fflush(out);
            if (range.last - s < jobs) break;
          }
          std::fclose(out);
          ::_exit(0);
        }
        ::close(fds[1]);
        pids.push_back(pid);
        pipes.push_back(::fdopen(fds[0], "r"));
      }
      // Read the pipes round-robin, one line at a time (each worker writes in seed order).
      std::vector<bool> open(jobs, true);
      std::size_t alive = jobs;
      char buf[8192];
      while (alive > 0 && !(stop_at_first && !failures.empty())) {
        for (unsigned j = 0; j < jobs; ++j) {
          if (!open[j]) continue;
          if (std::fgets(buf, sizeof buf, pipes[j]) == nullptr) {
            open[j] = false;
            --alive;
            continue;
          }
          std::string line(buf);
          if (!line.empty() && line.back() == '\n') line.pop_back();
          const auto r = decode(line);
          if (!r) throw std::runtime_error("a worker process sent a malformed result: " + line);
          take(*r);
          progress(false);
        }
      }
      for (pid_t p : pids) {
        if (stop_at_first) ::kill(p, SIGTERM);
        int status = 0;
        ::waitpid(p, &status, 0);
        if (!stop_at_first && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
          throw std::runtime_error("a worker process failed");
      }
      for (FILE* f : pipes) std::fclose(f);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leasehold-sim: internal error: %s\n", e.what());
    return kInternal;
  }
  progress(true);

  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  const double sim_s = static_cast<double>(simulated_ns) / 1e9;
  if (json) {
    nlohmann::json j;
    j["ablation"] = std::string(leasehold::sim::ablation_name());
    j["seeds"] = {{"first", range.first}, {"last", range.last}, {"run", done}};
    j["failures"] = nlohmann::json::array();
    for (const RunResult& r : failures)
      j["failures"].push_back({{"seed", r.seed},
                               {"replay", replay_command(r.seed, replay_extra)},  // exact above 2^53 too
                               {"invariant", r.violation->invariant},
                               {"at_ns", r.violation->at_ns},
                               {"detail", r.violation->detail}});
    j["events"] = events;
    j["simulated_s"] = sim_s;
    j["wall_s"] = wall_s;
    j["simulated_s_per_wall_s"] = wall_s > 0 ? sim_s / wall_s : 0.0;
    j["seeds_per_minute"] = wall_s > 0 ? static_cast<double>(done) * 60.0 / wall_s : 0.0;
    if (done == 1) j["trace_hash"] = hex64(one_hash);  // as the text output prints it
    nlohmann::json f;
#define LEASEHOLD_SIM_JSON(name, text) f[#name] = sum.name;
    LEASEHOLD_SIM_FAULT_COUNTS(LEASEHOLD_SIM_JSON)
#undef LEASEHOLD_SIM_JSON
    j["counts"] = f;
    std::printf("%s\n", j.dump(2).c_str());
  } else if (done == 1 && failures.empty()) {
    std::printf("seed %" PRIu64 ": no invariant violated (%.0f simulated s, %" PRIu64 " events, trace hash %016" PRIx64
                ")\n",
                range.first, sim_s, events, one_hash);
  } else if (failures.empty()) {
    std::printf("%" PRIu64 " seeds: no invariant violated (%.0f simulated s in %.1f s: %.0f simulated s per s, %.0f "
                "seeds per minute)\n",
                done, sim_s, wall_s, wall_s > 0 ? sim_s / wall_s : 0.0, wall_s > 0 ? done * 60.0 / wall_s : 0.0);
  }
  return failures.empty() ? kOk : kViolation;
}
