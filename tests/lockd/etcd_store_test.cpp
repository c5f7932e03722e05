// lockd on etcd: the store's URL and row format, the EtcdStore against a real etcd (guarded
// writes, chunked batches, a load that sees them), and the leader election with its fence.
#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/lease/clock.hpp"
#include "leasehold/lockd/etcd_store.hpp"
#include "leasehold/lockd/leadership.hpp"
#include "etcd_fixture.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

namespace leasehold::lockd {
namespace {

constexpr std::int64_t kMs = 1'000'000;

StoredName row(std::string name, LockPhase state, Epoch e) {
  StoredName n;
  n.name = std::move(name);
  n.id = name_id_of(n.name);
  n.state = state;
  n.epoch = e;
  n.owner = SandboxId{0, 7};
  n.worker = WorkerId{3, 4};
  n.ttl_ns = 10'000 * kMs;
  return n;
}

TEST(EtcdUrl, ParsesEndpointsAndPrefixAndNamesWhatIsWrong) {
  auto a = parse_etcd_url("etcd://127.0.0.1:2379");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->endpoints, "127.0.0.1:2379");
  EXPECT_EQ(a->prefix, "/leasehold");
  auto b = parse_etcd_url("etcd://h1:1,[::1]:2,h3:3/cluster/a");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->endpoints, "h1:1,[::1]:2,h3:3");
  EXPECT_EQ(b->prefix, "/cluster/a");
  EXPECT_NE(parse_etcd_url("lockd.db").status().message().find("not an etcd:// URL"), std::string::npos);
  EXPECT_NE(parse_etcd_url("etcd://h1:1,,h2:2").status().message().find("empty endpoint"), std::string::npos);
  EXPECT_NE(parse_etcd_url("etcd://h1:0").status().message().find("\"h1:0\" has no valid :PORT"), std::string::npos);
  EXPECT_NE(parse_etcd_url("etcd://h1:1/a//b").status().message().find("empty segment"), std::string::npos);
  EXPECT_EQ(shard_prefix("/lh", 0), "/lh/shard/0/");
  EXPECT_EQ(election_key(shard_prefix("/lh", 3)), "/lh/shard/3/election");
}

TEST(EtcdRow, RoundTripsEveryFieldAndRefusesCorruptRows) {
  StoredName n = row("job/a-1", LockPhase::transferring, 9);
  n.old_epoch = 8;
  n.peer = SandboxId{1, 2};
  n.peer_worker = WorkerId{5, 6};
  n.epoch_fresh = true;
  const std::string text = encode_row(n);
  auto back = decode_row(n.id, text);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, n);
  // Another name's key, a bad field, a truncated row, an epoch above the limit: refused, named.
  EXPECT_NE(decode_row(name_id_of("job/b"), text).status().message().find("does not hash"), std::string::npos);
  std::string bad_state = text;
  bad_state.replace(bad_state.find("transferring"), 12, "flying");
  EXPECT_NE(decode_row(n.id, bad_state).status().message().find("no valid state"), std::string::npos);
  EXPECT_NE(decode_row(n.id, text.substr(0, text.size() - 8)).status().message().find("fresh"), std::string::npos);
  std::string big = text;
  big.replace(big.find("epoch=9"), 7, "epoch=9223372036854775808");
  EXPECT_EQ(decode_row(n.id, big).status().code(), Errc::corrupt);
  EXPECT_EQ(decode_row(n.id, text + " extra=1").status().code(), Errc::corrupt);
}

wire::WireKey cluster_key(std::uint8_t fill, std::uint16_t id) {
  return wire::WireKey(std::vector<std::uint8_t>(32, fill), wire::KeyKind::cluster, id);
}

