// leasehold-failover-bench: how long a lockd cluster on etcd takes to fail over (issue 18,
// Performance: "failover time, leader killed -> first answered request from the new leader,
// p50/p99 over 20 kills"), against the failover bound the cluster states, in the same run.
//
// It starts an etcd cluster (--etcd-members, default 3) and --lockds lockd on it (default 3,
// harness::LockdCluster), then keeps a supervisor-like load going: --workers threads, each a
// worker holding --names names that it refreshes every --heartbeat-ms in one heartbeat (as a
// supervisor batches them) and acquiring and releasing one more name every round, each through
// a client that follows the leader (--lockd A,B,C). Meanwhile one probe per lockd asks it, every
// --probe-ms, about a name (`show`: only a leader answers it). Then --kills times: wait
// --settle-ms, kill the leader (-9; --mode stop: SIGSTOP until another took over, then SIGCONT;
// --mode both: alternately), wait for the takeover, restart the killed lockd on its address.
//
// Per kill: "takeover", from the kill to the new leader's `event=leading` line (its own clock
// reading, the same boot clock); "first answer", from the kill to the first probe answered by
// another lockd as the leader. Both as p50/p99/max (nearest rank) next to the bound, and the
// load's count of refreshes answered `lost`/`unknown` (a failover must lose no lease: 0). Exit
// 1 when a first answer came later than the bound or a lease was lost; 2 on a usage error or
// when the cluster cannot be started.
#include "leasehold/harness/etcd.hpp"
#include "leasehold/harness/lockd_cluster.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/auth.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#ifndef LEASEHOLD_LOCKD_BINARY
#define LEASEHOLD_LOCKD_BINARY "leasehold-lockd"
#endif

