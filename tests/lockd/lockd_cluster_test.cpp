// lockd on etcd, as processes: three leasehold-lockd on one etcd elect one leader; the others
// answer not_leader with its address; a leader killed with -9 or stopped past its leadership
// lease is replaced, the new leader serves the grants the old one acknowledged (same epochs,
// leases counted as refreshed at takeover), and a stopped leader that comes back serves nothing.
#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/harness/lockd_cluster.hpp"
#include "leasehold/io/probe.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/admin_client.hpp"
#include "leasehold/lockd/etcd_store.hpp"
#include "leasehold/lockd/service.hpp"
#include "leasehold/wire/token.hpp"
#include "lockd_process.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

namespace leasehold::lockd {
namespace {

using namespace testing;

constexpr std::int64_t kMs = 1'000'000;
const SandboxId S1{0xc1, 1}, S2{0xc1, 2};
const WorkerId W1{0xc7, 1}, W2{0xc7, 2};

class LockdClusterTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (const Status why = io_uring_usable(); !why.ok()) GTEST_SKIP() << why.message();
    if (auto bin = harness::etcd_binary(); !bin.ok()) GTEST_SKIP() << bin.status().message();
    auto c = harness::EtcdCluster::start(1, (dir_.path() / "etcd").string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    etcd_ = std::move(*c);
    key_ = make_key(dir_.path());
    signing_ = (dir_.path() / "signing.key").string();
    ASSERT_TRUE(token::generate_signing_key_file(signing_).ok());
    harness::LockdClusterSpec spec;
    spec.bin = LEASEHOLD_LOCKD_BINARY;
    spec.dir = dir_.path();
    spec.key_file = dir_.path() / "lockd.key";
    spec.signing_key_file = signing_;
    spec.etcd = {etcd_->endpoints()};
    spec.prefix = "/cluster-test";
    spec.leader_lease_s = 1;
    spec.ttl_ms = ttl_ms_;
    if (!ablate_.empty()) spec.env = {{"LEASEHOLD_ABLATE", ablate_}};  // lockd reads it at start
    auto lockd = harness::LockdCluster::start(spec);
    ASSERT_TRUE(lockd.ok()) << lockd.message();
    lockd_ = std::move(*lockd);
  }
  /// The index of the one lockd that leads, waiting up to `ms`; -1 if none (or two) by then.
  int wait_leader(std::int64_t ms, int except = -1) {
    const auto l = lockd_->wait_leader(std::chrono::milliseconds(ms), except);
    return l.ok() ? *l : -1;
  }
  std::string all_logs() { return lockd_->logs(); }

