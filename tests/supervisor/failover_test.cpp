// Supervisors against a lockd cluster on etcd (DESIGN.md §4.1), under load: named sandboxes
// (`leasehold agent`) write to a fenced resource that verifies lockd's signed tokens while the
// cluster goes through one fault after another - the leader lockd killed (-9), stopped past its
// leadership lease, partitioned from etcd (a TCP relay per lockd and member, cut), an etcd
// member killed and restarted, the etcd raft leader killed. During each, one name changes
// hands (its sandbox killed, the name released, a new sandbox acquires it while the cluster
// fails over). The supervisors follow the leader (--lockd A,B,C), no kill-switch fires, no
// acknowledged grant is lost, epochs strictly increase per name, and the resource's audit
// shows one holder per epoch and no overlap.
//   lockd: --ttl-ms 6000, --leader-lease-s 1 (failover bound 2000 ms)
//   supervisor: --ttl-ms 6000 --kill-after-ms 4500 --heartbeat-interval-ms 200
//               --lockd-failover-ms 2000
#include "daemon_process.hpp"

#include "leasehold/harness/etcd.hpp"
#include "leasehold/harness/lockd_cluster.hpp"
#include "leasehold/harness/tcp_relay.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/resource/fenced_store.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>

#ifndef LEASEHOLD_CLI_BINARY
#error "LEASEHOLD_CLI_BINARY must name the leasehold executable (its agent writes to the fenced resource)"
#endif