TEST(ClusterKeys, FingerprintsNameAKeyWithoutRevealingItAndTheRecordComparesSets) {
  const wire::WireKey k1 = cluster_key(0x11, 1), k1b = cluster_key(0x22, 1), k2 = cluster_key(0x33, 2);
  const std::string fp = cluster_key_fingerprint(k1);
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp, cluster_key_fingerprint(cluster_key(0x11, 1)));  // stable
  EXPECT_NE(fp, cluster_key_fingerprint(k1b));                   // another key, same id
  EXPECT_NE(fp, cluster_key_fingerprint(cluster_key(0x11, 3)));  // the same bytes, another id
  EXPECT_EQ(fp.find("1111"), std::string::npos);
  // Admin keys are not the cluster's: left out; ids in order.
  const std::string one = cluster_keys_value({k1, wire::WireKey(std::vector<std::uint8_t>(32, 9), wire::KeyKind::admin, 7)});
  EXPECT_EQ(one, "v=1 keys=1:" + fp);
  const std::string both = cluster_keys_value({k2, k1});
  EXPECT_EQ(both, "v=1 keys=1:" + fp + ",2:" + cluster_key_fingerprint(k2));
  // May lead: holding every recorded key (a superset: a rotation adding a key).
  EXPECT_EQ(cluster_keys_mismatch(one, one), "");
  EXPECT_EQ(cluster_keys_mismatch(both, one), "");
  // May not: a recorded key missing, or another key under a recorded id; both sets named.
  const std::string lacks = cluster_keys_mismatch(one, both);
  EXPECT_NE(lacks.find("lacks cluster key 2"), std::string::npos) << lacks;
  EXPECT_NE(lacks.find(one), std::string::npos) << lacks;
  EXPECT_NE(lacks.find(both), std::string::npos) << lacks;
  const std::string other = cluster_keys_mismatch(cluster_keys_value({k1b}), one);
  EXPECT_NE(other.find("cluster key 1 is another key (fingerprint " + cluster_key_fingerprint(k1b) + ", the cluster's " +
                       fp + ")"),
            std::string::npos)
      << other;
  EXPECT_NE(cluster_keys_mismatch(one, "junk").find("does not parse"), std::string::npos);
}

