// etcd::Client against a real one-member etcd on loopback: ranges (prefix, limit, revision),
// transactions (both branches, range ops in a branch), leases (grant, keep-alive, revoke and the
// keys that go with it), deadlines against a stopped member, the errors of open(); prefix_end.
#include "leasehold/etcd/client.hpp"
#include "leasehold/harness/etcd.hpp"
#include "leasehold/harness/process.hpp"
#include "leasehold/lease/clock.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace leasehold::etcd {
namespace {

constexpr std::int64_t kMs = 1'000'000;

/// A deadline `ms` from now (CLOCK_BOOTTIME).
std::int64_t in_ms(std::int64_t ms) { return boottime_ns() + ms * kMs; }

/// Generous: the debug build runs under ASan on a loaded machine, and etcd fsyncs every write.
constexpr std::int64_t kCallMs = 10'000;

class EtcdClient : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bin = harness::etcd_binary();
    if (!bin) GTEST_SKIP() << bin.message();
    auto cluster = harness::EtcdCluster::start(1, dir_.path().string());
    ASSERT_TRUE(cluster.ok()) << cluster.message();
    cluster_ = std::move(*cluster);
    auto client = Client::open(cluster_->endpoints());
    ASSERT_TRUE(client.ok()) << client.message();
    client_ = std::move(*client);
  }

  void put(const std::string& k, const std::string& v, std::int64_t lease = 0) {
    const Status st = client_->put(k, v, in_ms(kCallMs), lease);
    ASSERT_TRUE(st.ok()) << st.message();
  }

  harness::TempDir dir_{"leasehold-etcd-test"};
  std::unique_ptr<harness::EtcdCluster> cluster_;
  std::unique_ptr<Client> client_;  // destroyed before the cluster
};

TEST_F(EtcdClient, PutThenRangeOneKeyAPrefixALimitAndARevision) {
  EXPECT_EQ(client_->endpoints(), cluster_->endpoints());
  put("app/a", "1");
  put("app/b", "2");
  put("app/c", "3");
  put("apq", "outside the prefix");
  put("other", "x");

  auto one = client_->range("app/b", "", in_ms(kCallMs));
  ASSERT_TRUE(one.ok()) << one.message();
  ASSERT_EQ(one->kvs.size(), 1u);
  EXPECT_EQ(one->kvs[0].key, "app/b");
  EXPECT_EQ(one->kvs[0].value, "2");
  EXPECT_EQ(one->kvs[0].version, 1);
  EXPECT_GT(one->kvs[0].create_revision, 0);
  EXPECT_EQ(one->kvs[0].mod_revision, one->kvs[0].create_revision);
  EXPECT_EQ(one->kvs[0].lease, 0);
  EXPECT_EQ(one->count, 1);
  EXPECT_FALSE(one->more);
  EXPECT_GE(one->revision, one->kvs[0].mod_revision);

  auto none = client_->range("app/zzz", "", in_ms(kCallMs));
  ASSERT_TRUE(none.ok()) << none.message();
  EXPECT_TRUE(none->kvs.empty());
  EXPECT_EQ(none->count, 0);

  auto all = client_->range("app/", prefix_end("app/"), in_ms(kCallMs));
  ASSERT_TRUE(all.ok()) << all.message();
  ASSERT_EQ(all->kvs.size(), 3u);
  EXPECT_EQ(all->kvs[0].key, "app/a");  // keys ascend
  EXPECT_EQ(all->kvs[1].key, "app/b");
  EXPECT_EQ(all->kvs[2].key, "app/c");
  EXPECT_EQ(all->count, 3);
  EXPECT_FALSE(all->more);

  auto two = client_->range("app/", prefix_end("app/"), in_ms(kCallMs), /*limit=*/2);
  ASSERT_TRUE(two.ok()) << two.message();
  ASSERT_EQ(two->kvs.size(), 2u);
  EXPECT_EQ(two->kvs[0].key, "app/a");
  EXPECT_EQ(two->kvs[1].key, "app/b");
  EXPECT_TRUE(two->more);
  EXPECT_EQ(two->count, 3);  // before the limit

  // An older revision still sees the value it had then.
  const std::int64_t before = all->revision;
  put("app/a", "1 again");
  auto now = client_->range("app/a", "", in_ms(kCallMs));
  ASSERT_TRUE(now.ok()) << now.message();
  ASSERT_EQ(now->kvs.size(), 1u);
  EXPECT_EQ(now->kvs[0].value, "1 again");
  EXPECT_EQ(now->kvs[0].version, 2);
  EXPECT_GT(now->revision, before);
  auto then = client_->range("app/a", "", in_ms(kCallMs), 0, before);
  ASSERT_TRUE(then.ok()) << then.message();
  ASSERT_EQ(then->kvs.size(), 1u);
  EXPECT_EQ(then->kvs[0].value, "1");
}

