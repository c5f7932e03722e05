// leasehold_killswitch_latency: measurements behind perf/supervisor/killswitch_latency.sh.
//
//   lateness  the rt thread's wake-up lateness: the supervisor's own RtThread (SCHED_FIFO, pinned,
//             mlockall) ticking every --tick-us; every tick's lateness is kept (no log2 buckets),
//             so p50/p99/max are exact and comparable with cyclictest run on the same CPU.
//   kills     kill-switch latency on real processes: `sleep` sandboxes in cgroup v2 leaves (or
//             process groups), each armed with a deadline on the RtThread; per kill
//             deadline → issued (cgroup.kill written), deadline → confirmed (populated 0 / pidfd),
//             deadline → exit seen by a poll on the pidfd from another thread (the io thread's
//             view, when it can reap).
//   register  N synthetic named leases through a supervisor's control socket, over T parallel
//             connections (for the CPU measurement at 10,000 sandboxes).
//   spawn     sandbox start latency (spawn request -> the command's first write, to a pipe) and
//             kill latency (kill -> pidfd exit and an empty leaf) of the isolated spawn, the
//             unisolated one, and `bwrap --unshare-all` (skipped, with the reason, where bwrap
//             cannot run), as ratios in one run; and the isolated kill latency against the
//             kill-latency budget and the pause budget of the supervisor's default timing.
//             "isolated" is the supervisor's start: prepare_sandbox (the child stops before its
//             exec; the supervisor arms its deadline there) then release_sandbox;
//             "isolated_one_step" is the same sandbox through spawn_sandbox (exec at once, the
//             start before issue 14), and `ratio_gate` compares the two.
// `kills --isolation` kills isolated sandboxes (the supervisor's default) through the RtThread.
// Output: one JSON object on stdout.
#include "leasehold/supervisor/cgroup.hpp"
#include "leasehold/supervisor/config.hpp"
#include "leasehold/supervisor/control.hpp"
#include "leasehold/supervisor/kill_switch.hpp"
#include "leasehold/supervisor/rt_thread.hpp"
#include "leasehold/supervisor/spawn.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

namespace {

using namespace leasehold;
using nlohmann::json;

json percentiles_us(std::vector<std::int64_t> ns) {
  if (ns.empty()) return json{{"samples", 0}};
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    const std::size_t i = std::min(ns.size() - 1, static_cast<std::size_t>(q * static_cast<double>(ns.size())));
    return static_cast<double>(ns[i]) / 1000.0;
  };
  double sum = 0;
  for (auto v : ns) sum += static_cast<double>(v);
  const double min_us = static_cast<double>(ns.front()) / 1000.0;
  return json{{"samples", ns.size()}, {"min_us", min_us}, {"p50_us", at(0.50)}, {"p99_us", at(0.99)}, {"p999_us", at(0.999)},
              {"max_us", static_cast<double>(ns.back()) / 1000.0},
              {"mean_us", sum / static_cast<double>(ns.size()) / 1000.0}};
}

bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

// ---- lateness --------------------------------------------------------------------------------

struct LatenessSink {
  std::vector<std::uint64_t> samples;  // preallocated: the hook must not allocate
  std::atomic<std::size_t> n{0};
};

