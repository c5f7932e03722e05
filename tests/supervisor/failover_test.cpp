// Supervisors against a lockd cluster on etcd (DESIGN.md §4.1): named sandboxes keep running
// while the lockd leader is killed (-9) and while the next leader is stopped past its
// leadership lease. The supervisors follow the leader (--lockd A,B,C), no kill-switch fires, and
// every name stays held at the epoch it was granted.
//   lockd: --ttl-ms 6000, --leader-lease-s 1 (failover bound 2000 ms)
//   supervisor: --ttl-ms 6000 --kill-after-ms 4500 --heartbeat-interval-ms 200
//               --lockd-failover-ms 2000
#include "daemon_process.hpp"

#include "leasehold/harness/etcd.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/token.hpp"

#include <gtest/gtest.h>

#include <array>

namespace leasehold {
namespace {

using namespace supervisor_testing;

const std::vector<std::string> kTiming = {"--ttl-ms", "6000", "--kill-after-ms", "4500", "--heartbeat-interval-ms",
                                          "200", "--lockd-failover-ms", "2000", "--slots", "16"};

class SupervisorFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    if (auto bin = harness::etcd_binary(); !bin.ok()) GTEST_SKIP() << bin.status().message();
    auto c = harness::EtcdCluster::start(1, (dir_.path() / "etcd").string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    etcd_ = std::move(*c);
    key_ = make_key(dir_.path());
    const std::string signing = (dir_.path() / "signing.key").string();
    ASSERT_TRUE(token::generate_signing_key_file(signing).ok());
    for (std::size_t i = 0; i < lockd_.size(); ++i) {
      const std::string tag = "lockd" + std::to_string(i);
      lockd_[i].log = dir_.path() / (tag + ".err");
      lockd_[i].child.start(LEASEHOLD_LOCKD_BINARY,
                            {"--listen", "127.0.0.1:0", "--key-file", key_, "--store",
                             "etcd://" + etcd_->endpoints() + "/failover", "--signing-key-file", signing,
                             "--leader-lease-s", "1", "--ttl-ms", "6000"},
                            dir_.path() / (tag + ".out"), lockd_[i].log);
      ASSERT_TRUE(lockd_[i].child.wait_stdout("listening ")) << lockd_[i].child.err();
      const std::string out = lockd_[i].child.out();
      const auto p = out.find("listening ");
      lockd_[i].address = out.substr(p + 10, out.find('\n', p) - p - 10);
      addresses_ += (i == 0 ? "" : ",") + lockd_[i].address;
    }
    ASSERT_GE(leader(), 0) << logs();
  }
  /// The lockd that says it leads (stats), waiting up to 10 s; -1 if none.
  int leader(int except = -1) {
    int found = -1;
    eventually([&] {
      for (std::size_t i = 0; i < lockd_.size(); ++i) {
        if (static_cast<int>(i) == except || lockd_[i].child.exited()) continue;
        lockd::AdminClient c(lockd_[i].socket_address(), load_key(key_), {}, 300'000'000);
        const auto all = c.counters();
        if (!all) continue;
        for (const auto& k : *all)
          if (k.key == "leading" && k.value == 1) found = static_cast<int>(i);
      }
      return found >= 0;
    }, 10'000);
    return found;
  }
  std::string logs() {
    std::string s;
    for (auto& l : lockd_) s += "--- " + l.address + ":\n" + l.log_text();
    return s;
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
  std::array<Lockd, 3> lockd_;
  std::string addresses_;
};

TEST_F(SupervisorFailover, NamedSandboxesSurviveALeaderKilledAndALeaderStoppedPastItsLease) {
  std::array<Supervisor, 2> sups;
  std::map<std::string, Epoch> epochs;
  for (std::size_t w = 0; w < sups.size(); ++w) {
    std::string err;
    ASSERT_TRUE(sups[w].start(dir_.path(), addresses_, key_, kTiming, &err, "sup" + std::to_string(w))) << err;
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
  lockd_[first].child.kill9();
  const int second = leader(first);
  ASSERT_GE(second, 0) << logs();
  sleep_ms(5'000);  // more than kill_after: a supervisor that had not found the new leader kills
  for (auto& s : sups) expect_untouched(s, 2);
  // 2. The new leader stopped past its leadership lease, then resumed: a third one takes over;
  //    the resumed one serves nothing.
  lockd_[second].child.signal(SIGSTOP);
  const int third = leader(second);
  ASSERT_GE(third, 0) << logs();
  lockd_[second].child.signal(SIGCONT);
  sleep_ms(5'000);
  for (auto& s : sups) expect_untouched(s, 2);
  // lockd agrees: every name held by its sandbox at the epoch it was granted.
  lockd::AdminClient ad(lockd_[third].socket_address(), load_key(key_));
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
  const int first = leader();
  Supervisor sup;
  std::string err;
  std::vector<std::string> timing = kTiming;
  timing.erase(std::find(timing.begin(), timing.end(), "--lockd-failover-ms"), timing.end() - 2);
  ASSERT_TRUE(sup.start(dir_.path(), lockd_[first].address, key_, timing, &err, "single")) << err;
  const json r = sup.call({{"v", 1}, {"op", "run"}, {"name", "fo/single"}, {"argv", {"/bin/sleep", "120"}},
                           {"env", {{"PATH", "/usr/bin:/bin"}}}});
  ASSERT_EQ(r["ok"], true) << r.dump() << sup.log_text();
  lockd_[first].child.kill9();
  ASSERT_GE(leader(first), 0) << logs();
  EXPECT_TRUE(eventually([&] {
    return sup.call({{"v", 1}, {"op", "status"}})["counters"]["kills_deadline"].get<int>() >= 1;
  }, 8'000)) << sup.log_text();
}

// A supervisor sized for a faster failover than the cluster's is refused at start, naming both.
TEST_F(SupervisorFailover, ASupervisorExpectingAFasterFailoverThanTheClustersIsRefused) {
  Supervisor sup;
  std::string err;
  std::vector<std::string> timing = kTiming;
  *(std::find(timing.begin(), timing.end(), "--lockd-failover-ms") + 1) = "1000";
  EXPECT_FALSE(sup.start(dir_.path(), addresses_, key_, timing, &err, "fast"));
  EXPECT_NE(err.find("fails over within 2000 ms, above --lockd-failover-ms 1000"), std::string::npos) << err;
}

}  // namespace
}  // namespace leasehold