TEST_F(EtcdClient, TxnRunsTheSuccessBranchWhenTheCompareHoldsAndTheFailureBranchOtherwise) {
  // "create the key if it does not exist": create_revision == 0.
  const std::vector<Compare> absent{Compare::of("lock/x", Compare::Target::create_revision, Compare::Op::equal, 0)};
  const std::vector<Op> create{Op::put("lock/x", "holder-1"), Op::get("lock/x")};
  const std::vector<Op> read{Op::get("lock/", prefix_end("lock/"))};

  auto first = client_->txn(absent, create, read, in_ms(kCallMs));
  ASSERT_TRUE(first.ok()) << first.message();
  EXPECT_TRUE(first->succeeded);
  EXPECT_GT(first->revision, 0);
  ASSERT_EQ(first->ranges.size(), 1u);  // the put gives none
  ASSERT_EQ(first->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(first->ranges[0].kvs[0].value, "holder-1");
  const std::int64_t created = first->ranges[0].kvs[0].create_revision;
  EXPECT_EQ(created, first->revision);

  const std::vector<Op> steal{Op::put("lock/x", "holder-2")};
  auto second = client_->txn(absent, steal, read, in_ms(kCallMs));
  ASSERT_TRUE(second.ok()) << second.message();
  EXPECT_FALSE(second->succeeded);
  EXPECT_EQ(second->revision, first->revision);  // nothing written
  ASSERT_EQ(second->ranges.size(), 1u);
  ASSERT_EQ(second->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(second->ranges[0].kvs[0].key, "lock/x");
  EXPECT_EQ(second->ranges[0].kvs[0].value, "holder-1");

  // Guarded by the revision that created it: the holder may update and then delete it.
  const std::vector<Compare> mine{Compare::of("lock/x", Compare::Target::create_revision, Compare::Op::equal, created)};
  auto update = client_->txn(mine, {Op::put("lock/x", "holder-1, again")}, {}, in_ms(kCallMs));
  ASSERT_TRUE(update.ok()) << update.message();
  EXPECT_TRUE(update->succeeded);
  EXPECT_GT(update->revision, first->revision);
  EXPECT_TRUE(update->ranges.empty());

  const std::vector<Compare> value_is{Compare::of_value("lock/x", Compare::Op::equal, "holder-1, again")};
  auto del = client_->txn(value_is, {Op::del("lock/x")}, {}, in_ms(kCallMs));
  ASSERT_TRUE(del.ok()) << del.message();
  EXPECT_TRUE(del->succeeded);
  auto gone = client_->range("lock/x", "", in_ms(kCallMs));
  ASSERT_TRUE(gone.ok()) << gone.message();
  EXPECT_TRUE(gone->kvs.empty());

  // The other targets and ops. An absent key compares as a key of zeroes (value: never).
  const std::vector<Compare> hold{
      Compare::of("lock/x", Compare::Target::version, Compare::Op::less, 1),
      Compare::of("lock/x", Compare::Target::mod_revision, Compare::Op::not_equal, 5),
      Compare::of("lock/x", Compare::Target::lease, Compare::Op::equal, 0)};
  auto held = client_->txn(hold, {Op::get("lock/x")}, {}, in_ms(kCallMs));
  ASSERT_TRUE(held.ok()) << held.message();
  EXPECT_TRUE(held->succeeded);
  ASSERT_EQ(held->ranges.size(), 1u);
  EXPECT_TRUE(held->ranges[0].kvs.empty());
  std::vector<Compare> one_fails = hold;
  one_fails.push_back(Compare::of("lock/x", Compare::Target::create_revision, Compare::Op::greater, 0));
  auto failed = client_->txn(one_fails, {Op::put("lock/x", "no")}, {}, in_ms(kCallMs));
  ASSERT_TRUE(failed.ok()) << failed.message();
  EXPECT_FALSE(failed->succeeded);
  EXPECT_TRUE(failed->ranges.empty());
}

TEST_F(EtcdClient, RequestsEtcdRefusesAsMalformedAreInvalidArgument) {
  const Status empty_key = client_->put("", "v", in_ms(kCallMs));
  EXPECT_EQ(empty_key.code(), Errc::invalid_argument) << empty_key.message();
  EXPECT_NE(empty_key.message().find("Put"), std::string::npos) << empty_key.message();
  EXPECT_NE(empty_key.message().find(cluster_->endpoints()), std::string::npos) << empty_key.message();

  // The same key twice in one branch.
  auto dup = client_->txn({}, {Op::put("d", "1"), Op::put("d", "2")}, {}, in_ms(kCallMs));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.code(), Errc::invalid_argument) << dup.message();
}

TEST_F(EtcdClient, LeaseKeysGoWithItsRevokeAndAKeepAliveOfARevokedLeaseIsNotFound) {
  auto grant = client_->lease_grant(5, in_ms(kCallMs));
  ASSERT_TRUE(grant.ok()) << grant.message();
  EXPECT_NE(grant->id, 0);
  EXPECT_EQ(grant->ttl_s, 5);
  put("owned/a", "1", grant->id);
  auto txn = client_->txn({}, {Op::put("owned/b", "2", grant->id)}, {}, in_ms(kCallMs));
  ASSERT_TRUE(txn.ok()) << txn.message();
  put("kept", "3");

  auto owned = client_->range("owned/", prefix_end("owned/"), in_ms(kCallMs));
  ASSERT_TRUE(owned.ok()) << owned.message();
  ASSERT_EQ(owned->kvs.size(), 2u);
  EXPECT_EQ(owned->kvs[0].lease, grant->id);
  EXPECT_EQ(owned->kvs[1].lease, grant->id);

  auto ka = client_->keep_alive(in_ms(kCallMs));
  ASSERT_TRUE(ka.ok()) << ka.message();
  for (int i = 0; i < 3; ++i) {
    auto ttl = (*ka)->refresh(grant->id, in_ms(kCallMs));
    ASSERT_TRUE(ttl.ok()) << ttl.message();
    EXPECT_GT(*ttl, 0);
    EXPECT_LE(*ttl, 5);
  }

  const Status revoked = client_->lease_revoke(grant->id, in_ms(kCallMs));
  ASSERT_TRUE(revoked.ok()) << revoked.message();
  auto after = client_->range("owned/", prefix_end("owned/"), in_ms(kCallMs));
  ASSERT_TRUE(after.ok()) << after.message();
  EXPECT_TRUE(after->kvs.empty());
  auto kept = client_->range("kept", "", in_ms(kCallMs));
  ASSERT_TRUE(kept.ok()) << kept.message();
  EXPECT_EQ(kept->kvs.size(), 1u);

  auto dead = (*ka)->refresh(grant->id, in_ms(kCallMs));
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.code(), Errc::not_found) << dead.message();

  // The stream is still good for a live lease.
  auto other = client_->lease_grant(5, in_ms(kCallMs));
  ASSERT_TRUE(other.ok()) << other.message();
  auto ttl = (*ka)->refresh(other->id, in_ms(kCallMs));
  ASSERT_TRUE(ttl.ok()) << ttl.message();
  EXPECT_GT(*ttl, 0);

  const Status again = client_->lease_revoke(grant->id, in_ms(kCallMs));
  EXPECT_EQ(again.code(), Errc::not_found) << again.message();
  const Status put_on_gone = client_->put("k", "v", in_ms(kCallMs), grant->id);
  EXPECT_EQ(put_on_gone.code(), Errc::not_found) << put_on_gone.message();
}

