// A lockd cluster of two shards on etcd (DESIGN.md §4.1 "Shards"), two lockd processes per
// shard: names land on both shards, a request for a name of the other shard is redirected to
// that shard's leader, one supervisor heartbeats the names of both shards to their two leaders,
// and one shard's leader killed (-9) fails over that shard alone: no sandbox is killed and the
// other shard's leader goes on leading. The CLI's `names` lists the names of both shards, and a
// revocation is pushed to the supervisor by the leader of the name's shard.
//   lockd: --shards 2, --ttl-ms 6000, --leader-lease-s 1 (failover bound 2000 ms)
//   supervisor: --ttl-ms 6000 --kill-after-ms 4500 --heartbeat-interval-ms 200
//               --lockd-failover-ms 2000
#include "daemon_process.hpp"

#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lease/shard.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/wire/token.hpp"

#include <gtest/gtest.h>

#include <array>
#include <map>

namespace leasehold {
namespace {

using namespace supervisor_testing;

constexpr unsigned kShards = 2;
const std::vector<std::string> kTiming = {"--ttl-ms", "6000", "--kill-after-ms", "4500", "--heartbeat-interval-ms",
                                          "200", "--lockd-failover-ms", "2000", "--slots", "16"};

class LockdShards : public ::testing::Test {
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
    // Process i is a replica of shard i % 2.
    for (std::size_t i = 0; i < lockd_.size(); ++i) {
      const std::string tag = "lockd" + std::to_string(i);
      lockd_[i].log = dir_.path() / (tag + ".err");
      lockd_[i].child.start(LEASEHOLD_LOCKD_BINARY,
                            {"--no-config", "--listen", "127.0.0.1:0", "--key-file", key_, "--store",
                             "etcd://" + etcd_->endpoints() + "/shards", "--signing-key-file", signing,
                             "--leader-lease-s", "1", "--ttl-ms", "6000", "--shards", std::to_string(kShards),
                             "--shard", std::to_string(i % kShards)},
                            dir_.path() / (tag + ".out"), lockd_[i].log);
      ASSERT_TRUE(lockd_[i].child.wait_stdout("listening ")) << lockd_[i].child.err();
      const std::string out = lockd_[i].child.out();
      const auto p = out.find("listening ");
      lockd_[i].address = out.substr(p + 10, out.find('\n', p) - p - 10);
      addresses_ += (i == 0 ? "" : ",") + lockd_[i].address;
      all_.push_back(lockd_[i].socket_address());
    }
    for (unsigned k = 0; k < kShards; ++k) ASSERT_GE(leader(k), 0) << logs();
    // Two names of each shard.
    for (int i = 0; names_.size() < 4; ++i) {
      const std::string n = "sh/" + std::to_string(i);
      if (std::count_if(names_.begin(), names_.end(), [&](const auto& e) { return e.second == shard_of_name(n, kShards); }) < 2)
        names_[n] = shard_of_name(n, kShards);
    }
  }
  /// lockd `i`'s stats counter `key`, nullopt when it does not answer.
  std::optional<std::uint64_t> counter(std::size_t i, const std::string& key) {
    if (lockd_[i].child.exited()) return std::nullopt;
    lockd::AdminClient c(lockd_[i].socket_address(), load_key(key_), {}, 300'000'000);
    const auto all = c.counters();
    if (!all) return std::nullopt;
    for (const auto& k : *all)
      if (k.key == key) return k.value;
    return std::nullopt;
  }
  /// The process that leads shard `shard`, waiting up to 10 s; -1 if none.
  int leader(unsigned shard, int except = -1) {
    int found = -1;
    eventually([&] {
      for (std::size_t i = shard; i < lockd_.size(); i += kShards)
        if (static_cast<int>(i) != except && counter(i, "leading").value_or(0) == 1) found = static_cast<int>(i);
      return found >= 0;
    }, 10'000);
    return found;
  }
  std::string logs() {
    std::string s;
    for (auto& l : lockd_) s += "--- " + l.address + ":\n" + l.log_text();
    return s;
  }

  TempDir dir_;
  std::unique_ptr<harness::EtcdCluster> etcd_;
  std::string key_;
  std::array<Lockd, 4> lockd_;
  std::string addresses_;
  std::vector<SocketAddress> all_;
  std::map<std::string, unsigned> names_;  ///< name → its shard
};

TEST_F(LockdShards, NamesOfBothShardsAreServedByTheirLeadersAndOneShardFailsOverAlone) {
  const std::array<int, kShards> leaders{leader(0), leader(1)};
  Supervisor sup;
  std::string err;
  ASSERT_TRUE(sup.start(dir_.path(), addresses_, key_, kTiming, &err, "sup")) << err;
  std::map<std::string, Epoch> epochs;
  for (const auto& [name, shard] : names_) {
    const json r = sup.call({{"v", 1}, {"op", "run"}, {"name", name}, {"argv", {"/bin/sleep", "120"}},
                             {"env", {{"PATH", "/usr/bin:/bin"}}}});
    ASSERT_EQ(r["ok"], true) << r.dump() << sup.log_text();
    epochs[name] = r["epoch"];
  }
  // Each shard's leader holds its own two names, and has their heartbeats.
  for (unsigned k = 0; k < kShards; ++k) {
    EXPECT_EQ(counter(leaders[k], "held"), 2u) << "shard " << k;
    EXPECT_TRUE(eventually([&] { return counter(leaders[k], "refresh_entries").value_or(0) >= 2; }, 3'000))
        << "shard " << k << logs();
  }
  const json status = sup.call({{"v", 1}, {"op", "status"}});
  EXPECT_EQ(status["lockd_shards"], kShards) << status.dump();
  EXPECT_EQ(status["lockd_leaders"], json({lockd_[leaders[0]].address, lockd_[leaders[1]].address})) << status.dump();

  // A name of shard 0 asked at shard 1's leader: not_leader naming shard 0's leader, nothing
  // changed; a client given every address follows it there.
  const std::string of0 = std::find_if(names_.begin(), names_.end(), [](const auto& e) { return e.second == 0; })->first;
  const std::uint64_t redirected = counter(leaders[1], "other_shard_answers").value_or(0);
  lockd::AdminClient one(lockd_[leaders[1]].socket_address(), load_key(key_), {}, 500'000'000);
  const lockd::Answer wrong = one.show(of0);
  EXPECT_TRUE(wrong.no_leader) << wrong.message();
  EXPECT_NE(wrong.message().find("not_leader, leader \"" + lockd_[leaders[0]].address + "\""), std::string::npos)
      << wrong.message();
  // (the client asks again until its timeout: one answer or more)
  EXPECT_GT(counter(leaders[1], "other_shard_answers").value_or(0), redirected);
  for (unsigned k = 0; k < kShards; ++k) EXPECT_EQ(counter(leaders[k], "held"), 2u) << "shard " << k;
  lockd::AdminClient cluster(all_, load_key(key_));
  for (const auto& [name, epoch] : epochs) {
    const lockd::Answer shown = cluster.show(name);
    ASSERT_NE(shown.as<wire::NameInfo>(), nullptr) << name << ": " << shown.message();
    EXPECT_EQ(shown.as<wire::NameInfo>()->record.epoch, epoch) << name;
  }

  // The CLI lists the names of both shards, each from its leader.
  {
    Child cli;
    cli.start(LEASEHOLD_CLI_BINARY, {"names", "--json", "--lockd", addresses_, "--key-file", key_},
              dir_.path() / "names.out", dir_.path() / "names.err");
    ASSERT_EQ(cli.wait(30'000), 0) << slurp(dir_.path() / "names.err");
    const json listed = json::parse(slurp(dir_.path() / "names.out"));
    std::vector<std::string> got;
    for (const auto& r : listed) got.push_back(r["name"]);
    std::vector<std::string> want;
    for (const auto& [name, shard] : names_) want.push_back(name);
    EXPECT_EQ(got, want) << listed.dump();
  }

  // Shard 1's leader killed: its other replica takes over and gets the supervisor's heartbeats;
  // shard 0's leader is undisturbed (same process, still leading, same incarnation).
  const std::optional<std::uint64_t> incarnation0 = counter(leaders[0], "incarnation");
  ASSERT_TRUE(incarnation0.has_value());
  lockd_[leaders[1]].child.kill9();
  const int next1 = leader(1, leaders[1]);
  ASSERT_GE(next1, 0) << logs();
  EXPECT_TRUE(eventually([&] { return counter(next1, "refresh_entries").value_or(0) >= 2; }, 4'000))
      << logs() << sup.log_text();
  EXPECT_EQ(leader(0), leaders[0]);
  EXPECT_EQ(counter(leaders[0], "incarnation"), incarnation0);
  EXPECT_EQ(counter(leaders[0], "leading"), 1u);
  const json list = sup.call({{"v", 1}, {"op", "list"}});
  ASSERT_EQ(list["sandboxes"].size(), names_.size()) << list.dump() << sup.log_text();
  for (const auto& sb : list["sandboxes"]) EXPECT_EQ(sb["state"], "running") << list.dump();
  // The supervisor's view of shard 1's leader follows the takeover: a request that went to
  // another address meanwhile (round robin after the kill) is answered with a hint, so the view
  // settles on the new leader within a few heartbeats (bounded wait, not a timing assertion).
  json after;
  EXPECT_TRUE(eventually(
      [&] {
        after = sup.call({{"v", 1}, {"op", "status"}});
        return after["lockd_leaders"][1] == lockd_[next1].address;
      },
      10'000))
      << after.dump();
  EXPECT_EQ(after["counters"]["kills_deadline"], 0) << after.dump() << sup.log_text();
  EXPECT_EQ(after["counters"]["lost"], 0) << after.dump();
  for (const auto& [name, epoch] : epochs) {
    const lockd::Answer shown = cluster.show(name);
    ASSERT_NE(shown.as<wire::NameInfo>(), nullptr) << name << ": " << shown.message();
    EXPECT_EQ(shown.as<wire::NameInfo>()->record.state, LockPhase::held) << name;
    EXPECT_EQ(shown.as<wire::NameInfo>()->record.epoch, epoch) << name;
  }

  // A revoke of one name of each shard: each shard's leader (shard 1's the new one) pushes the
  // revocation to the supervisor, which kills the sandbox and confirms the kill to that leader.
  std::map<unsigned, std::string> revoked;
  for (const auto& [name, shard] : names_) revoked.emplace(shard, name);
  for (const auto& [shard, name] : revoked) {
    const lockd::Answer r = cluster.revoke(name_id_of(name), epochs[name]);
    ASSERT_NE(r.as<wire::Ok>(), nullptr) << name << ": " << r.message();
    EXPECT_EQ(r.as<wire::Ok>()->epoch, epochs[name] + 1) << name;
  }
  for (const auto& [shard, name] : revoked) {
    EXPECT_TRUE(eventually([&, n = name] {
      const lockd::Answer shown = cluster.show(n);
      const auto* info = shown.as<wire::NameInfo>();
      return info != nullptr && info->record.revoke_ended == wire::RevokeEnd::kill_confirmed;
    }, 5'000)) << name << " (shard " << shard << ")" << sup.log_text() << logs();
  }
  EXPECT_EQ(counter(leaders[0], "revoke_ended_kill_confirmed"), 1u);
  EXPECT_EQ(counter(next1, "revoke_ended_kill_confirmed"), 1u);
  // The revoked ones are gone, the other two run on.
  std::size_t running = 0;
  EXPECT_TRUE(eventually([&] {
    const json left = sup.call({{"v", 1}, {"op", "list"}});
    running = 0;
    for (const auto& sb : left["sandboxes"]) running += sb["state"] == "running" ? 1 : 0;
    return left["sandboxes"].size() == names_.size() - revoked.size();
  }, 3'000)) << sup.log_text();
  EXPECT_EQ(running, names_.size() - revoked.size());
}

// A lockd started with another shard count than the cluster's refuses to start, naming both
// (the cluster's count recorded as its first lockd would have: no need to start four).
TEST(LockdShardCount, ALockdWithAnotherShardCountThanTheClustersIsRefused) {
  if (auto bin = harness::etcd_binary(); !bin.ok()) GTEST_SKIP() << bin.status().message();
  TempDir dir;
  auto etcd = harness::EtcdCluster::start(1, (dir.path() / "etcd").string());
  ASSERT_TRUE(etcd.ok()) << etcd.status().message();
  auto client = etcd::Client::open((*etcd)->endpoints());
  ASSERT_TRUE(client.ok()) << client.status().message();
  ASSERT_TRUE((*client)->put("/shards/shards", "2", boottime_ns() + 2'000'000'000).ok());
  const std::string key = make_key(dir.path());
  const std::string signing = (dir.path() / "signing.key").string();
  ASSERT_TRUE(token::generate_signing_key_file(signing).ok());
  Child other;
  other.start(LEASEHOLD_LOCKD_BINARY,
              {"--no-config", "--listen", "127.0.0.1:0", "--key-file", key, "--store", "etcd://" + (*etcd)->endpoints() + "/shards",
               "--signing-key-file", signing, "--leader-lease-s", "1", "--ttl-ms", "6000", "--shards", "3", "--shard",
               "2"},
              dir.path() / "other.out", dir.path() / "other.err");
  EXPECT_EQ(other.wait(15'000), 1);
  EXPECT_NE(slurp(dir.path() / "other.err")
                .find("the cluster at /shards has 2 shard(s) (etcd key /shards/shards), and this lockd was started "
                      "with --shards 3: every lockd of a cluster runs with the cluster's --shards 2"),
            std::string::npos)
      << slurp(dir.path() / "other.err");
}

}  // namespace
}  // namespace leasehold