namespace {

using namespace leasehold;
using harness::now_ns;
using std::chrono::milliseconds;

struct Options {
  unsigned kills = 20;
  std::string mode = "kill";  // kill | stop | both
  int etcd_members = 3;
  unsigned lockds = 3;
  int leader_lease_s = 1;
  std::uint64_t ttl_ms = 6000;
  unsigned workers = 4;
  unsigned names = 16;
  unsigned heartbeat_ms = 200;
  unsigned probe_ms = 2;
  unsigned settle_ms = 1000;
  std::string lockd_binary = LEASEHOLD_LOCKD_BINARY;
  bool json = false;
  bool keep = false;
};

/// The load: workers refreshing their names, and acquiring and releasing one more each round.
struct LoadCounters {
  std::atomic<std::uint64_t> refreshed{0}, lost{0}, unanswered{0}, acquires{0}, releases{0}, refused{0};
};

void run_worker(const harness::LockdCluster& cluster, const Options& o, unsigned w, const std::atomic<bool>& stop,
                LoadCounters& c) {
  const WorkerId worker{0xfa11, w + 1u};
  lockd::AdminClient client(cluster.socket_addresses(), cluster.key(), worker, 2000 * kNsPerMs);
  std::vector<wire::HeartbeatEntry> held;
  for (unsigned i = 0; i < o.names && !stop; ++i) {
    const std::string name = "perf/w" + std::to_string(w) + "/n" + std::to_string(i);
    const SandboxId sandbox{0x5a, (std::uint64_t{w} << 32) | i};
    const lockd::Answer a = client.acquire(name, sandbox, worker);
    if (const auto* g = a.as<wire::Grant>()) {
      held.push_back({name_id_of(name), sandbox, g->epoch});
      ++c.acquires;
    } else {
      --i;  // no leader yet, or the answer was lost: again
      harness::sleep_ms(50);
    }
  }
  const std::string churn = "perf/w" + std::to_string(w) + "/churn";
  const SandboxId churn_sandbox{0x5b, w};
  std::int64_t next = now_ns();
  while (!stop) {
    for (std::size_t off = 0; off < held.size(); off += wire::kHeartbeatEntriesMax) {
      const std::size_t n = std::min(held.size() - off, wire::kHeartbeatEntriesMax);
      const lockd::Answer a = client.heartbeat(std::span(held).subspan(off, n));
      if (const auto* ack = a.as<wire::HeartbeatAck>()) {
        for (const auto& e : ack->entries) (e.status == RefreshStatus::refreshed ? c.refreshed : c.lost)++;
      } else {
        ++c.unanswered;
      }
    }
    const lockd::Answer a = client.acquire(churn, churn_sandbox, worker);
    if (const auto* g = a.as<wire::Grant>()) {
      ++c.acquires;
      const lockd::Answer r = client.release(name_id_of(churn), churn_sandbox, g->epoch);
      if (r.as<wire::Ok>() != nullptr) ++c.releases;
    } else {
      ++c.refused;  // a grant whose answer was lost is still held: refused until it expires
    }
    next += static_cast<std::int64_t>(o.heartbeat_ms) * kNsPerMs;
    harness::sleep_until_ns(std::max(next, now_ns()));
  }
}

/// One probe per lockd: the times at which it answered as the leader.
struct Probe {
  std::mutex mu;
  std::vector<std::int64_t> led_at;  // guarded by mu
};

void run_probe(const harness::LockdCluster& cluster, const Options& o, std::size_t i, const std::string& name,
               const std::atomic<bool>& stop, Probe& p) {
  lockd::AdminClient client(cluster.address(i), cluster.key(), {}, 20 * kNsPerMs);
  while (!stop) {
    // Answered at all (the name's record, or unknown_name): only a leader answers; a follower
    // says not_leader, which a client of one address asks again until its timeout.
    const lockd::Answer a = client.show(name);
    if (a.ok()) {
      const std::int64_t t = now_ns();
      const std::lock_guard g(p.mu);
      p.led_at.push_back(t);
    }
    harness::sleep_ms(o.probe_ms);
  }
}

struct Kill {
  int lockd = -1;
  bool stopped = false;
  std::int64_t at_ns = 0;
  std::int64_t takeover_ms = -1, first_answer_ms = -1;
  int new_leader = -1;
};

struct Stats {
  std::int64_t p50 = 0, p99 = 0, max = 0;
};
Stats stats_of(std::vector<std::int64_t> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {
    const auto k = static_cast<std::size_t>(std::max(1.0, std::ceil(q * static_cast<double>(v.size()))));
    return v[std::min(k, v.size()) - 1];
  };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.max = v.back();
  return s;
}

int fail(const std::string& why) {
  std::fprintf(stderr, "leasehold-failover-bench: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"leasehold-failover-bench: lockd failover time on etcd (kill the leader, time the takeover and "
               "the first answer of the new leader) under a supervisor-like load, against the stated bound"};
  app.add_option("--kills", o.kills, "leader failovers to time")->capture_default_str()->check(CLI::Range(1u, 1000u));
  app.add_option("--mode", o.mode, "kill: kill -9 the leader; stop: SIGSTOP it until another took over; both: "
                                   "alternately")
      ->capture_default_str()
      ->check(CLI::IsMember({"kill", "stop", "both"}));
  app.add_option("--etcd-members", o.etcd_members, "etcd cluster size")->capture_default_str()->check(CLI::Range(1, 9));
  app.add_option("--lockds", o.lockds, "lockd processes")->capture_default_str()->check(CLI::Range(2u, 9u));
  app.add_option("--leader-lease-s", o.leader_lease_s, "lockd --leader-lease-s")->capture_default_str();
  app.add_option("--ttl-ms", o.ttl_ms, "lockd --ttl-ms")->capture_default_str();
  app.add_option("--workers", o.workers, "load: workers (threads)")->capture_default_str();
  app.add_option("--names", o.names, "load: names each worker holds and refreshes")->capture_default_str();
  app.add_option("--heartbeat-ms", o.heartbeat_ms, "load: refresh interval")->capture_default_str()->check(
      CLI::Range(10u, 10'000u));
  app.add_option("--probe-ms", o.probe_ms, "pause between two probes of one lockd")->capture_default_str();
  app.add_option("--settle-ms", o.settle_ms, "time the leader serves before it is killed")->capture_default_str();
  app.add_option("--lockd-binary", o.lockd_binary, "leasehold-lockd to start")->capture_default_str();
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
  app.add_flag("--keep", o.keep, "keep the run's directory (etcd and lockd logs)");
  CLI11_PARSE(app, argc, argv);

  if (auto bin = harness::etcd_binary(); !bin.ok()) return fail(bin.message());
  harness::TempDir dir("lh-failover-bench");
  if (o.keep) dir.keep();
  auto etcd = harness::EtcdCluster::start(o.etcd_members, (dir.path() / "etcd").string());
  if (!etcd.ok()) return fail(etcd.message());
  const std::string key_file = (dir.path() / "cluster.key").string();
  if (const Status k = wire::generate_key_file(key_file); !k.ok()) return fail(k.message());
  harness::LockdClusterSpec spec;
  spec.bin = o.lockd_binary;
  spec.dir = dir.path();
  spec.key_file = key_file;
  spec.etcd = {(*etcd)->endpoints()};
  spec.prefix = "/failover-bench";
  spec.lockds = o.lockds;
  spec.leader_lease_s = o.leader_lease_s;
  spec.ttl_ms = o.ttl_ms;
  auto started = harness::LockdCluster::start(spec);
  if (!started.ok()) return fail(started.message());
  harness::LockdCluster& cluster = **started;
  if (auto l = cluster.wait_leader(milliseconds(20'000)); !l.ok()) return fail(l.message());

  std::atomic<bool> stop{false};
  LoadCounters load;
  std::vector<Probe> probes(cluster.size());
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < o.workers; ++w)
    threads.emplace_back([&, w] { run_worker(cluster, o, w, stop, load); });
  for (std::size_t i = 0; i < cluster.size(); ++i)
    threads.emplace_back([&, i] { run_probe(cluster, o, i, "perf/probe", stop, probes[i]); });

  std::vector<Kill> kills;
  int rc = 0;
  for (unsigned k = 0; k < o.kills; ++k) {
    harness::sleep_ms(o.settle_ms);
    const auto l = cluster.wait_leader(milliseconds(20'000));
    if (!l.ok()) {
      rc = fail("before kill " + std::to_string(k + 1) + ": " + l.message());
      break;
    }
    Kill kill;
    kill.lockd = *l;
    kill.stopped = o.mode == "stop" || (o.mode == "both" && k % 2 == 1);
    const auto i = static_cast<std::size_t>(kill.lockd);
    kill.at_ns = now_ns();
    if (kill.stopped) {
      (void)cluster.stop(i);
    } else {
      cluster.kill9(i);
    }
    const auto t = cluster.wait_takeover(kill.at_ns, milliseconds(30'000), kill.lockd);
    if (kill.stopped) (void)cluster.cont(i);
    if (!t.ok()) {
      rc = fail("kill " + std::to_string(k + 1) + ": " + t.message());
      break;
    }
    kill.new_leader = t->index;
    kill.takeover_ms = (t->at_ns - kill.at_ns) / kNsPerMs;
    if (!kill.stopped) {
      if (const Status s = cluster.restart(i); !s.ok()) {
        rc = fail("restarting lockd " + std::to_string(i) + ": " + s.message());
        break;
      }
    }
    kills.push_back(kill);
    if (!o.json) {
      std::fprintf(stderr, "kill %u/%u: lockd %d %s, lockd %d took over after %lld ms\n", k + 1, o.kills, kill.lockd,
                   kill.stopped ? "stopped" : "killed", kill.new_leader, static_cast<long long>(kill.takeover_ms));
    }
  }
  harness::sleep_ms(o.settle_ms);  // the last kill's first answers
  stop = true;
  for (auto& t : threads) t.join();

  // First answers: the first probe another lockd answered as the leader after the kill.
  std::vector<std::int64_t> takeover, first_answer;
  for (Kill& kill : kills) {
    std::int64_t first = 0;
    for (std::size_t i = 0; i < probes.size(); ++i) {
      if (static_cast<int>(i) == kill.lockd) continue;
      const std::lock_guard g(probes[i].mu);
      const auto it = std::upper_bound(probes[i].led_at.begin(), probes[i].led_at.end(), kill.at_ns);
      if (it != probes[i].led_at.end() && (first == 0 || *it < first)) first = *it;
    }
    if (first != 0) kill.first_answer_ms = (first - kill.at_ns) / kNsPerMs;
    takeover.push_back(kill.takeover_ms);
    if (kill.first_answer_ms >= 0) first_answer.push_back(kill.first_answer_ms);
  }
  const std::int64_t bound = cluster.failover_bound_ms();
  const Stats ts = stats_of(takeover), fa = stats_of(first_answer);
  const bool unanswered_kill = first_answer.size() != kills.size();
  const bool within = !kills.empty() && !unanswered_kill && fa.max <= bound;
  const bool lost = load.lost.load() != 0;
  if (rc == 0 && (!within || lost)) rc = 1;

  if (o.json) {
    nlohmann::json j;
    j["kills"] = kills.size();
    j["mode"] = o.mode;
    j["etcd_members"] = o.etcd_members;
    j["lockds"] = o.lockds;
    j["leader_lease_s"] = o.leader_lease_s;
    j["ttl_ms"] = o.ttl_ms;
    j["failover_bound_ms"] = bound;
    auto series = [&](const Stats& s, const std::vector<std::int64_t>& v) {
      return nlohmann::json{{"p50", s.p50}, {"p99", s.p99}, {"max", s.max}, {"samples", v}};
    };
    j["takeover_ms"] = series(ts, takeover);
    j["first_answer_ms"] = series(fa, first_answer);
    j["within_bound"] = within;
    j["load"] = {{"workers", o.workers},          {"names_per_worker", o.names},
                 {"heartbeat_ms", o.heartbeat_ms}, {"refreshed", load.refreshed.load()},
                 {"lost", load.lost.load()},       {"unanswered_heartbeats", load.unanswered.load()},
                 {"acquires", load.acquires.load()}, {"releases", load.releases.load()},
                 {"acquires_refused", load.refused.load()}};
    std::printf("%s\n", j.dump(2).c_str());
    return rc;
  }
  std::printf("\nlockd failover on etcd: %zu %s of the leader; %d etcd members, %u lockd, --leader-lease-s %d "
              "(failover bound %lld ms), load: %u workers x %u names refreshed every %u ms\n",
              kills.size(), o.mode == "kill" ? "kill -9" : o.mode == "stop" ? "SIGSTOP" : "kill -9 / SIGSTOP",
              o.etcd_members, o.lockds, o.leader_lease_s, static_cast<long long>(bound), o.workers, o.names,
              o.heartbeat_ms);
  std::printf("\n| from the kill to | p50 ms | p99 ms | max ms | bound ms | max / bound |\n");
  std::printf("|---|---|---|---|---|---|\n");
  auto row = [&](const char* what, const Stats& s) {
    std::printf("| %s | %lld | %lld | %lld | %lld | %.2f |\n", what, static_cast<long long>(s.p50),
                static_cast<long long>(s.p99), static_cast<long long>(s.max), static_cast<long long>(bound),
                bound > 0 ? static_cast<double>(s.max) / static_cast<double>(bound) : 0.0);
  };
  row("the new leader's takeover (its log)", ts);
  row("its first answered request (probe)", fa);
  std::printf("\nload: %llu refreshes answered refreshed, %llu lost or unknown (must be 0), %llu heartbeats "
              "unanswered (retried); %llu acquires, %llu releases, %llu acquires refused\n",
              static_cast<unsigned long long>(load.refreshed.load()), static_cast<unsigned long long>(load.lost.load()),
              static_cast<unsigned long long>(load.unanswered.load()),
              static_cast<unsigned long long>(load.acquires.load()),
              static_cast<unsigned long long>(load.releases.load()),
              static_cast<unsigned long long>(load.refused.load()));
  if (unanswered_kill) std::printf("a kill saw no answer from a new leader before the run ended\n");
  std::printf("%s\n", within ? "every failover's first answer came within the bound"
                             : "a failover's first answer came later than the bound");
  return rc;
}