int run_lateness(int seconds, int cpu, int priority, int tick_us) {
  LatenessSink sink;
  sink.samples.resize(static_cast<std::size_t>(seconds) * 1'000'000 / static_cast<std::size_t>(tick_us) + 1000);
  RtConfig cfg;
  cfg.slots = 1;
  cfg.granularity_ns = static_cast<std::uint64_t>(tick_us) * 1000;
  cfg.priority = priority;
  cfg.cpu = cpu;
  cfg.lock_memory = !sanitized();
  RtHooks hooks;
  hooks.context = &sink;
  hooks.record_lateness = [](void* c, std::uint64_t l) {
    auto* s = static_cast<LatenessSink*>(c);
    const std::size_t i = s->n.load(std::memory_order_relaxed);
    if (i < s->samples.size()) {
      s->samples[i] = l;
      s->n.store(i + 1, std::memory_order_release);
    }
  };
  RtStartStatus status;
  auto started = RtThread::start(cfg, hooks, status);
  if (!started) {
    std::fprintf(stderr, "rt thread: %s\n", started.message().c_str());
    return 1;
  }
  auto rt = std::move(started).value();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  rt->stop();
  std::vector<std::int64_t> v(sink.samples.begin(),
                              sink.samples.begin() + static_cast<std::ptrdiff_t>(sink.n.load()));
  if (v.size() > 10) v.erase(v.begin(), v.begin() + 10);  // start-up ticks
  json out = {{"measure", "rt_wakeup_lateness"}, {"tick_us", tick_us}, {"cpu", cpu},
              {"sched_fifo", status.fifo}, {"priority", priority}, {"memory_locked", status.memory_locked},
              {"lateness", percentiles_us(v)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The isolation the supervisor gives a sandbox (supervisor/spawn.hpp "Isolation"): root's
// sandboxes as a subordinate uid, another caller's as its own; the seccomp filter; the host
// cgroup tree hidden.
struct IsolationSetup {
  SeccompFilter filter;
  Isolation iso;
  std::string error;
  explicit IsolationSetup(const CgroupTree& tree) {
    auto f = build_seccomp_filter();
    if (!f) {
      error = f.message();
      return;
    }
    filter = std::move(f).value();
    iso.uid = ::geteuid() == 0 ? kDefaultSandboxUidFirst : ::geteuid();
    iso.gid = ::geteuid() == 0 ? kDefaultSandboxUidFirst : ::getegid();
    iso.seccomp = &filter;
    iso.nproc_max = 1024;
    iso.hide = {"/sys/fs/cgroup"};
    if (!tree.mount_point().empty()) iso.hide.push_back(tree.mount_point());
    if (const Status why = probe_isolation(iso, "true"); !why.ok()) error = why.message();
  }
};

// ---- kills -----------------------------------------------------------------------------------

struct KillSink {
  std::vector<KillRecord> records;
  std::vector<std::atomic<bool>> done;
  explicit KillSink(std::size_t n) : records(n), done(n) {}
};

int run_kills(int count, int batch, int cpu, int priority, bool isolated) {
  CgroupConfig cc;
  CgroupTree tree = CgroupTree::discover(cc);
  const bool cgroups = tree.mode() == KillMode::cgroup_v2_delegated;
  std::optional<IsolationSetup> isolation;
  if (isolated) {
    isolation.emplace(tree);
    if (!isolation->error.empty()) {
      std::fprintf(stderr, "isolation: %s\n", isolation->error.c_str());
      return 1;
    }
  }
  // Signed: the wheel rounds kill deadlines down, so a kill may be issued before its deadline.
  std::vector<std::int64_t> to_issued, to_confirmed, to_exit_seen;
  int errors = 0;
  for (int done_total = 0; done_total < count;) {
    const int n = std::min(batch, count - done_total);
    KillSink sink(static_cast<std::size_t>(n));
    RtConfig cfg;
    cfg.slots = static_cast<std::uint32_t>(n);
    cfg.priority = priority;
    cfg.cpu = cpu;
    cfg.lock_memory = !sanitized();
    RtHooks hooks;
    hooks.context = &sink;
    hooks.record_kill = [](void* c, std::uint32_t slot, const KillRecord& r) {
      auto* s = static_cast<KillSink*>(c);
      s->records[slot] = r;
      s->done[slot].store(true, std::memory_order_release);
    };
    RtStartStatus status;
    auto started = RtThread::start(cfg, hooks, status);
    if (!started) {
      std::fprintf(stderr, "rt thread: %s\n", started.message().c_str());
      return 1;
    }
    auto rt = std::move(started).value();
    std::vector<std::optional<CgroupLeaf>> leaves(static_cast<std::size_t>(n));
    std::vector<SandboxProcess> procs(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      SpawnRequest sr;
      sr.argv = {"sleep", "60"};
      sr.env = {"PATH=/usr/bin:/bin"};
      if (isolation) sr.isolation = &isolation->iso;
      if (cgroups) {
        auto made = tree.create_leaf("perf-" + std::to_string(::getpid()) + "-" + std::to_string(done_total + i));
        if (!made) {
          std::fprintf(stderr, "%s\n", made.message().c_str());
          return 1;
        }
        leaves[static_cast<std::size_t>(i)] = std::move(made).value();
        sr.cgroup_dir_fd = leaves[static_cast<std::size_t>(i)]->dir_fd();
      }
      SpawnError se;
      auto p = spawn_sandbox(sr, se);
      if (!p) {
        std::fprintf(stderr, "spawn: %s\n", se.message.c_str());
        return 1;
      }
      procs[static_cast<std::size_t>(i)] = std::move(*p);
    }
    // Deadlines spread over the next 0.5 s, 3 ms apart, so kills do not pile into one tick.
    const std::uint64_t base = KillSwitch::now_ns() + 100'000'000;
    for (int i = 0; i < n; ++i) {
      KillTarget t;
      const auto& leaf = leaves[static_cast<std::size_t>(i)];
      t.cgroup_kill_fd = leaf ? leaf->kill_fd() : -1;
      t.cgroup_events_fd = leaf ? leaf->events_fd() : -1;
      t.pidfd = procs[static_cast<std::size_t>(i)].pidfd();
      t.pgid = procs[static_cast<std::size_t>(i)].pgid();
      rt->arm(static_cast<std::uint32_t>(i), base + static_cast<std::uint64_t>(i) * 3'000'000, t);
    }
    // The io thread's view: the time a poll on the pidfd returns.
    std::vector<std::uint64_t> exit_seen(static_cast<std::size_t>(n), 0);
    int remaining = n;
    const std::uint64_t give_up = KillSwitch::now_ns() + 10'000'000'000ull;
    while (remaining > 0 && KillSwitch::now_ns() < give_up) {
      std::vector<pollfd> fds;
      std::vector<int> idx;
      for (int i = 0; i < n; ++i)
        if (exit_seen[static_cast<std::size_t>(i)] == 0) {
          fds.push_back({procs[static_cast<std::size_t>(i)].pidfd(), POLLIN, 0});
          idx.push_back(i);
        }
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      const std::uint64_t now = KillSwitch::now_ns();
      for (std::size_t k = 0; k < fds.size(); ++k)
        if (fds[k].revents & POLLIN) {
          exit_seen[static_cast<std::size_t>(idx[k])] = now;
          --remaining;
        }
    }
    for (int i = 0; i < n; ++i) {
      while (!sink.done[static_cast<std::size_t>(i)].load(std::memory_order_acquire) &&
             KillSwitch::now_ns() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int i = 0; i < n; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      const KillRecord& r = sink.records[ui];
      rt->disarm(static_cast<std::uint32_t>(i));
      if (r.error != 0 || r.confirmed_ns == 0) {
        ++errors;
        continue;
      }
      const std::uint64_t d = base + ui * 3'000'000;  // as armed (the record's deadline is the same)
      const auto sd = static_cast<std::int64_t>(d);
      to_issued.push_back(static_cast<std::int64_t>(r.issued_ns) - sd);
      to_confirmed.push_back(static_cast<std::int64_t>(r.confirmed_ns) - sd);
      if (exit_seen[ui] != 0) to_exit_seen.push_back(static_cast<std::int64_t>(exit_seen[ui]) - sd);
    }
    rt->stop();
    for (int i = 0; i < n; ++i) {
      siginfo_t info{};
      reap(procs[static_cast<std::size_t>(i)].pidfd(), info, true);
      if (auto& leaf = leaves[static_cast<std::size_t>(i)]; leaf && !leaf->remove().ok())
        std::fprintf(stderr, "cgroup leaf %s left behind\n", leaf->path().c_str());
    }
    done_total += n;
  }
  json out = {{"measure", "kill_switch_latency"}, {"kill_mode", describe(tree.mode())}, {"isolation", isolated},
              {"deadline_to_issued", percentiles_us(to_issued)},
              {"deadline_to_confirmed", percentiles_us(to_confirmed)},
              {"deadline_to_exit_seen", percentiles_us(to_exit_seen)}, {"errors", errors}};
  std::printf("%s\n", out.dump().c_str());
  return errors == 0 ? 0 : 1;
}

// ---- spawn ---------------------------------------------------------------------------------

struct SpawnMode {
  std::string name;
  const Isolation* isolation = nullptr;
  std::vector<std::string> prefix;  // bwrap and its arguments, before the command
  bool gated = false;               // prepare_sandbox + release_sandbox (the supervisor's start)
};

// One start: request -> the command's first write reaches the pipe; then waits for its exit.
// One kill: a running `sleep` (it said so on the pipe) -> KillSwitch::kill -> dead (the pidfd
// reports the exit and the leaf is empty). -1 on a failure (`error` says which).
std::int64_t measure_once(const SpawnMode& m, const CgroupTree& tree, bool kill, int serial, std::string& error) {
  const bool cgroups = tree.mode() == KillMode::cgroup_v2_delegated;
  std::optional<CgroupLeaf> leaf;
  if (cgroups) {
    auto made = tree.create_leaf("perf-spawn-" + std::to_string(::getpid()) + "-" + std::to_string(serial));
    if (!made) {
      error = made.message();
      return -1;
    }
    leaf = std::move(made).value();
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    error = "pipe2 failed";
    return -1;
  }
  SpawnRequest sr;
  sr.argv = m.prefix;
  if (kill) sr.argv.insert(sr.argv.end(), {"/bin/sh", "-c", "echo r; exec sleep 60"});
  else sr.argv.insert(sr.argv.end(), {"/bin/echo", "x"});
  sr.env = {"PATH=/usr/bin:/bin"};
  sr.isolation = m.isolation;
  sr.cgroup_dir_fd = leaf ? leaf->dir_fd() : -1;
  sr.stdout_fd = p[1];
  SpawnError se;
  const std::uint64_t t0 = KillSwitch::now_ns();
  std::optional<SandboxProcess> proc;
  if (m.gated) {
    if (auto prepared = prepare_sandbox(sr, se)) {
      proc = std::move(prepared->process());
      // Here the supervisor arms the deadline (RtThread::arm: one wait-free queue push).
      if (!release_sandbox(*prepared, se)) {
        siginfo_t gone{};
        reap(proc->pidfd(), gone, true);
        proc.reset();
      }
    }
  } else {
    proc = spawn_sandbox(sr, se);
  }
  ::close(p[1]);
  if (!proc) {
    ::close(p[0]);
    error = m.name + ": " + se.message;
    return -1;
  }
  pollfd pf{p[0], POLLIN, 0};
  const bool said = ::poll(&pf, 1, 10'000) == 1 && (pf.revents & POLLIN) != 0;
  const std::uint64_t t1 = KillSwitch::now_ns();
  ::close(p[0]);
  std::int64_t result = said ? static_cast<std::int64_t>(t1 - t0) : -1;
  if (!said) error = m.name + ": no output within 10 s";
  const KillTarget target{leaf ? leaf->kill_fd() : -1, leaf ? leaf->events_fd() : -1, proc->pidfd(), proc->pgid()};
  if (kill && said) {
    const std::uint64_t k0 = KillSwitch::now_ns();
    const KillRecord rec = KillSwitch::kill(target, k0);
    pollfd dead{proc->pidfd(), POLLIN, 0};
    ::poll(&dead, 1, 10'000);
    while (leaf && leaf->populated() == 1 && KillSwitch::now_ns() - k0 < 10'000'000'000ull) {
      pollfd ev{leaf->events_fd(), POLLPRI, 0};
      ::poll(&ev, 1, 10);
    }
    result = rec.error == 0 ? static_cast<std::int64_t>(KillSwitch::now_ns() - k0) : -1;
    if (rec.error != 0) error = m.name + ": kill failed: " + std::strerror(-rec.error);
  } else if (kill) {
    KillSwitch::kill(target, KillSwitch::now_ns());
  }
  siginfo_t info{};
  reap(proc->pidfd(), info, true);
  if (leaf)
    for (int i = 0; i < 1000 && leaf->remove().code() == Errc::busy; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return result;
}

int run_spawn(int runs, const std::string& bwrap_path) {
  CgroupConfig cc;
  const CgroupTree tree = CgroupTree::discover(cc);
  IsolationSetup isolation(tree);
  if (!isolation.error.empty()) {
    std::fprintf(stderr, "isolated spawn unavailable: %s\n", isolation.error.c_str());
    return 1;
  }
  std::vector<SpawnMode> modes = {{"isolated", &isolation.iso, {}, true},
                                  {"isolated_one_step", &isolation.iso, {}, false},
                                  {"unisolated", nullptr, {}, true}};
  BwrapConfig bw;
  bw.bwrap_path = bwrap_path;
  bw.args = {"--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--die-with-parent"};
  const Status bwrap_probe = probe_bwrap(bw);
  const std::string bwrap_skipped = bwrap_probe.message();
  if (bwrap_probe.ok()) {
    const Result<std::string> path = resolve_command(bwrap_path, "/usr/local/bin:/usr/bin:/bin");
    SpawnMode b{"bwrap", nullptr, {path.ok() ? *path : bwrap_path}, true};
    b.prefix.insert(b.prefix.end(), bw.args.begin(), bw.args.end());
    b.prefix.push_back("--");
    modes.push_back(std::move(b));
  }
  json out = {{"measure", "sandbox_start_and_kill"}, {"kill_mode", describe(tree.mode())}, {"runs", runs},
              {"start", "spawn request -> the command's first write (/bin/echo) on a pipe"},
              {"kill", "KillSwitch::kill -> pidfd exit and leaf populated 0"}};
  if (!bwrap_skipped.empty()) out["bwrap_skipped"] = bwrap_skipped;
  std::map<std::string, std::vector<std::int64_t>> start, kill;
  int serial = 0;
  // Interleaved, so a change of the machine's load hits every mode alike, in a fresh order each
  // round (a fixed seed): a start right after bwrap's kill (whose namespaces the kernel tears
  // down afterwards) measured about 150 us slower, so in a fixed order the mode that follows
  // bwrap would pay for it in every round and bias the ratios.
  std::vector<std::size_t> order(modes.size());
  for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::mt19937 shuffle_rng(20261201);
  for (int r = 0; r < runs; ++r) {
    std::shuffle(order.begin(), order.end(), shuffle_rng);
    for (const std::size_t j : order)
      for (const bool k : {false, true}) {
        const SpawnMode& m = modes[j];
        std::string error;
        const std::int64_t ns = measure_once(m, tree, k, serial++, error);
        if (ns < 0) {
          std::fprintf(stderr, "%s\n", error.c_str());
          return 1;
        }
        (k ? kill : start)[m.name].push_back(ns);
      }
  }
  auto p = [](std::vector<std::int64_t> v, double q) {
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))]);
  };
  for (const auto& m : modes) {
    out["start_" + m.name] = percentiles_us(start[m.name]);
    out["kill_" + m.name] = percentiles_us(kill[m.name]);
  }
  for (const auto& [other, key] : {std::pair<std::string, const char*>{"unisolated", "vs_unisolated"},
                                   std::pair<std::string, const char*>{"bwrap", "vs_bwrap"},
                                   std::pair<std::string, const char*>{"isolated_one_step", "gate"}}) {
    if (start.count(other) == 0) continue;
    out["ratio_" + std::string(key)] = {
        {"start_p50", p(start["isolated"], 0.5) / p(start[other], 0.5)},
        {"start_p99", p(start["isolated"], 0.99) / p(start[other], 0.99)},
        {"kill_p50", p(kill["isolated"], 0.5) / p(kill[other], 0.5)},
        {"kill_p99", p(kill["isolated"], 0.99) / p(kill[other], 0.99)}};
  }
  // The supervisor's default timing: its kill-latency budget is a term of the safety condition,
  // and the pause budget is what is left of the TTL (what the supervisor prints at start-up).
  const SupervisorConfig defaults;
  const std::int64_t pause_ns = timing::check_safety(timing::inputs_of(defaults)).pause_budget_ns;
  const double kill_p99_ns = p(kill["isolated"], 0.99);
  out["isolated_kill_p99_ms"] = kill_p99_ns / 1e6;
  out["kill_latency_budget_ms"] = defaults.kill_latency_budget_ms;
  out["pause_budget_ms"] = static_cast<double>(pause_ns) / 1e6;
  out["isolated_kill_p99_within_kill_latency_budget"] =
      kill_p99_ns <= static_cast<double>(defaults.kill_latency_budget_ms) * 1e6;
  out["isolated_kill_p99_within_pause_budget"] = kill_p99_ns <= static_cast<double>(pause_ns);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---- register --------------------------------------------------------------------------------

int run_register(const std::string& socket, int count, int threads, const std::string& prefix) {
  std::atomic<int> next{0}, ok{0}, failed{0};
  std::vector<std::thread> pool;
  std::string first_error;
  std::mutex m;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < count; i = next++) {
        auto a = control_call(socket,
                              json{{"v", 1}, {"op", "run"}, {"name", prefix + std::to_string(i)}, {"argv", {"true"}}},
                              10'000);
        if (a && (*a)["ok"] == true) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard<std::mutex> g(m);
          if (first_error.empty()) first_error = a ? a->dump() : a.message();
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  json out = {{"measure", "register"}, {"ok", ok.load()}, {"failed", failed.load()}, {"first_error", first_error}};
  std::printf("%s\n", out.dump().c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"leasehold_killswitch_latency: rt wake-up lateness, kill-switch latency, lease registration"};
  app.require_subcommand(1);
  int seconds = 10, cpu = -1, priority = 50, tick_us = 1000, count = 200, batch = 50, threads = 16;
  std::string socket, prefix = "perf-";
  auto* late = app.add_subcommand("lateness", "rt thread wake-up lateness");
  late->add_option("--seconds", seconds, "duration, s");
  late->add_option("--cpu", cpu, "CPU to pin to (-1: none)");
  late->add_option("--priority", priority, "SCHED_FIFO priority");
  late->add_option("--tick-us", tick_us, "tick, us");
  auto* kills = app.add_subcommand("kills", "kill-switch latency on real processes");
  kills->add_option("--count", count, "kills");
  kills->add_option("--batch", batch, "sandboxes alive at once");
  kills->add_option("--cpu", cpu, "CPU to pin the rt thread to (-1: none)");
  kills->add_option("--priority", priority, "SCHED_FIFO priority");
  bool isolated = false;
  kills->add_flag("--isolation", isolated, "isolated sandboxes (the supervisor's default spawn)");
  int runs = 30;
  std::string bwrap = "bwrap";
  auto* spawn = app.add_subcommand("spawn", "start and kill latency: isolated vs unisolated vs bwrap --unshare-all");
  spawn->add_option("--runs", runs, "starts and kills per mode")->check(CLI::Range(1, 100000));
  spawn->add_option("--bwrap", bwrap, "bubblewrap binary (a name looked up in PATH, or a path)");
  auto* reg = app.add_subcommand("register", "register synthetic named leases through a supervisor");
  reg->add_option("--socket", socket, "control socket")->required();
  reg->add_option("--count", count, "leases");
  reg->add_option("--threads", threads, "parallel connections");
  reg->add_option("--prefix", prefix, "name prefix");
  CLI11_PARSE(app, argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  if (*late) return run_lateness(seconds, cpu, priority, tick_us);
  if (*kills) return run_kills(count, batch, cpu, priority, isolated);
  if (*spawn) return run_spawn(runs, bwrap);
  return run_register(socket, count, threads, prefix);
}