namespace leasehold {
namespace {

using namespace supervisor_testing;
using std::chrono::milliseconds;

constexpr std::int64_t kNsPerMs = 1'000'000;
constexpr std::int64_t kKillAfterMs = 4500;
const std::vector<std::string> kTiming = {"--ttl-ms", "6000", "--kill-after-ms", std::to_string(kKillAfterMs),
                                          "--heartbeat-interval-ms", "200", "--lockd-failover-ms", "2000",
                                          "--slots", "16"};

class SupervisorFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    if (auto bin = harness::etcd_binary(); !bin.ok()) GTEST_SKIP() << bin.status().message();
    key_ = make_key(dir_.path());
  }
  /// `members` etcd members and three lockd on them, waiting for a leader. With `relays`, each
  /// lockd reaches each member through a TCP relay of its own (relays_[lockd][member]), so a
  /// lockd can be cut off etcd while it runs.
  void start_cluster(int members, bool relays) {
    auto c = harness::EtcdCluster::start(members, (dir_.path() / "etcd").string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    etcd_ = std::move(*c);
    harness::LockdClusterSpec spec;
    spec.bin = LEASEHOLD_LOCKD_BINARY;
    spec.dir = dir_.path();
    spec.key_file = key_;
    spec.prefix = "/failover";
    spec.leader_lease_s = 1;
    spec.ttl_ms = 6000;
    if (relays) {
      relays_.resize(spec.lockds);
      for (auto& mine : relays_) {
        std::string endpoints;
        for (int m = 0; m < members; ++m) {
          auto r = harness::TcpRelay::start(*SocketAddress::parse(etcd_->endpoint(m)));
          ASSERT_TRUE(r.ok()) << r.message();
          endpoints += (m == 0 ? "" : ",") + (*r)->address();
          mine.push_back(std::move(*r));
        }
        spec.etcd.push_back(endpoints);
      }
    } else {
      spec.etcd = {etcd_->endpoints()};
    }
    auto l = harness::LockdCluster::start(spec);
    ASSERT_TRUE(l.ok()) << l.message();
    lockd_ = std::move(*l);
    ASSERT_GE(leader(), 0) << logs();
  }
  /// The lockd that says it leads (stats), waiting up to 10 s; -1 if none.
  int leader(int except = -1) {
    const auto l = lockd_->wait_leader(milliseconds(10'000), except);
    return l.ok() ? *l : -1;
  }
  std::string logs() { return lockd_->logs(); }
  /// Cuts lockd `i` off etcd (every relay of it), or heals it.
  void partition(int i, bool on) {
    for (auto& r : relays_.at(static_cast<std::size_t>(i))) r->cut(on);
  }

  TempDir dir_;
  std::unique_ptr<harness::EtcdCluster> etcd_;
  std::string key_;
  std::vector<std::vector<std::unique_ptr<harness::TcpRelay>>> relays_;
  std::unique_ptr<harness::LockdCluster> lockd_;
};

/// How long a supervisor took to have every lease refreshed by a heartbeat sent after
/// `since_ns` (its valid_until moved past since + kill_after), ms; -1 if not within `timeout_ms`.
std::int64_t wait_refreshed_after(const Supervisor& s, std::int64_t since_ns, int timeout_ms) {
  bool done = eventually([&] {
    const std::int64_t before = now_ns();
    const json list = s.call({{"v", 1}, {"op", "list"}});
    if (!list.contains("sandboxes") || list["sandboxes"].empty()) return false;
    for (const auto& sb : list["sandboxes"]) {
      if (!sb.contains("valid_until_ms")) return false;
      // valid_until = the acknowledged send + kill_after; read no earlier than `before`.
      if (before + sb["valid_until_ms"].get<std::int64_t>() * kNsPerMs <= since_ns + kKillAfterMs * kNsPerMs)
        return false;
    }
    return true;
  }, timeout_ms);
  return done ? (now_ns() - since_ns) / kNsPerMs : -1;
}

TEST_F(SupervisorFailover, NamedSandboxesWritingToAFencedResourceSurviveEveryFault) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(3, true));
  // The resource: a fenced store that admits only tokens lockd signed, writable by every
  // sandbox uid (isolated sandboxes run as uids of their own).
  const std::string db = (dir_.sandbox_dir() / "resource.db").string();
  const std::string pub = (dir_.sandbox_dir() / "lockd-token.pub").string();
  std::filesystem::copy_file(lockd_->public_key_file(), pub);
  ::chmod(pub.c_str(), 0644);
  resource::StoreOptions so;
  so.durable = false;
  so.verifier = std::make_shared<token::TokenVerifier>();
  ASSERT_TRUE(so.verifier->add_public_key_file(pub).ok());
  auto opened = resource::FencedStore::open(db, so);
  ASSERT_TRUE(opened.ok()) << opened.message();
  const std::unique_ptr<resource::FencedStore> store = std::move(opened).value();
  for (const char* suffix : {"", "-wal", "-shm"}) ::chmod((db + suffix).c_str(), 0666);

  struct Grant {
    std::string sandbox;
    Epoch epoch = 0;
  };
  std::map<std::string, std::vector<Grant>> grants;  // per name, every acknowledged grant in order
  std::map<std::string, std::size_t> owner;          // name -> supervisor
  std::array<Supervisor, 2> sups;
  auto run_agent = [&](std::size_t w, const std::string& name) {
    return sups[w].call({{"v", 1},
                         {"op", "run"},
                         {"name", name},
                         {"argv",
                          {LEASEHOLD_CLI_BINARY, "agent", "--db", db, "--name", name, "--interval-ms", "20",
                           "--max-seconds", "600", "--checkpoint-pages", "0", "--public-key", pub}},
                         {"env", {{"PATH", "/usr/bin:/bin"}}}});
  };
  // Whether the sandbox of `name`'s latest grant has written under its epoch since `after_ns`
  // (waiting up to 20 s: an ASan-built agent takes a while to start).
  auto writes_since = [&](const std::string& name, std::int64_t after_ns) {
    return eventually([&] {
      return store->tally(name, grants[name].back().epoch, resource::Verdict::accepted).last_ns > after_ns;
    }, 20'000);
  };
  for (std::size_t w = 0; w < sups.size(); ++w) {
    std::string err;
    ASSERT_TRUE(sups[w].start(dir_.path(), lockd_->addresses(), key_, kTiming, &err, "sup" + std::to_string(w)))
        << err;
    for (int k = 0; k < 2; ++k) {
      const std::string name = "fo/" + std::to_string(w) + "-" + std::to_string(k);
      const json r = run_agent(w, name);
      ASSERT_EQ(r["ok"], true) << r.dump() << sups[w].log_text();
      grants[name].push_back({r["sandbox"], r["epoch"]});
      owner[name] = w;
    }
  }
  for (const auto& [name, history] : grants) ASSERT_TRUE(writes_since(name, 0)) << name << " never wrote";

  // The faults, one after another. inject() returns the lockd whose takeover is awaited (-1:
  // none expected; one may still happen); heal() undoes the fault once it has been survived.
  struct Fault {
    std::string what;
    std::function<int()> inject;
    std::function<void()> heal;
  };
  int victim_lockd = -1, victim_member = -1;
  const std::vector<Fault> faults = {
      {"the leader lockd killed (-9)",
       [&] {
         victim_lockd = leader();
         lockd_->kill9(static_cast<std::size_t>(victim_lockd));
         return victim_lockd;
       },
       [&] { EXPECT_TRUE(lockd_->restart(static_cast<std::size_t>(victim_lockd)).ok()); }},
      {"the leader lockd stopped past its leadership lease",
       [&] {
         victim_lockd = leader();
         EXPECT_TRUE(lockd_->stop(static_cast<std::size_t>(victim_lockd)).ok());
         return victim_lockd;
       },
       [&] { EXPECT_TRUE(lockd_->cont(static_cast<std::size_t>(victim_lockd)).ok()); }},
      {"the leader lockd partitioned from etcd",
       [&] {
         victim_lockd = leader();
         partition(victim_lockd, true);
         return victim_lockd;
       },
       [&] { partition(victim_lockd, false); }},
      {"an etcd member (not the raft leader) killed, then restarted",
       [&] {
         const auto l = etcd_->leader(now_ns() + 10'000 * kNsPerMs);
         EXPECT_TRUE(l.ok()) << l.message();
         victim_member = (l.ok() ? *l + 1 : 0) % etcd_->size();
         EXPECT_TRUE(etcd_->kill(victim_member).ok());
         return -1;
       },
       [&] {
         const Status s = etcd_->restart(victim_member);
         EXPECT_TRUE(s.ok()) << s.message();
       }},
      {"the etcd raft leader killed, then restarted",
       [&] {
         const auto l = etcd_->leader(now_ns() + 10'000 * kNsPerMs);
         EXPECT_TRUE(l.ok()) << l.message();
         victim_member = l.ok() ? *l : 0;
         EXPECT_TRUE(etcd_->kill(victim_member).ok());
         return -1;
       },
       [&] {
         const Status s = etcd_->restart(victim_member);
         EXPECT_TRUE(s.ok()) << s.message();
       }},
  };

  std::vector<std::string> report;
  const std::vector<std::string> names = [&] {
    std::vector<std::string> v;
    for (const auto& [name, unused] : grants) v.push_back(name);
    return v;
  }();
  for (std::size_t f = 0; f < faults.size(); ++f) {
    SCOPED_TRACE("fault " + std::to_string(f + 1) + ": " + faults[f].what);
    // The name that changes hands during this fault: its sandbox is killed and its name
    // released before the fault; the next acquire of it runs into the failover.
    const std::string& victim = names[f % names.size()];
    Supervisor& vs = sups[owner[victim]];
    const auto released = vs.call({{"v", 1}, {"op", "status"}})["counters"]["names_released"].get<int>();
    ASSERT_EQ(vs.call({{"v", 1}, {"op", "kill"}, {"sandbox", grants[victim].back().sandbox}})["ok"], true);
    ASSERT_TRUE(eventually([&] {
      return vs.call({{"v", 1}, {"op", "status"}})["counters"]["names_released"].get<int>() > released;
    }, 15'000)) << victim << " was not released\n" << vs.log_text();

    const std::int64_t fault_ns = now_ns();
    const int awaited = faults[f].inject();
    ASSERT_FALSE(HasFailure()) << logs();
    // A new sandbox acquires the name while the cluster fails over: retried until granted (an
    // acquire the old leader never answered, or a grant the supervisor gave up on, is refused
    // or released and asked again).
    json again;
    ASSERT_TRUE(eventually([&] {
      again = run_agent(owner[victim], victim);
      if (again["ok"] == true) return true;
      sleep_ms(100);
      return false;
    }, 30'000)) << again.dump() << "\n" << vs.log_text() << logs();
    const std::int64_t granted_ms = (now_ns() - fault_ns) / kNsPerMs;
    EXPECT_GT(again["epoch"].get<Epoch>(), grants[victim].back().epoch) << victim;
    grants[victim].push_back({again["sandbox"], again["epoch"]});

    std::string line = faults[f].what + ": ";
    if (awaited >= 0) {
      const auto t = lockd_->wait_takeover(fault_ns, milliseconds(15'000), awaited);
      ASSERT_TRUE(t.ok()) << t.message();
      const std::int64_t failover_ms = (t->at_ns - fault_ns) / kNsPerMs;
      line += "lockd " + std::to_string(t->index) + " took over after " + std::to_string(failover_ms) + " ms";
    } else {
      const auto t = lockd_->wait_takeover(fault_ns, milliseconds(0));
      line += t.ok() ? "lockd " + std::to_string(t->index) + " took over after " +
                           std::to_string((t->at_ns - fault_ns) / kNsPerMs) + " ms"
                     : "the lockd leader stayed";
    }
    // Every supervisor has every lease refreshed by a heartbeat sent after the fault (so no
    // kill-switch can be pending from it) before the fault is undone and the next one comes.
    for (std::size_t w = 0; w < sups.size(); ++w) {
      const std::int64_t took = wait_refreshed_after(sups[w], fault_ns, 20'000);
      ASSERT_GE(took, 0) << "supervisor " << w << " did not refresh its leases after the fault\n"
                         << sups[w].log_text() << logs();
      line += "; supervisor " + std::to_string(w) + " refreshed after " + std::to_string(took) + " ms";
    }
    line += "; " + victim + " granted again after " + std::to_string(granted_ms) + " ms";
    ASSERT_TRUE(writes_since(victim, 0)) << victim << " at its new epoch never wrote";
    faults[f].heal();
    ASSERT_GE(leader(), 0) << logs();
    report.push_back(line);
  }
  for (const std::string& l : report) std::printf("%s\n", l.c_str());
  // Every sandbox kept writing through the faults (none was stopped by a failed lease check).
  const std::int64_t faults_done_ns = now_ns();
  for (const auto& [name, history] : grants)
    EXPECT_TRUE(writes_since(name, faults_done_ns)) << name << " stopped writing\n" << sups[owner[name]].log_text();

  // No kill-switch fired, no lease was lost: every sandbox runs, and it is the latest grant.
  for (std::size_t w = 0; w < sups.size(); ++w) {
    const json st = sups[w].call({{"v", 1}, {"op", "status"}});
    EXPECT_EQ(st["counters"]["kills_deadline"], 0) << st.dump() << sups[w].log_text();
    EXPECT_EQ(st["counters"]["lost"], 0) << st.dump();
    const json list = sups[w].call({{"v", 1}, {"op", "list"}});
    ASSERT_EQ(list["sandboxes"].size(), 2u) << list.dump() << sups[w].log_text();
    for (const auto& sb : list["sandboxes"]) {
      EXPECT_EQ(sb["state"], "running") << list.dump();
      const std::string name = sb["name"];
      EXPECT_EQ(sb["sandbox"], grants[name].back().sandbox) << name;
      EXPECT_EQ(sb["epoch"], grants[name].back().epoch) << name;
    }
  }
  // lockd agrees: no acknowledged grant lost, each name held by its latest grant.
  const int l = leader();
  ASSERT_GE(l, 0) << logs();
  lockd::AdminClient ad(lockd_->address(static_cast<std::size_t>(l)), lockd_->key());
  for (const auto& [name, history] : grants) {
    const lockd::Answer show = ad.show(name);
    const auto* info = show.as<wire::NameInfo>();
    ASSERT_NE(info, nullptr) << name << ": " << show.message();
    EXPECT_EQ(info->record.state, LockPhase::held) << name;
    EXPECT_EQ(info->record.epoch, history.back().epoch) << name;
    EXPECT_EQ(info->record.holder.str(), history.back().sandbox) << name;
    for (std::size_t i = 1; i < history.size(); ++i)
      EXPECT_GT(history[i].epoch, history[i - 1].epoch) << name << ": epochs must strictly increase";
  }

  // The resource's audit: every write verified, one holder per epoch, epochs never go back,
  // and the accepted writes of one epoch end before those of the next begin.
  const auto rows = store->audit();
  ASSERT_TRUE(rows.ok()) << rows.message();
  const resource::AuditReport audit = resource::check_audit(*rows);
  for (const std::string& v : audit.violations) ADD_FAILURE() << "audit: " << v;
  EXPECT_TRUE(audit.exclusive()) << audit.summary();
  for (const auto& [name, history] : grants) {
    std::vector<const resource::EpochSummary*> epochs;
    for (const auto& e : audit.epochs)
      if (e.name == name && e.accepted > 0) epochs.push_back(&e);
    ASSERT_EQ(epochs.size(), history.size()) << name << ": every grant's sandbox wrote, under its own epoch";
    for (std::size_t i = 0; i < history.size(); ++i) {
      EXPECT_EQ(epochs[i]->epoch, history[i].epoch) << name;
      EXPECT_EQ(epochs[i]->holders, std::vector<std::string>{history[i].sandbox}) << name;
      if (i > 0) {
        EXPECT_LT(epochs[i - 1]->last_ns, epochs[i]->first_ns) << name << ": epochs overlap";
      }
    }
  }
  std::printf("audit: %s\n", audit.summary().c_str());
}

// The same failover seen by a supervisor that knows only the leader's address: nothing answers
// its heartbeats any more and its kill-switch fires - what the test above shows does not happen
// to a supervisor given the cluster's addresses.
TEST_F(SupervisorFailover, ASupervisorThatKnowsOnlyTheKilledLeaderKillsItsSandbox) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(1, false));
  const int first = leader();
  Supervisor sup;
  std::string err;
  std::vector<std::string> timing = kTiming;
  timing.erase(std::find(timing.begin(), timing.end(), "--lockd-failover-ms"), timing.end() - 2);
  ASSERT_TRUE(sup.start(dir_.path(), lockd_->address(static_cast<std::size_t>(first)).str(), key_, timing, &err,
                        "single"))
      << err;
  const json r = sup.call({{"v", 1}, {"op", "run"}, {"name", "fo/single"}, {"argv", {"/bin/sleep", "120"}},
                           {"env", {{"PATH", "/usr/bin:/bin"}}}});
  ASSERT_EQ(r["ok"], true) << r.dump() << sup.log_text();
  lockd_->kill9(static_cast<std::size_t>(first));
  ASSERT_GE(leader(first), 0) << logs();
  EXPECT_TRUE(eventually([&] {
    return sup.call({{"v", 1}, {"op", "status"}})["counters"]["kills_deadline"].get<int>() >= 1;
  }, 8'000)) << sup.log_text();
}

// A supervisor sized for a faster failover than the cluster's is refused at start, naming both.
TEST_F(SupervisorFailover, ASupervisorExpectingAFasterFailoverThanTheClustersIsRefused) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(1, false));
  Supervisor sup;
  std::string err;
  std::vector<std::string> timing = kTiming;
  *(std::find(timing.begin(), timing.end(), "--lockd-failover-ms") + 1) = "1000";
  EXPECT_FALSE(sup.start(dir_.path(), lockd_->addresses(), key_, timing, &err, "fast"));
  EXPECT_NE(err.find("fails over within 2000 ms, above --lockd-failover-ms 1000"), std::string::npos) << err;
}

}  // namespace
}  // namespace leasehold