TEST(Leadership, AFailedLeadershipBacksOffGrowingJitteredAndCapped) {
  // n-th failure in a row: 250 ms · 2^(n-1), capped at 10 s, jittered down by up to half.
  EXPECT_EQ(step_down_backoff_ns(1, 0), 250 * kMs);
  EXPECT_EQ(step_down_backoff_ns(2, 0), 500 * kMs);
  EXPECT_EQ(step_down_backoff_ns(3, 0), 1'000 * kMs);
  EXPECT_EQ(step_down_backoff_ns(7, 0), 10'000 * kMs);
  EXPECT_EQ(step_down_backoff_ns(60, 0), 10'000 * kMs);
  EXPECT_EQ(step_down_backoff_ns(1, 125 * kMs), 125 * kMs);  // the most jitter: half
  EXPECT_EQ(step_down_backoff_ns(1, 125 * kMs + 1), 250 * kMs);  // wraps: never below half
  for (std::uint64_t r : {1ull, 77ull, 123'456'789ull, ~0ull}) {
    const std::int64_t b = step_down_backoff_ns(4, r);
    EXPECT_GE(b, 1'000 * kMs);
    EXPECT_LE(b, 2'000 * kMs);
  }
}

TEST(Leadership, TheServingWindowEndsBeforeTheLeaseCouldExpire) {
  // L = 2 s, rho = 1 %, margin 100 ms: 1.98 s - 0.1 s after the keep-alive's send.
  EXPECT_EQ(serve_until_ns(5 * kMs, 2, 0.01, 100 * kMs), 5 * kMs + 1'880 * kMs);
  EXPECT_LT(serve_until_ns(0, 1, 0.0, 1), 1'000 * kMs);
}

// ---- against a real etcd -------------------------------------------------------------------

class EtcdTest : public testing::EtcdFixture {
 protected:
  /// Wins the election key of `shard` the way LeadershipCore::campaign does; the revision.
  std::int64_t elect(const std::string& shard) {
    auto lease = client_->lease_grant(30, deadline(2000));
    EXPECT_TRUE(lease.ok());
    auto t = client_->txn({etcd::Compare::of(election_key(shard), etcd::Compare::Target::create_revision,
                                         etcd::Compare::Op::equal, 0)},
                          {etcd::Op::put(election_key(shard), "127.0.0.1:1", lease.ok() ? lease->id : 0)}, {},
                          deadline(2000));
    EXPECT_TRUE(t.ok() && t->succeeded);
    return t.ok() ? t->revision : 0;
  }
  static bool wait_until(const std::function<bool()>& pred, std::int64_t ms) {
    const std::int64_t end = boottime_ns() + ms * kMs;
    while (boottime_ns() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
  }
};

TEST_F(EtcdTest, CommitsInGuardedChunksAndLoadsWhatItWrote) {
  const std::string shard = shard_prefix("/t1", 0);
  const std::int64_t r = elect(shard);
  ASSERT_GT(r, 0);
  EtcdStore store(client_, shard, r, /*txn_ops_max=*/4);  // 12 rows + marks: several transactions
  EXPECT_EQ(store.incarnation(), static_cast<std::uint64_t>(r));
  std::vector<StoredName> rows;
  for (int i = 0; i < 12; ++i) rows.push_back(row("n/" + std::to_string(i), LockPhase::held, 3));
  rows.push_back(row("n/0", LockPhase::free, 4));  // the same name twice: the last state counts
  const WorkerId w{1, 1};
  const WorkerId w2{1, 2};
  store.commit(rows, 40, StoreMarks{static_cast<std::uint64_t>(r), 1'500 * kMs, {w, w2}, {{w, 12'345}}, {}});
  const StoredTable t = store.load();
  ASSERT_EQ(t.names.size(), 12u);
  EXPECT_EQ(t.epoch_high_water, 40u);
  const auto n0 = std::find_if(t.names.begin(), t.names.end(), [](const StoredName& n) { return n.name == "n/0"; });
  ASSERT_NE(n0, t.names.end());
  EXPECT_EQ(n0->state, LockPhase::free);
  EXPECT_EQ(n0->epoch, 4u);
  EXPECT_EQ(t.lived_ns.at(static_cast<std::uint64_t>(r)), 1'500 * kMs);
  EXPECT_EQ(t.seen.at(w), static_cast<std::uint64_t>(r));
  EXPECT_EQ(t.seen.at(w2), static_cast<std::uint64_t>(r));
  EXPECT_EQ(t.replay_floor.at(w), 12'345u);  // "R seq=12345"
  EXPECT_EQ(t.replay_floor.count(w2), 0u);   // "R": none recorded
  // Lived marks no restart needs are deleted in the guarded transactions of a later batch.
  ASSERT_TRUE(client_->put(shard + "lived/3", "7", deadline(2000)).ok());
  StoreMarks prune{static_cast<std::uint64_t>(r), 1'600 * kMs, {}, {}, {3}};
  store.commit({}, 0, prune);
  EXPECT_EQ(store.load().lived_ns, (std::map<std::uint64_t, std::int64_t>{{static_cast<std::uint64_t>(r), 1'600 * kMs}}));
  // Loaded in name-id order, as NameStore::load.
  EXPECT_TRUE(std::is_sorted(t.names.begin(), t.names.end(),
                             [](const StoredName& a, const StoredName& b) { return a.id < b.id; }));
}

TEST_F(EtcdTest, ADeposedLeadersWriteIsRejectedAndWritesNothing) {
  const std::string shard = shard_prefix("/t2", 0);
  const std::int64_t r1 = elect(shard);
  EtcdStore old_leader(client_, shard, r1);
  const StoredName a[] = {row("x", LockPhase::held, 1)};
  old_leader.commit(a, 1, {});
  // The leadership moves on: the key is deleted (its lease expired) and won again.
  ASSERT_TRUE(client_->txn({}, {etcd::Op::del(election_key(shard))}, {}, deadline(2000)).ok());
  const std::int64_t r2 = elect(shard);
  ASSERT_GT(r2, r1);
  const StoredName b[] = {row("x", LockPhase::held, 2)};
  EXPECT_THROW(old_leader.commit(b, 2, {}), StoreRejected);
  EtcdStore new_leader(client_, shard, r2);
  const StoredTable t = new_leader.load();
  ASSERT_EQ(t.names.size(), 1u);
  EXPECT_EQ(t.names[0].epoch, 1u);  // the deposed leader's second write is not there
  EXPECT_EQ(t.epoch_high_water, 1u);
}

TEST_F(EtcdTest, ACorruptRowIsRefusedAtLoadNamingItsKey) {
  const std::string shard = shard_prefix("/t3", 0);
  const std::int64_t r = elect(shard);
  const std::string key = shard + "names/" + name_id_of("y").str();
  ASSERT_TRUE(client_->put(key, "v=1 name=y state=held", deadline(2000)).ok());
  EtcdStore store(client_, shard, r);
  try {
    (void)store.load();
    FAIL() << "a corrupt row loaded";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
  }
}

TEST_F(EtcdTest, KeysUnderNamesThatAreNoRowsAreSkippedAndCounted) {
  const std::string shard = shard_prefix("/t8", 0);
  const std::int64_t r = elect(shard);
  EtcdStore store(client_, shard, r);
  const StoredName a[] = {row("z", LockPhase::held, 3)};
  store.commit(a, 3, {});
  // Put there by hand (etcdctl): not names/<name-id>, so not rows.
  ASSERT_TRUE(client_->put(shard + "names/x/y", "anything", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "names/" + name_id_of("z").str() + "/backup", "v=1", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "names/junk", "v=1 name=junk", deadline(2000)).ok());
  const StoredTable t = store.load();
  ASSERT_EQ(t.names.size(), 1u);
  EXPECT_EQ(t.names[0].name, "z");
  EXPECT_EQ(t.names[0].epoch, 3u);
  EXPECT_EQ(t.foreign_keys, 3u);
  ASSERT_EQ(t.foreign_key_samples.size(), 3u);
  EXPECT_EQ(t.foreign_key_samples[0], shard + "names/" + name_id_of("z").str() + "/backup");
  EXPECT_EQ(t.foreign_key_samples[2], shard + "names/x/y");
}

// A restart-rule mark that does not parse (put by hand) is no mark: skipped and counted, not a
// reason to refuse the load - a shard whose every replica refused it would have no leader.
TEST_F(EtcdTest, MarksThatDoNotParseAreSkippedAndCounted) {
  const std::string shard = shard_prefix("/t10", 0);
  const std::int64_t r = elect(shard);
  EtcdStore store(client_, shard, r);
  const WorkerId w{0x10, 0x20}, junk_value{0x10, 0x21};
  ASSERT_TRUE(client_->put(shard + "lived/5", "100", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "seen/" + w.str(), "3 seq=9", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "lived/abc", "1", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "lived/7", "zz", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "seen/not-a-uuid", "1", deadline(2000)).ok());
  ASSERT_TRUE(client_->put(shard + "seen/" + junk_value.str(), "4 floor=2", deadline(2000)).ok());
  const StoredTable t = store.load();
  EXPECT_EQ(t.lived_ns, (std::map<std::uint64_t, std::int64_t>{{5, 100}}));
  ASSERT_EQ(t.seen.size(), 1u);
  EXPECT_EQ(t.seen.at(w), 3u);
  EXPECT_EQ(t.replay_floor.at(w), 9u);
  EXPECT_EQ(t.replay_floor.count(junk_value), 0u);
  EXPECT_EQ(t.foreign_keys, 4u);
  ASSERT_EQ(t.foreign_key_samples.size(), 4u);
  EXPECT_EQ(t.foreign_key_samples[0], shard + "lived/7");
  EXPECT_EQ(t.foreign_key_samples[1], shard + "lived/abc");
}

TEST_F(EtcdTest, ALeaderWhoseStoreFailedBacksOffBeforeCampaigningAgain) {
  const std::string shard = shard_prefix("/t9", 0);
  LeadershipConfig c;
  c.shard_prefix = shard;
  c.advertise = "127.0.0.1:1009";
  c.lease_s = 1;
  auto made = Leadership::start(client_, c, nullptr);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Leadership& l = **made;
  for (unsigned n = 1; n <= 3; ++n) {
    ASSERT_TRUE(wait_until([&] { return l.view().leading; }, 8000)) << l.view().last_error;
    const std::int64_t rev = l.view().revision;
    const std::int64_t asked = boottime_ns();
    l.step_down(rev, Leadership::StepDown::failed);
    ASSERT_TRUE(wait_until([&] { return !l.view().leading; }, 2000));
    const Leadership::View v = l.view();
    EXPECT_EQ(v.failed_in_a_row, n);
    EXPECT_NE(v.last_error.find(std::to_string(n) + " in a row"), std::string::npos) << v.last_error;
    const std::int64_t wait = v.campaign_after_ns - asked;
    EXPECT_GE(wait, step_down_backoff_ns(n, 0) / 2);  // at least half the step: the most jitter
    EXPECT_LE(wait, step_down_backoff_ns(n, 0) + 1'000 * kMs);
    // It does not win again before the backoff ends (nobody else campaigns: it is alone).
    ASSERT_TRUE(wait_until([&] { return l.view().leading; }, 8000));
    EXPECT_GE(boottime_ns(), v.campaign_after_ns);
    EXPECT_GT(l.view().revision, rev);
  }
  // A fenced step-down is no failure of its own: it campaigns again at once, no backoff.
  const std::int64_t rev = l.view().revision;
  const unsigned before = l.view().failed_in_a_row;
  l.step_down(rev, Leadership::StepDown::fenced);
  ASSERT_TRUE(wait_until([&] { return l.view().leading && l.view().revision > rev; }, 3000));
  EXPECT_EQ(l.view().failed_in_a_row, before);
}

TEST_F(EtcdTest, ALeaderWhoseElectionKeyIsDeletedByHandStopsServingAtOnce) {
  const std::string shard = shard_prefix("/t10", 0);
  LeadershipConfig c;
  c.shard_prefix = shard;
  c.advertise = "127.0.0.1:1010";
  c.lease_s = 20;  // a keep-alive every 5 s: not what notices it
  auto made = Leadership::start(client_, c, nullptr);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Leadership& l = **made;
  ASSERT_TRUE(wait_until([&] { return l.view().leading; }, 5000)) << l.view().last_error;
  const Leadership::View won = l.view();
  // A new leader serves only once the one before it has checked its key.
  EXPECT_GE(won.serve_from_ns, won.serve_until_ns - serve_until_ns(0, 20, c.clock_rate_bound, c.margin_ns) +
                                   c.key_check_ns + c.margin_ns);
  EXPECT_FALSE(l.serving(won.revision, won.serve_from_ns - 1));
  ASSERT_TRUE(wait_until([&] { return l.serving(won.revision, boottime_ns()); }, 2000));
  // An operator deletes the key (etcdctl del): another lockd could win it at its next poll.
  ASSERT_TRUE(client_->txn({}, {etcd::Op::del(election_key(shard))}, {}, deadline(2000)).ok());
  const std::int64_t deleted = boottime_ns();
  ASSERT_TRUE(wait_until([&] { return !l.serving(won.revision, boottime_ns()); }, 2000)) << l.view().last_error;
  EXPECT_LT(boottime_ns(), won.serve_until_ns);  // long before its lease could have run out
  EXPECT_LT(boottime_ns() - deleted, 5'000 * kMs);  // and before its next keep-alive
  // Stepped down from that revision for good (it may have won the free key again since).
  EXPECT_NE(l.view().revision, won.revision);
}

TEST_F(EtcdTest, OneOfTwoCandidatesLeadsTheOtherFollowsAndTakesOverWhenItStops) {
  const std::string shard = shard_prefix("/t4", 0);
  auto make = [&](const std::string& addr) {
    LeadershipConfig c;
    c.shard_prefix = shard;
    c.advertise = addr;
    c.lease_s = 1;
    auto l = Leadership::start(client_, c, nullptr);
    EXPECT_TRUE(l.ok()) << l.status().message();
    return l.ok() ? std::move(*l) : nullptr;
  };
  auto a = make("127.0.0.1:1001");
  auto b = make("127.0.0.1:1002");
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(wait_until([&] { return a->view().leading != b->view().leading; }, 5000));
  Leadership* leader = a->view().leading ? a.get() : b.get();
  Leadership* follower = leader == a.get() ? b.get() : a.get();
  const Leadership::View lv = leader->view();
  EXPECT_TRUE(wait_until([&] { return leader->serving(lv.revision, boottime_ns()); }, 1000));
  EXPECT_FALSE(follower->serving(lv.revision, boottime_ns()));
  ASSERT_TRUE(wait_until([&] { return follower->view().leader == lv.leader; }, 2000));
  // The leader keeps its lease alive: still serving after several lease TTLs.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_TRUE(leader->serving(lv.revision, boottime_ns()));
  // Stopped, it revokes its lease: the follower wins at once, at a higher revision.
  const std::int64_t stopped = boottime_ns();
  if (leader == a.get()) a.reset();
  else b.reset();
  ASSERT_TRUE(wait_until([&] { return follower->view().leading; }, 3000));
  EXPECT_GT(follower->view().revision, lv.revision);
  EXPECT_LT(boottime_ns() - stopped, 1'000 * kMs);  // the poll interval, not the lease TTL
}

TEST_F(EtcdTest, ALeaderCutOffFromEtcdStopsServingBeforeItsLeaseCouldExpire) {
  const std::string shard = shard_prefix("/t5", 0);
  LeadershipConfig c;
  c.shard_prefix = shard;
  c.advertise = "127.0.0.1:1003";
  c.lease_s = 1;
  auto l = Leadership::start(client_, c, nullptr);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_TRUE(wait_until([&] { return (*l)->view().leading; }, 5000));
  const std::int64_t rev = (*l)->view().revision;
  ASSERT_TRUE(wait_until([&] { return (*l)->serving(rev, boottime_ns()); }, 1000));
  ASSERT_TRUE(cluster_->stop(0).ok());  // etcd answers nothing: no keep-alive is acknowledged
  const std::int64_t cut = boottime_ns();
  // The fence in force at the cut is within the serving window of a keep-alive sent before it,
  // and no later keep-alive moves it: the leader stops serving by then.
  const std::int64_t fence = (*l)->view().serve_until_ns;
  EXPECT_LE(fence, cut + serve_until_ns(0, 1, c.clock_rate_bound, c.margin_ns));
  EXPECT_FALSE((*l)->serving(rev, fence));
  ASSERT_TRUE(wait_until([&] { return !(*l)->serving(rev, boottime_ns()); }, 3000));
  EXPECT_GE(boottime_ns(), fence);  // not before the fence either: the keep-alives were answered
  ASSERT_TRUE(cluster_->cont(0).ok());
  // Back in touch, it campaigns again and leads at a new revision (its old key went with its lease).
  ASSERT_TRUE(wait_until([&] { return (*l)->view().leading && (*l)->view().revision > rev; }, 8000))
      << (*l)->view().last_error;
}

TEST_F(EtcdTest, TheClusterKeyRecordIsCreatedOnceAndRefusesAnotherClustersKey) {
  const std::string mine = cluster_keys_value({cluster_key(0x11, 1)});
  std::string note;
  ASSERT_TRUE(check_cluster_keys(*client_, "/t6", mine, deadline(2000), &note).ok());
  EXPECT_EQ(note, "created");
  ASSERT_TRUE(check_cluster_keys(*client_, "/t6", mine, deadline(2000), &note).ok());
  EXPECT_EQ(note, "matches");
  // Another cluster's key: refused, naming both records; the record stays the first one's.
  const std::string other = cluster_keys_value({cluster_key(0x22, 1)});
  const Status refused = check_cluster_keys(*client_, "/t6", other, deadline(2000));
  EXPECT_EQ(refused.code(), Errc::permission_denied);
  EXPECT_NE(refused.message().find(other), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find(mine), std::string::npos) << refused.message();
  auto rec = client_->range(cluster_key_key("/t6"), {}, deadline(2000));
  ASSERT_TRUE(rec.ok() && rec->kvs.size() == 1);
  EXPECT_EQ(rec->kvs[0].value, mine);
  // One key in common (a rotation not yet given to this lockd): it may start, and waits.
  EXPECT_TRUE(check_cluster_keys(*client_, "/t6", cluster_keys_value({cluster_key(0x11, 1), cluster_key(0x33, 2)}),
                                 deadline(2000))
                  .ok());
}

TEST_F(EtcdTest, OnlyALockdHoldingEveryRecordedClusterKeyWinsAndTheRecordFollowsRotations) {
  const std::string shard = shard_prefix("/t7", 0);
  const wire::WireKey k1 = cluster_key(0x11, 1), k2 = cluster_key(0x33, 2), stranger = cluster_key(0x22, 1);
  auto make = [&](const std::string& addr, std::vector<wire::WireKey> keys) {
    LeadershipConfig c;
    c.shard_prefix = shard;
    c.advertise = addr;
    c.lease_s = 1;
    c.cluster_key_path = cluster_key_key("/t7");
    c.cluster_keys = cluster_keys_value(keys);
    auto l = Leadership::start(client_, c, nullptr);
    EXPECT_TRUE(l.ok()) << l.status().message();
    return l.ok() ? std::move(*l) : nullptr;
  };
  auto record = [&] {
    auto rec = client_->range(cluster_key_key("/t7"), {}, deadline(2000));
    return rec.ok() && !rec->kvs.empty() ? rec->kvs[0].value : std::string();
  };
  auto a = make("127.0.0.1:2001", {k1});
  ASSERT_TRUE(wait_until([&] { return a->view().leading; }, 5000)) << a->view().last_error;
  EXPECT_EQ(record(), cluster_keys_value({k1}));  // the first election records the winner's keys
  auto b = make("127.0.0.1:2002", {stranger});
  // The leader stops: the lockd with another cluster key never wins, and says why.
  a.reset();
  ASSERT_TRUE(wait_until([&] { return b->view().last_error.find("refusing to campaign") != std::string::npos; }, 3000))
      << b->view().last_error;
  EXPECT_NE(b->view().last_error.find(cluster_key_fingerprint(stranger)), std::string::npos) << b->view().last_error;
  EXPECT_NE(b->view().last_error.find(cluster_key_fingerprint(k1)), std::string::npos) << b->view().last_error;
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // several polls
  EXPECT_FALSE(b->view().leading);
  // A lockd with the recorded key and a new one wins, and its election records both.
  auto c = make("127.0.0.1:2003", {k1, k2});
  ASSERT_TRUE(wait_until([&] { return c->view().leading; }, 5000)) << c->view().last_error;
  EXPECT_EQ(record(), cluster_keys_value({k1, k2}));
  EXPECT_FALSE(b->view().leading);
  // The old key removed at the leader (SIGHUP): the record follows it.
  c->set_cluster_keys(cluster_keys_value({k2}));
  EXPECT_TRUE(wait_until([&] { return record() == cluster_keys_value({k2}); }, 3000)) << record();
}

}  // namespace
}  // namespace leasehold::lockd