TEST_F(EtcdClient, AShortLeaseExpiresWithoutKeepAlive) {
  auto grant = client_->lease_grant(1, in_ms(kCallMs));
  ASSERT_TRUE(grant.ok()) << grant.message();
  EXPECT_GE(grant->ttl_s, 1);
  put("short", "lived", grant->id);
  // Expired within its TTL and a leader's revoke round (etcd checks every 500 ms).
  const bool expired = harness::eventually(
      [&] {
        auto r = client_->range("short", "", in_ms(kCallMs));
        return r.ok() && r->kvs.empty();
      },
      std::chrono::milliseconds(grant->ttl_s * 1000 + 5'000), std::chrono::milliseconds(50));
  EXPECT_TRUE(expired);
  auto ka = client_->keep_alive(in_ms(kCallMs));
  ASSERT_TRUE(ka.ok()) << ka.message();
  auto ttl = (*ka)->refresh(grant->id, in_ms(kCallMs));
  EXPECT_EQ(ttl.code(), Errc::not_found) << (ttl.ok() ? "ttl " + std::to_string(*ttl) : ttl.message());
}

TEST_F(EtcdClient, ACallToAStoppedMemberEndsByItsDeadline) {
  put("before", "stop");  // connected
  auto grant = client_->lease_grant(30, in_ms(kCallMs));
  ASSERT_TRUE(grant.ok()) << grant.message();
  auto ka = client_->keep_alive(in_ms(kCallMs));
  ASSERT_TRUE(ka.ok()) << ka.message();
  ASSERT_TRUE((*ka)->refresh(grant->id, in_ms(kCallMs)).ok());

  ASSERT_TRUE(cluster_->stop(0).ok());
  constexpr std::int64_t kDeadlineMs = 300;
  // Only an upper bound (10x the deadline): how early a call may return is not the point.
  auto within = [&](auto&& call, const char* what) {
    const std::int64_t t0 = boottime_ns();
    const Status st = call(in_ms(kDeadlineMs));
    const std::int64_t took_ms = (boottime_ns() - t0) / kMs;
    EXPECT_TRUE(st.code() == Errc::timeout || st.code() == Errc::io_error) << what << ": " << st.message();
    EXPECT_LT(took_ms, 10 * kDeadlineMs) << what << " returned after " << took_ms << " ms";
  };
  within([&](std::int64_t d) { return client_->range("before", "", d).status(); }, "range");
  within([&](std::int64_t d) { return client_->put("k", "v", d); }, "put");
  within([&](std::int64_t d) { return client_->txn({}, {Op::get("k")}, {}, d).status(); }, "txn");
  within([&](std::int64_t d) { return client_->lease_grant(5, d).status(); }, "lease_grant");
  within([&](std::int64_t d) { return client_->status(d).status(); }, "status");
  within([&](std::int64_t d) { return (*ka)->refresh(grant->id, d).status(); }, "keep-alive refresh");
  // The stream is broken after that; a deadline already passed is a timeout at once.
  EXPECT_FALSE((*ka)->refresh(grant->id, in_ms(kCallMs)).ok());
  EXPECT_EQ(client_->range("before", "", boottime_ns() - 1).code(), Errc::timeout);

  ASSERT_TRUE(cluster_->cont(0).ok());
  auto back = client_->range("before", "", in_ms(kCallMs));
  ASSERT_TRUE(back.ok()) << back.message();
  ASSERT_EQ(back->kvs.size(), 1u);
  auto ka2 = client_->keep_alive(in_ms(kCallMs));
  ASSERT_TRUE(ka2.ok()) << ka2.message();
  auto ttl = (*ka2)->refresh(grant->id, in_ms(kCallMs));
  EXPECT_TRUE(ttl.ok()) << ttl.message();
}

TEST_F(EtcdClient, StatusNamesTheMemberAndItsLeader) {
  auto st = client_->status(in_ms(kCallMs));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_NE(st->member_id, 0u);
  EXPECT_EQ(st->leader_id, st->member_id);  // one member leads itself
  EXPECT_GT(st->raft_term, 0u);
  EXPECT_GT(st->revision, 0);
  EXPECT_EQ(st->version.rfind("3.", 0), 0u) << st->version;
}

TEST(EtcdClientOpen, MalformedEndpointsAreInvalidArgumentNamingTheEndpoint) {
  for (const char* text : {"", "localhost", "localhost:", "localhost:0", "localhost:65536", "localhost:12x",
                           ":2379", "::1:2379", "[::1", "[::1]2379", "[]:2379", "127.0.0.1:2379,,127.0.0.1:2380",
                           "127.0.0.1:2379,"}) {
    auto c = Client::open(text);
    ASSERT_FALSE(c.ok()) << "\"" << text << "\" was accepted";
    EXPECT_EQ(c.code(), Errc::invalid_argument) << text << ": " << c.message();
    EXPECT_NE(c.message().find(std::string("\"") + text + "\""), std::string::npos) << c.message();
  }
  std::string seventeen;
  for (int i = 0; i < 17; ++i) seventeen += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(2000 + i);
  auto many = Client::open(seventeen);
  EXPECT_EQ(many.code(), Errc::invalid_argument) << many.message();
  EXPECT_NE(many.message().find("16"), std::string::npos) << many.message();
}

TEST(EtcdClientOpen, AHostThatDoesNotResolveIsNotFoundNamingIt) {
  auto c = Client::open("127.0.0.1:2379,no-such-host.invalid:2379");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.code(), Errc::not_found) << c.message();
  EXPECT_NE(c.message().find("\"no-such-host.invalid\""), std::string::npos) << c.message();
}

TEST(EtcdClientOpen, NamesAndLiteralsOfEitherFamilyOpenWithoutConnecting) {
  for (const char* text : {"127.0.0.1:1", "localhost:1", "[::1]:1", "[::1]:1,[::1]:2", "127.0.0.1:1,127.0.0.1:2"}) {
    auto c = Client::open(text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.message();
    EXPECT_EQ((*c)->endpoints(), text);
  }
  // Nothing listens on port 1: the first call says so (io_error), in time.
  auto c = Client::open("127.0.0.1:1");
  ASSERT_TRUE(c.ok()) << c.message();
  auto r = (*c)->range("k", "", in_ms(500));
  EXPECT_TRUE(r.code() == Errc::io_error || r.code() == Errc::timeout) << r.message();
  auto mixed = Client::open("127.0.0.1:1,[::1]:2");
  EXPECT_EQ(mixed.code(), Errc::invalid_argument) << mixed.message();
}

TEST(PrefixEnd, IncrementsTheLastByteThatCanBeAndDropsTheRest) {
  EXPECT_EQ(prefix_end("a"), "b");
  EXPECT_EQ(prefix_end("app/"), "app0");
  EXPECT_EQ(prefix_end("ab"), "ac");
  EXPECT_EQ(prefix_end(std::string("a\xfe", 2)), std::string("a\xff", 2));
  EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
  EXPECT_EQ(prefix_end(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(prefix_end(std::string("\x01\xff", 2)), "\x02");
  EXPECT_EQ(prefix_end(std::string("a\0", 2)), std::string("a\x01", 2));
  EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(std::string("\xff", 1)), std::string(1, '\0'));
  EXPECT_EQ(prefix_end(std::string("\xff\xff\xff", 3)), std::string(1, '\0'));
}

TEST(OpBuilders, FillTheirFields) {
  const Op p = Op::put("k", "v", 7);
  EXPECT_EQ(p.kind, Op::Kind::put);
  EXPECT_EQ(p.key, "k");
  EXPECT_EQ(p.value, "v");
  EXPECT_EQ(p.lease, 7);
  const Op d = Op::del("a", "b");
  EXPECT_EQ(d.kind, Op::Kind::del);
  EXPECT_EQ(d.key, "a");
  EXPECT_EQ(d.range_end, "b");
  const Op g = Op::get("x");
  EXPECT_EQ(g.kind, Op::Kind::range);
  EXPECT_EQ(g.key, "x");
  EXPECT_TRUE(g.range_end.empty());
}

}  // namespace
}  // namespace leasehold::etcd