  std::string ablate_;  ///< LEASEHOLD_ABLATE for the lockd processes (set before SetUp)
  std::uint64_t ttl_ms_ = 6000;  ///< their --ttl-ms (set before SetUp)
  TempDir dir_;
  std::unique_ptr<harness::EtcdCluster> etcd_;
  wire::WireKey key_;
  std::string signing_;
  std::unique_ptr<harness::LockdCluster> lockd_;
};

TEST_F(LockdClusterTest, OneLeadsTheOthersRedirectAndAKilledLeaderIsReplacedWithItsGrants) {
  const int l = wait_leader(10'000);
  ASSERT_GE(l, 0) << all_logs();
  AdminClient leader(lockd_->address(l), key_, W1);
  const Answer g = leader.acquire("cl/one", S1, W1);
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  const Epoch e1 = g.as<wire::Grant>()->epoch;

  // A follower changes nothing and names the leader (a client that knows only the follower
  // cannot follow it: the leader is not one of its addresses).
  const int f = (l + 1) % 3;
  AdminClient follower(lockd_->address(f), key_, W1, 500 * kMs);
  const Answer redirected = follower.acquire("cl/one", S2, W1);
  EXPECT_TRUE(redirected.no_leader) << redirected.message();
  EXPECT_NE(redirected.message().find("not_leader, leader \"" + lockd_->address(l).str() + "\""), std::string::npos)
      << redirected.message();
  // A client given every address follows the follower's hint to the leader.
  AdminClient all({lockd_->address(f), lockd_->address(l)}, key_, W1);
  const Answer followed = all.acquire("cl/one", S2, W1);
  ASSERT_NE(followed.as<wire::Deny>(), nullptr) << followed.message();
  EXPECT_EQ(followed.as<wire::Deny>()->refusal, Refusal::held);

  lockd_->kill9(l);
  const std::int64_t killed = boottime_ns();
  const int n = wait_leader(10'000, l);
  ASSERT_GE(n, 0) << all_logs();
  const std::int64_t took_ms = (boottime_ns() - killed) / kMs;
  // Before any lease could lapse (--ttl-ms 6000): the failover bound lockd states is 2000 ms.
  EXPECT_LT(took_ms, 6000) << all_logs();
  std::printf("failover (kill -9 -> a new leader answers stats): %lld ms\n", static_cast<long long>(took_ms));

  AdminClient next(lockd_->address(n), key_, W1);
  // The acknowledged grant is there, at its epoch, and still held (refreshed at takeover).
  const Answer shown = next.show("cl/one");
  const auto* info = shown.as<wire::NameInfo>();
  ASSERT_NE(info, nullptr) << shown.message();
  EXPECT_EQ(info->record.state, LockPhase::held);
  EXPECT_EQ(info->record.epoch, e1);
  EXPECT_EQ(info->record.holder, S1);
  const wire::HeartbeatEntry beat[] = {{name_id_of("cl/one"), S1, e1}};
  const Answer hb = next.heartbeat(beat);
  ASSERT_NE(hb.as<wire::HeartbeatAck>(), nullptr) << hb.message();
  EXPECT_EQ(hb.as<wire::HeartbeatAck>()->entries.at(0).status, RefreshStatus::refreshed);
  const Answer other = next.acquire("cl/one", S2, W1);
  ASSERT_NE(other.as<wire::Deny>(), nullptr) << other.message();
  EXPECT_EQ(other.as<wire::Deny>()->refusal, Refusal::held);
  // Released, the name goes to the next sandbox at a higher epoch: epochs continue in etcd.
  const Answer released = next.release(name_id_of("cl/one"), S1, e1);
  ASSERT_NE(released.as<wire::Ok>(), nullptr) << released.message();
  const Answer g2 = next.acquire("cl/one", S2, W1);
  ASSERT_NE(g2.as<wire::Grant>(), nullptr) << g2.message();
  EXPECT_GT(g2.as<wire::Grant>()->epoch, e1);
  // The remaining follower names the new leader once it has read the key (it polls it).
  const int other_follower = 3 - l - n;
  AdminClient f2(lockd_->address(other_follower), key_, W1, 300 * kMs);
  std::string hint;
  const std::string want = "leader \"" + lockd_->address(n).str() + "\"";
  for (int i = 0; i < 40 && hint.find(want) == std::string::npos; ++i) {
    const Answer r2 = f2.acquire("cl/two", S1, W1);
    ASSERT_TRUE(r2.no_leader) << r2.message();
    hint = r2.message();
  }
  EXPECT_NE(hint.find(want), std::string::npos) << hint;
}

TEST_F(LockdClusterTest, ALockdWithAnotherClustersKeyRefusesToStartNamingBothKeys) {
  ASSERT_GE(wait_leader(10'000), 0) << all_logs();
  const fs::path other = dir_.path() / "other";
  fs::create_directories(other);
  fs::permissions(other, fs::perms::owner_all, fs::perm_options::replace);
  const wire::WireKey stranger = make_key(other);
  const ExitResult r = run_lockd_to_exit({"--key-file", (other / "lockd.key").string(), "--store",
                                          "etcd://" + etcd_->endpoints() + "/cluster-test", "--signing-key-file",
                                          signing_, "--leader-lease-s", "1", "--ttl-ms", "6000", "--listen",
                                          "127.0.0.1:0"},
                                         other);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("refusing to start"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cluster_key_fingerprint(stranger)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cluster_key_fingerprint(key_)), std::string::npos) << r.err;
}

TEST_F(LockdClusterTest, ALockdWithAnotherSigningKeyRefusesToStartNamingBothKeyIds) {
  ASSERT_GE(wait_leader(10'000), 0) << all_logs();
  // The cluster's record holds the key every running lockd signs with.
  const auto signer = token::TokenSigner::load(signing_);
  ASSERT_TRUE(signer) << signer.message();
  auto client = etcd::Client::open(etcd_->endpoints());
  ASSERT_TRUE(client.ok()) << client.status().message();
  const auto rec = (*client)->range(signing_key_key("/cluster-test"), {}, boottime_ns() + 2 * kMs * 1000);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  ASSERT_EQ(rec->kvs.size(), 1u);
  EXPECT_EQ(rec->kvs.front().value, signing_key_value((*signer)->public_key(), (*signer)->key_id()));
  // A lockd of the same cluster (its cluster key) with another signing key: it would lead and
  // sign tokens every resource refuses.
  const std::string other = (dir_.path() / "other-signing.key").string();
  ASSERT_TRUE(token::generate_signing_key_file(other).ok());
  const auto other_signer = token::TokenSigner::load(other);
  ASSERT_TRUE(other_signer) << other_signer.message();
  const ExitResult r = run_lockd_to_exit({"--key-file", (dir_.path() / "lockd.key").string(), "--store",
                                          "etcd://" + etcd_->endpoints() + "/cluster-test", "--signing-key-file",
                                          other, "--leader-lease-s", "1", "--ttl-ms", "6000", "--listen",
                                          "127.0.0.1:0"},
                                         dir_.path());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("refusing to start"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(token::key_id_text((*signer)->key_id())), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(token::key_id_text((*other_signer)->key_id())), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
}

// The start-up check is not the only one: a lockd that started while etcd did not answer, or
// whose cluster's record changed while it ran, must not lead under another key. The election
// reads the record before every campaign and compares it in its transaction.
TEST_F(LockdClusterTest, NoLockdCampaignsWhileTheSigningKeyRecordHoldsAnotherKey) {
  const int l = wait_leader(10'000);
  ASSERT_GE(l, 0) << all_logs();
  const std::string other = (dir_.path() / "other-signing.key").string();
  ASSERT_TRUE(token::generate_signing_key_file(other).ok());
  const auto other_signer = token::TokenSigner::load(other);
  ASSERT_TRUE(other_signer) << other_signer.message();
  auto client = etcd::Client::open(etcd_->endpoints());
  ASSERT_TRUE(client.ok()) << client.status().message();
  const std::string record = signing_key_key("/cluster-test");
  const auto before = (*client)->range(record, {}, boottime_ns() + 2'000 * kMs);
  ASSERT_TRUE(before.ok() && before->kvs.size() == 1u);
  // The record as another lockd of the cluster would have created it.
  ASSERT_TRUE((*client)->put(record, signing_key_value((*other_signer)->public_key(), (*other_signer)->key_id()),
                             boottime_ns() + 2'000 * kMs)
                  .ok());
  lockd_->kill9(static_cast<std::size_t>(l));
  // The leader's lease (1 s) runs out; the other two poll, read the record and refuse.
  EXPECT_FALSE(lockd_->wait_leader(std::chrono::milliseconds(5'000), l).ok()) << all_logs();
  const std::string want = "records token signing key id " + token::key_id_text((*other_signer)->key_id());
  for (int i = 0; i < 3; ++i) {
    if (i == l) continue;
    EXPECT_NE(lockd_->log(static_cast<std::size_t>(i)).find(want), std::string::npos) << lockd_->log(i);
  }
  // The cluster's own key back: one of them leads again.
  ASSERT_TRUE((*client)->put(record, before->kvs.front().value, boottime_ns() + 2'000 * kMs).ok());
  EXPECT_GE(wait_leader(10'000, l), 0) << all_logs();
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(LockdClusterTest, ARowThatDoesNotDecodeIsNotServedAndTheTakeoverBacksOffUntilItIsRepaired) {
  const int l = wait_leader(10'000);
  ASSERT_GE(l, 0) << all_logs();
  auto client = etcd::Client::open(etcd_->endpoints());
  ASSERT_TRUE(client.ok()) << client.status().message();
  const std::string names = "/cluster-test/shard/0/names/";
  const std::string bad = names + name_id_of("cl/bad").str();
  const std::int64_t soon = boottime_ns() + 2'000 * kMs;
  ASSERT_TRUE((*client)->put(bad, "v=1 name=cl/bad state=held", soon).ok());
  ASSERT_TRUE((*client)->put(names + "x/y", "by hand", soon).ok());  // not a row: skipped
  lockd_->kill9(l);
  // Each of the two others wins, cannot load the row, steps down and backs off, longer after
  // each failed leadership in a row (the step-down's log line names the count and the wait): a
  // few attempts, not one per etcd round trip.
  const std::int64_t killed = boottime_ns();
  const std::int64_t until = killed + 15'000 * kMs;
  while (all_logs().find(" ms (2 in a row)") == std::string::npos && boottime_ns() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string logs = all_logs();
  const std::int64_t seconds = (boottime_ns() - killed) / (1'000 * kMs) + 1;
  const std::size_t failed = count_of(logs, "event=take_over_failed");
  EXPECT_GE(failed, 1u) << logs;
  EXPECT_LE(failed, static_cast<std::size_t>(4 * seconds)) << logs;
  EXPECT_NE(logs.find("the row at key " + bad + " does not decode"), std::string::npos) << logs;
  EXPECT_NE(logs.find(" ms (2 in a row)"), std::string::npos) << logs;
  EXPECT_EQ(wait_leader(500, l), -1) << logs;  // nobody serves the table without the row
  // Repaired (deleted): a lockd takes over within the backoff's cap, the stray key reported.
  ASSERT_TRUE((*client)->txn({}, {etcd::Op::del(bad)}, {}, boottime_ns() + 2'000 * kMs).ok());
  const int n = wait_leader(15'000, l);
  ASSERT_GE(n, 0) << all_logs();
  EXPECT_NE(lockd_->log(n).find("event=foreign_keys count=1 keys=\"" + names + "x/y\""), std::string::npos)
      << lockd_->log(n);
}

TEST_F(LockdClusterTest, AFollowerNeverNamesItselfAsTheLeader) {
  // A lockd killed while it leads and restarted at once, on the same address: its election key
  // (with that address) lives on until its lease expires, and it reads it as the leader's.
  LockdProcess solo;
  const std::vector<std::string> args{"--key-file", (dir_.path() / "lockd.key").string(), "--store",
                                      "etcd://" + etcd_->endpoints() + "/self-hint", "--signing-key-file", signing_,
                                      "--leader-lease-s", "6", "--ttl-ms", "12000"};
  std::string err;
  ASSERT_TRUE(solo.start(args, dir_.path() / "solo.log", &err)) << err;
  const std::string self = solo.address().str();
  auto leads = [&] {
    AdminClient c(solo.address(), key_, {}, 300 * kMs);
    const auto all = c.counters();
    if (!all) return false;
    for (const auto& k : *all)
      if (k.key == "leading") return k.value == 1;
    return false;
  };
  const std::int64_t end = boottime_ns() + 10'000 * kMs;
  while (!leads() && boottime_ns() < end) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(leads()) << solo.log();
  solo.kill9();
  std::vector<std::string> again = args;
  again.insert(again.end(), {"--listen", self});
  ASSERT_TRUE(solo.start(again, dir_.path() / "solo.log", &err)) << err;
  ASSERT_EQ(solo.address().str(), self);
  AdminClient to_it(solo.address(), key_, W1, 500 * kMs);
  const Answer a = to_it.acquire("cl/self", S1, W1);
  ASSERT_TRUE(a.no_leader) << a.message() << "\n" << solo.log();
  EXPECT_EQ(a.message().find("leader \"" + self + "\""), std::string::npos) << a.message();
  EXPECT_NE(a.message().find("no leader known"), std::string::npos) << a.message();
}

TEST_F(LockdClusterTest, ANewLeaderAnswersWhileItLoadsTheTableAndServesItOnceLoaded) {
  const int l = wait_leader(10'000);
  ASSERT_GE(l, 0) << all_logs();
  // A large table, written under the leader's revision (as its own writes are).
  auto client = etcd::Client::open(etcd_->endpoints());
  ASSERT_TRUE(client.ok()) << client.status().message();
  const std::string shard = shard_prefix("/cluster-test", 0);
  auto key = (*client)->range(election_key(shard), {}, boottime_ns() + 2'000 * kMs);
  ASSERT_TRUE(key.ok() && key->kvs.size() == 1);
  const std::int64_t revision = key->kvs[0].create_revision;
  EtcdStore writer(std::shared_ptr<etcd::Client>(std::move(*client)), shard, revision, 128);
  constexpr int kRows = 24'000;
  std::vector<StoredName> rows;
  for (int i = 0; i < kRows; ++i) {
    StoredName n;
    n.name = "load/" + std::to_string(i);
    n.id = name_id_of(n.name);
    n.state = LockPhase::held;
    n.epoch = 1;
    n.owner = SandboxId{0xd0, static_cast<std::uint64_t>(i + 1)};
    n.worker = W1;
    n.ttl_ns = 6'000 * kMs;
    rows.push_back(n);
    if (rows.size() == kStoreBatchChangesMax || i + 1 == kRows) {
      writer.commit(rows, 1, {});
      rows.clear();
    }
  }
  lockd_->kill9(static_cast<std::size_t>(l));
  // The others are polled all along: the one that wins answers (not_leader, takeover_loading
  // 1) while the range reads run, instead of holding every datagram until they are done.
  bool answered_while_loading = false;
  int n = -1;
  const std::int64_t end = boottime_ns() + 20'000 * kMs;
  while (n < 0 && boottime_ns() < end) {
    for (std::size_t i = 0; i < lockd_->size(); ++i) {
      if (static_cast<int>(i) == l) continue;
      AdminClient c(lockd_->address(i), key_, {}, 50 * kMs);
      const auto all = c.counters();
      if (!all) continue;
      for (const auto& k : *all) {
        if (k.key == "takeover_loading" && k.value == 1) answered_while_loading = true;
        if (k.key == "leading" && k.value == 1) n = static_cast<int>(i);
      }
    }
  }
  ASSERT_GE(n, 0) << all_logs();
  EXPECT_TRUE(answered_while_loading) << all_logs();
  EXPECT_NE(lockd_->log(static_cast<std::size_t>(n)).find("event=take_over_loading"), std::string::npos)
      << lockd_->log(static_cast<std::size_t>(n));
  AdminClient next(lockd_->address(static_cast<std::size_t>(n)), key_, W1);
  const Answer shown = next.show("load/17");
  ASSERT_NE(shown.as<wire::NameInfo>(), nullptr) << shown.message();
  EXPECT_EQ(shown.as<wire::NameInfo>()->record.state, LockPhase::held);
}

/// An Answer that never came, for `why`.
Answer unanswered(Status why) {
  Answer a;
  a.status = std::move(why);
  return a;
}

/// A leader stopped (SIGSTOP) past its leadership lease while another takes over; resumed, it
/// is asked to refresh the lease it granted. Returns its answer.
Answer refresh_at_a_resumed_leader(LockdClusterTest& t, harness::LockdCluster& lockd, const wire::WireKey& key,
                                   int* new_leader, Epoch* epoch) {
  const int l = t.wait_leader(10'000);
  if (l < 0) return unanswered(Status(Errc::timeout, "no leader"));
  AdminClient old_leader(lockd.address(l), key, W1, 1000 * kMs);
  const Answer g = old_leader.acquire("cl/stop", S1, W1);
  if (g.as<wire::Grant>() == nullptr) return g;
  *epoch = g.as<wire::Grant>()->epoch;
  if (!lockd.stop(l).ok()) return unanswered(Status(Errc::invalid_argument, "the leader is gone"));
  *new_leader = t.wait_leader(10'000, l);
  (void)lockd.cont(l);
  const wire::HeartbeatEntry beat[] = {{name_id_of("cl/stop"), S1, *epoch}};
  return old_leader.heartbeat(beat);
}

TEST_F(LockdClusterTest, ALeaderStoppedPastItsLeaseIsReplacedAndServesNothingWhenItResumes) {
  int n = -1;
  Epoch e1 = 0;
  const Answer stale = refresh_at_a_resumed_leader(*this, *lockd_, key_, &n, &e1);
  ASSERT_GE(n, 0) << all_logs();
  // Its fence passed while it was stopped: it refreshes nothing, not even for a request that
  // waited in its socket; a refresh there would be a second lockd keeping the lease alive.
  EXPECT_EQ(stale.as<wire::HeartbeatAck>(), nullptr) << all_logs();
  EXPECT_TRUE(stale.no_leader) << stale.message() << "\n" << all_logs();
  AdminClient next(lockd_->address(n), key_, W1);
  const Answer shown = next.show("cl/stop");
  ASSERT_NE(shown.as<wire::NameInfo>(), nullptr) << shown.message();
  EXPECT_EQ(shown.as<wire::NameInfo>()->record.epoch, e1);
}

class LockdClusterWithoutFenceTest : public LockdClusterTest {
 protected:
  void SetUp() override {
    ablate_ = "self-fence";
    LockdClusterTest::SetUp();
  }
};

// The attack the fence stops: without it, the deposed leader keeps answering refreshes from its
// memory after another lockd took over - the holder's supervisor would count its lease from an
// answer the new leader never gave.
TEST_F(LockdClusterWithoutFenceTest, AResumedLeaderStillRefreshes) {
  int n = -1;
  Epoch e1 = 0;
  const Answer stale = refresh_at_a_resumed_leader(*this, *lockd_, key_, &n, &e1);
  ASSERT_GE(n, 0) << all_logs();
  ASSERT_NE(stale.as<wire::HeartbeatAck>(), nullptr) << stale.message();
  EXPECT_EQ(stale.as<wire::HeartbeatAck>()->entries.at(0).status, RefreshStatus::refreshed);
}

class LockdClusterShortTtlTest : public LockdClusterTest {
 protected:
  void SetUp() override {
    ttl_ms_ = 3000;  // the shortest above the failover bound (2000 ms): the test lasts a few TTLs
    LockdClusterTest::SetUp();
  }
};

// Repeated failovers do not keep a dead holder's name alive (DESIGN.md §4.1, §11: the restart
// rule). The holder's worker stops heartbeating (its supervisor died); from then on the leader
// is killed (-9) or stopped (SIGSTOP, past its leadership lease) every TTL/2 of wall-clock time
// (each leader serving what is left of that after its takeover, at least 500 ms), and each new leader restores the lease as refreshed at its takeover, less the `lived` marks of
// the incarnations since the one that last acknowledged the worker (incarnation a). The bound
// the code gives: the name is free once the leaders after a have served one TTL in total, plus,
// per leader that crashed, what its last durable lived mark missed: at most one lived-checkpoint
// interval (lived_checkpoint_interval_ns: 100 ms here) and the commit of that checkpoint. The failovers go on until the name is
// seen free or that bound falls within the current leader's TTL/2; by then another worker must
// be able to acquire the name. Meanwhile nothing may free it before the holder's last refresh
// ran out (a TTL from its send).
TEST_F(LockdClusterShortTtlTest, ADeadHoldersNameIsFreedWithinTheBoundWhileALeaderFailsOverEveryHalfTtl) {
  constexpr std::int64_t kTtlNs = 3000 * kMs;
  constexpr std::int64_t kLivedIntervalNs = lived_checkpoint_interval_ns(kTtlNs);
  // The commit of a lived checkpoint (an etcd transaction): a crash before it is durable loses
  // the interval before it too. Generous for a loaded machine (DESIGN.md says "about").
  constexpr std::int64_t kCheckpointCommitNs = 250 * kMs;
  // Each leader serves at least this long before it is failed over.
  constexpr std::int64_t kMinServeNs = 500 * kMs;
  // An expiry runs at lockd's next tick (2 ms), on a loaded machine a little later.
  constexpr std::int64_t kExpiryTickNs = 100 * kMs;
  const std::string name = "cl/dead";

  const int a = wait_leader(10'000);
  ASSERT_GE(a, 0) << all_logs();
  AdminClient holder(lockd_->socket_addresses(), key_, W1, 2000 * kMs);
  const Answer g = holder.acquire(name, S1, W1);
  ASSERT_NE(g.as<wire::Grant>(), nullptr) << g.message();
  const Epoch e1 = g.as<wire::Grant>()->epoch;
  const wire::HeartbeatEntry beat[] = {{name_id_of(name), S1, e1}};
  std::int64_t last_sent_ns = 0;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    last_sent_ns = boottime_ns();
    const Answer hb = holder.heartbeat(beat);
    ASSERT_NE(hb.as<wire::HeartbeatAck>(), nullptr) << hb.message();
    ASSERT_EQ(hb.as<wire::HeartbeatAck>()->entries.at(0).status, RefreshStatus::refreshed);
  }
  const std::int64_t last_beat_ns = boottime_ns();  // the holder stops here
  ASSERT_EQ(wait_leader(1'000), a) << "incarnation a must be the one that acknowledged the holder\n" << all_logs();

  // Watching the name at whoever leads: held until the last refresh ran out, then free.
  AdminClient watcher(lockd_->socket_addresses(), key_, {}, 300 * kMs);
  std::optional<std::int64_t> seen_free;
  auto look = [&] {
    const Answer shown = watcher.show(name);
    const std::int64_t answered_ns = boottime_ns();
    const auto* info = shown.as<wire::NameInfo>();
    const auto* deny = shown.as<wire::Deny>();  // a free name is forgotten: unknown_name
    if (info == nullptr && (deny == nullptr || deny->refusal != Refusal::unknown_name)) return;  // no leader now
    const bool held = info != nullptr && info->record.state == LockPhase::held;
    if (answered_ns < last_sent_ns + kTtlNs) {
      EXPECT_TRUE(held) << "freed before the holder's last refresh ran out";
    }
    if (!held && !seen_free) seen_free = answered_ns;
  };

  std::string timeline;
  auto at = [&](std::int64_t t) { return "+" + std::to_string((t - last_beat_ns) / kMs) + " ms"; };
  int leader = a;
  std::int64_t since_ns = last_beat_ns;  // a serves TTL/2 after the holder's last heartbeat
  std::int64_t counted_ns = 0;           // the uptime of the leaders after a that surely counts
  std::size_t failovers = 0;
  bool stop_next = false;
  std::optional<std::int64_t> bound;
  const std::int64_t give_up_ns = boottime_ns() + 60'000 * kMs;
  std::int64_t last_fault_ns = last_beat_ns;
  while (!seen_free && boottime_ns() < give_up_ns) {
    // A failover every TTL/2 of wall-clock time: with failovers taking ~1 s, each leader after a
    // serves only a few hundred ms, less than the TTL/4 lived-checkpoint interval once was.
    const std::int64_t fault_at = std::max(last_fault_ns + kTtlNs / 2, since_ns + kMinServeNs);
    if (leader != a) {
      // This leader restored the lease with at most TTL - counted left: it must free the name
      // by then, unless it is failed over first.
      const std::int64_t due = since_ns + std::max<std::int64_t>(0, kTtlNs - counted_ns);
      if (due <= fault_at) {
        bound = due + kExpiryTickNs;
        break;
      }
    }
    while (boottime_ns() < fault_at && !seen_free) {
      look();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (seen_free) break;
    const std::int64_t fault_ns = boottime_ns();
    last_fault_ns = fault_ns;
    if (stop_next) {
      ASSERT_TRUE(lockd_->stop(static_cast<std::size_t>(leader)).ok());
    } else {
      lockd_->kill9(static_cast<std::size_t>(leader));
    }
    if (leader != a)
      counted_ns += std::max<std::int64_t>(0, fault_ns - since_ns - kLivedIntervalNs - kCheckpointCommitNs);
    const auto t = lockd_->wait_takeover(fault_ns, std::chrono::milliseconds(15'000), leader);
    ASSERT_TRUE(t.ok()) << t.message();
    ++failovers;
    timeline += std::string(stop_next ? "stopped" : "killed") + " lockd " + std::to_string(leader) + " at " +
                at(fault_ns) + ", lockd " + std::to_string(t->index) + " took over at " + at(t->at_ns) + "\n";
    if (stop_next) {
      ASSERT_TRUE(lockd_->cont(static_cast<std::size_t>(leader)).ok());
    } else {
      const Status restarted = lockd_->restart(static_cast<std::size_t>(leader));
      ASSERT_TRUE(restarted.ok()) << restarted.message();
    }
    leader = t->index;
    since_ns = t->at_ns;
    stop_next = !stop_next;
  }
  while (bound && boottime_ns() < *bound && !seen_free) {
    look();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(seen_free || bound) << "neither freed nor at the bound after 60 s\n" << timeline << all_logs();
  std::printf("%s%s after the holder's last heartbeat, %zu failovers\n", timeline.c_str(),
              seen_free ? ("seen free at " + at(*seen_free)).c_str() : ("the bound passed at " + at(*bound)).c_str(),
              failovers);

  // Free: another worker's sandbox acquires it at a higher epoch (at the bound at the latest).
  AdminClient other(lockd_->socket_addresses(), key_, W2, 5000 * kMs);
  const Answer taken = other.acquire(name, S2, W2);
  ASSERT_NE(taken.as<wire::Grant>(), nullptr) << taken.message() << "\n" << timeline << all_logs();
  EXPECT_GT(taken.as<wire::Grant>()->epoch, e1);
}

}  // namespace
}  // namespace leasehold::lockd
