// Supervisors against a lockd cluster on etcd (DESIGN.md §4.1): named sandboxes keep running
// while the lockd leader is killed (-9) and while the next leader is stopped past its
// leadership lease. The supervisors follow the leader (--lockd A,B,C), no kill-switch fires, and
// every name stays held at the epoch it was granted.
//   lockd: --ttl-ms 6000, --leader-lease-s 1 (failover bound 2000 ms)
//   supervisor: --ttl-ms 6000 --kill-after-ms 4500 --heartbeat-interval-ms 200
//               --lockd-failover-ms 2000
#include "daemon_process.hpp"

#include "leasehold/harness/etcd.hpp"
#include "leasehold/harness/lockd_cluster.hpp"
#include "leasehold/harness/tcp_relay.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>

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

  /// Every sandbox of `s` runs, none was killed by its kill-switch, none lost its name.
  void expect_untouched(const Supervisor& s, std::size_t sandboxes) {
    const json list = s.call({{"v", 1}, {"op", "list"}});
    ASSERT_EQ(list["sandboxes"].size(), sandboxes) << list.dump() << s.log_text();
    for (const auto& sb : list["sandboxes"]) EXPECT_EQ(sb["state"], "running") << list.dump();
    const json st = s.call({{"v", 1}, {"op", "status"}});
    EXPECT_EQ(st["counters"]["kills_deadline"], 0) << st.dump() << s.log_text();
    EXPECT_EQ(st["counters"]["lost"], 0) << st.dump();
  }

  TempDir dir_;
  std::unique_ptr<harness::EtcdCluster> etcd_;
  std::string key_;
  std::vector<std::vector<std::unique_ptr<harness::TcpRelay>>> relays_;
  std::unique_ptr<harness::LockdCluster> lockd_;
};

TEST_F(SupervisorFailover, NamedSandboxesSurviveALeaderKilledAndALeaderStoppedPastItsLease) {
  ASSERT_NO_FATAL_FAILURE(start_cluster(1, false));
  std::array<Supervisor, 2> sups;
  std::map<std::string, Epoch> epochs;
  for (std::size_t w = 0; w < sups.size(); ++w) {
    std::string err;
    ASSERT_TRUE(sups[w].start(dir_.path(), lockd_->addresses(), key_, kTiming, &err, "sup" + std::to_string(w))) << err;
    for (int k = 0; k < 2; ++k) {
      const std::string name = "fo/" + std::to_string(w) + "-" + std::to_string(k);
      const json r = sups[w].call({{"v", 1}, {"op", "run"}, {"name", name}, {"argv", {"/bin/sleep", "120"}},
                                   {"env", {{"PATH", "/usr/bin:/bin"}}}});
      ASSERT_EQ(r["ok"], true) << r.dump() << sups[w].log_text();
      epochs[name] = r["epoch"];
    }
  }
  // 1. The leader killed: another takes over within the failover bound; the supervisors find it.
  const int first = leader();
  lockd_->kill9(static_cast<std::size_t>(first));
  const int second = leader(first);
  ASSERT_GE(second, 0) << logs();
  sleep_ms(5'000);  // more than kill_after: a supervisor that had not found the new leader kills
  for (auto& s : sups) expect_untouched(s, 2);
  // 2. The new leader stopped past its leadership lease, then resumed: a third one takes over;
  //    the resumed one serves nothing.
  ASSERT_TRUE(lockd_->stop(static_cast<std::size_t>(second)).ok());
  const int third = leader(second);
  ASSERT_GE(third, 0) << logs();
  ASSERT_TRUE(lockd_->cont(static_cast<std::size_t>(second)).ok());
  sleep_ms(5'000);
  for (auto& s : sups) expect_untouched(s, 2);
  // lockd agrees: every name held by its sandbox at the epoch it was granted.
  lockd::AdminClient ad(lockd_->address(static_cast<std::size_t>(third)), lockd_->key());
  for (const auto& [name, epoch] : epochs) {
    const lockd::Answer show = ad.show(name);
    const auto* info = show.as<wire::NameInfo>();
    ASSERT_NE(info, nullptr) << name << ": " << show.message();
    EXPECT_EQ(info->record.state, LockPhase::held) << name;
    EXPECT_EQ(info->record.epoch, epoch) << name;
  }
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
