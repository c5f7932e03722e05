// LockService as a core: driven through a fake DatagramPort (a vector of sent datagrams) and a
// fake DurabilityPort (verdicts on demand), with no socket, thread, file or clock.
#include "service_core_fakes.hpp"

#include <gtest/gtest.h>

#include <set>

namespace leasehold::lockd {
namespace {

using test::CoreRig;
using test::sandbox;

constexpr std::int64_t kT0 = 1'000'000'000'000;  // an arbitrary boot-clock start

TEST(ServiceCore, GrantGoesOutOnlyAfterItsChangeIsDurable) {
  CoreRig rig(kT0);
  const SandboxId sb = sandbox(1);
  rig.deliver(rig.acquire("jobs/a", sb), kT0);
  EXPECT_TRUE(rig.net.sent.empty());  // the grant depends on a change not yet durable
  rig.service->tick(kT0);
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  ASSERT_EQ(rig.disk.submitted[0].changes.size(), 1u);
  EXPECT_EQ(rig.disk.submitted[0].changes[0].name, "jobs/a");
  EXPECT_EQ(rig.disk.submitted[0].changes[0].state, LockPhase::held);
  EXPECT_EQ(rig.disk.submitted[0].changes[0].epoch, 1u);
  EXPECT_TRUE(rig.net.sent.empty());  // submitted is not durable
  rig.service->tick(kT0 + 1'000'000);
  EXPECT_TRUE(rig.net.sent.empty());  // still no verdict

  rig.disk.verdict(0, DurabilityVerdict::Kind::durable);
  rig.service->tick(kT0 + 2'000'000);
  ASSERT_EQ(rig.net.sent.size(), 1u);
  EXPECT_EQ(rig.net.sent[0].to, rig.worker_address);
  const wire::Body answer = rig.decode(rig.net.sent[0].bytes);
  ASSERT_TRUE(std::holds_alternative<wire::Grant>(answer));
  const auto& g = std::get<wire::Grant>(answer);
  EXPECT_EQ(g.epoch, 1u);
  EXPECT_EQ(g.holder, sb);
  EXPECT_EQ(g.worker, rig.worker);
  EXPECT_EQ(rig.service->durable_seq(), rig.disk.submitted[0].last_seq);
}

TEST(ServiceCore, AnswerWithheldWhileAnEarlierChangeIsNotDurable) {
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(2)), kT0);
  rig.service->tick(kT0);
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  // A second acquire while the first batch is in flight: its change goes into the next batch,
  // and neither answer goes out before its own batch is durable.
  rig.deliver(rig.acquire("jobs/b", sandbox(3)), kT0 + 100);
  rig.service->tick(kT0 + 100);
  ASSERT_EQ(rig.disk.submitted.size(), 2u);
  EXPECT_GT(rig.disk.submitted[1].first_seq, rig.disk.submitted[0].last_seq);
  rig.disk.verdict(0, DurabilityVerdict::Kind::durable);
  rig.service->tick(kT0 + 200);
  ASSERT_EQ(rig.net.sent.size(), 1u);  // only the first grant
  EXPECT_EQ(std::get<wire::Grant>(rig.decode(rig.net.sent[0].bytes)).name_id, name_id_of("jobs/a"));
  rig.disk.verdict(1, DurabilityVerdict::Kind::durable);
  rig.service->tick(kT0 + 300);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  EXPECT_EQ(std::get<wire::Grant>(rig.decode(rig.net.sent[1].bytes)).name_id, name_id_of("jobs/b"));
}

TEST(ServiceCore, FailedVerdictStopsTheServiceWithNoAnswerSent) {
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(4)), kT0);
  rig.service->tick(kT0);
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  rig.disk.verdict(0, DurabilityVerdict::Kind::failed, "store x.db: disk I/O error");
  EXPECT_EQ(rig.service->tick(kT0 + 10), kT0 + 10);
  EXPECT_TRUE(rig.service->failed());
  EXPECT_EQ(rig.service->failure(), "store x.db: disk I/O error");
  EXPECT_TRUE(rig.net.sent.empty());
  EXPECT_EQ(rig.service->durable_seq(), 0u);
  // Nothing is served any more: a new request is not answered, nothing more is submitted.
  rig.deliver(rig.acquire("jobs/b", sandbox(5)), kT0 + 20);
  rig.service->tick(kT0 + 20);
  EXPECT_TRUE(rig.net.sent.empty());
  EXPECT_EQ(rig.disk.submitted.size(), 1u);
}

TEST(ServiceCore, RejectedVerdictIsTreatedAsFailed) {
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(6)), kT0);
  rig.service->tick(kT0);
  rig.disk.verdict(0, DurabilityVerdict::Kind::rejected, "leader revision 7 moved to 9");
  rig.service->tick(kT0 + 10);
  EXPECT_TRUE(rig.service->failed());
  EXPECT_NE(rig.service->failure().find("rejected"), std::string::npos) << rig.service->failure();
  EXPECT_NE(rig.service->failure().find("leader revision 7 moved to 9"), std::string::npos);
  EXPECT_TRUE(rig.net.sent.empty());
}

TEST(ServiceCore, ExpiryHappensAtTheTickItAskedForAfterTheDeadline) {
  CoreRig rig(kT0);
  const SandboxId sb = sandbox(7);
  rig.deliver(rig.acquire("jobs/a", sb, 500), kT0);  // a 500 ms lease
  rig.service->tick(kT0);
  rig.disk.verdict(0, DurabilityVerdict::Kind::durable);
  const std::int64_t next = rig.service->tick(kT0 + 1);
  EXPECT_EQ(rig.service->table().held(), 1u);
  // The tick asks to be called again no later than the lease's expiry (kT0 + 500 ms).
  EXPECT_LE(next, kT0 + 500'000'000);
  // A jump to just before the expiry changes nothing; just after, the lease is expired and the
  // expiry is an ownership change in the next batch.
  const std::int64_t at = rig.service->tick(kT0 + 499'000'000);
  EXPECT_EQ(rig.service->table().held(), 1u);
  // Expiry runs at most once per kTickNs: the tick asked for is the first one past the deadline.
  EXPECT_GE(at, kT0 + 500'000'000);
  EXPECT_LE(at, kT0 + 499'000'000 + kTickNs);
  const std::size_t batches = rig.disk.submitted.size();
  rig.service->tick(at);
  EXPECT_EQ(rig.service->table().held(), 0u);
  EXPECT_EQ(rig.service->counters().expiries, 1u);
  ASSERT_GT(rig.disk.submitted.size(), batches);
  const DurableBatch& b = rig.disk.submitted.back();
  ASSERT_EQ(b.changes.size(), 1u);
  EXPECT_EQ(b.changes[0].state, LockPhase::free);
  EXPECT_EQ(b.changes[0].epoch, 1u);
}

TEST(ServiceCore, TickReturnsTheNextDeadlineSoASimulatorCanJump) {
  CoreRig rig(kT0);
  rig.service->tick(kT0);
  // Nothing held, nothing pending: the next tick wanted is the stats gauge's window (1 s), not
  // the 2 ms housekeeping cadence.
  const std::int64_t next = rig.service->tick(kT0 + kTickNs);
  EXPECT_EQ(next, kT0 + kNsPerS);
}

TEST(ServiceCore, TokensCarryTheInjectedWallClockNotTheHosts) {
  ServiceSeeds seeds{WorkerId{0x10cd, 1}, 1, [] { return std::int64_t{1'234'567'890'123}; }};
  CoreRig rig(kT0, {}, 1, {}, seeds);
  std::shared_ptr<const token::TokenSigner> signer = token::TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  rig.service->set_token_signer(signer);
  rig.deliver(rig.acquire("jobs/a", sandbox(30)), kT0);
  rig.settle(kT0);
  ASSERT_EQ(rig.net.sent.size(), 1u);
  const auto g = std::get<wire::Grant>(rig.decode(rig.net.sent[0].bytes));
  const auto t = token::decode(std::span<const std::uint8_t>(g.token.data(), g.token.size()));
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->issued_at_ns, 1'234'567'890'123);
  EXPECT_EQ(t->epoch, g.epoch);
}

// A grant's token is signed once the turn's batch is with the store (while it commits), not
// when the grant is decided; the answer that goes out after the commit carries it signed, and a
// grant whose batch never commits is never signed.
TEST(ServiceCore, GrantTokensAreSignedAfterTheBatchIsSubmitted) {
  CoreRig rig(kT0);
  std::shared_ptr<const token::TokenSigner> signer = token::TokenSigner::generate().value();
  ASSERT_NE(signer, nullptr);
  rig.service->set_token_signer(signer);
  token::TokenVerifier verifier;
  ASSERT_EQ(verifier.add_public_key(signer->public_key()).message(), "");
  const SandboxId sb = sandbox(40);
  rig.deliver(rig.acquire("jobs/signed", sb), kT0);
  EXPECT_EQ(rig.service->counters().tokens_signed, 0u);  // decided, batch not submitted yet
  EXPECT_TRUE(rig.disk.submitted.empty());
  rig.service->tick(kT0);
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  EXPECT_EQ(rig.service->counters().tokens_signed, 1u);  // signed while the batch commits
  EXPECT_TRUE(rig.net.sent.empty());
  rig.disk.verdict(0, DurabilityVerdict::Kind::durable);
  rig.service->tick(kT0 + 1'000);
  ASSERT_EQ(rig.net.sent.size(), 1u);
  EXPECT_EQ(rig.service->counters().tokens_signed, 1u);  // not signed a second time
  const auto g = std::get<wire::Grant>(rig.decode(rig.net.sent[0].bytes));
  const std::span<const std::uint8_t> bytes(g.token.data(), g.token.size());
  EXPECT_TRUE(verifier.verify(bytes, g.name_id, g.epoch, sb).ok());
  EXPECT_FALSE(verifier.verify(bytes, g.name_id, g.epoch + 1, sb).ok());

  // Acquired again by its holder once durable: answered at once, signed on its way out.
  rig.deliver(rig.acquire("jobs/signed", sb), kT0 + 2'000);
  rig.service->tick(kT0 + 2'000);
  rig.settle(kT0 + 3'000);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  const auto again = std::get<wire::Grant>(rig.decode(rig.net.sent[1].bytes));
  EXPECT_EQ(again.epoch, g.epoch);
  EXPECT_TRUE(verifier.verify(std::span<const std::uint8_t>(again.token.data(), again.token.size()),
                              again.name_id, again.epoch, sb)
                  .ok());
  EXPECT_EQ(rig.service->counters().token_sign_failures, 0u);
}

TEST(ServiceCore, RestartFromARestoredTableKeepsTheGrantAndItsEpoch) {
  // Incarnation 1 grants jobs/a; its durable batch is what incarnation 2 restores from.
  StoredTable stored;
  SandboxId sb = sandbox(8);
  {
    CoreRig rig(kT0);
    sb = sandbox(9);
    rig.deliver(rig.acquire("jobs/a", sb), kT0);
    rig.service->tick(kT0);
    rig.disk.verdict(0, DurabilityVerdict::Kind::durable);
    rig.service->tick(kT0 + 1);
    ASSERT_EQ(rig.net.sent.size(), 1u);
    stored = rig.disk.apply_durable();  // what a store would load
  }
  ASSERT_EQ(stored.names.size(), 1u);
  ASSERT_EQ(stored.seen.size(), 1u);
  CoreRig rig2(kT0 + kNsPerS, stored, 2);
  rig2.client.advance_to(1'000);  // the same worker's supervisor: its seqs go on above the floor
  const LockState s = rig2.service->table().state(name_id_of("jobs/a"));
  ASSERT_TRUE(s.known);
  EXPECT_EQ(s.phase, LockPhase::held);
  EXPECT_EQ(s.owner, sb);
  EXPECT_EQ(s.epoch, 1u);
  EXPECT_EQ(rig2.service->incarnation(), 2u);
  // Another sandbox is refused (held), and the holder's next grant epoch stays above 1.
  rig2.deliver(rig2.acquire("jobs/a", sandbox(10)), kT0 + kNsPerS);
  rig2.service->tick(kT0 + kNsPerS);
  ASSERT_EQ(rig2.net.sent.size(), 1u);
  const wire::Body answer = rig2.decode(rig2.net.sent[0].bytes);
  ASSERT_TRUE(std::holds_alternative<wire::Deny>(answer));
  EXPECT_EQ(std::get<wire::Deny>(answer).refusal, Refusal::held);
  EXPECT_EQ(std::get<wire::Deny>(answer).epoch, 1u);
  EXPECT_EQ(std::get<wire::Deny>(answer).holder, sb);
}

// A heartbeat captured on the wire and replayed to the next incarnation (a restart, a new
// leader on etcd): its replay window there starts at the floor the one before recorded with
// the worker's seen mark, so the copy refreshes nothing (without the floor it refreshed the
// lease once more at every new leader, and moved the worker's seen mark each time).
TEST(ServiceCore, AHeartbeatReplayedToTheNextIncarnationRefreshesNothing) {
  StoredTable stored;
  const SandboxId sb = sandbox(11);
  std::vector<std::uint8_t> captured, later;
  std::unique_ptr<CoreRig> first = std::make_unique<CoreRig>(kT0);
  CoreRig& rig = *first;
  rig.deliver(rig.acquire("jobs/r", sb), kT0);
  wire::Heartbeat hb;
  hb.entries.push_back(wire::HeartbeatEntry{name_id_of("jobs/r"), sb, 1});
  captured = rig.seal(hb);
  rig.deliver(captured, kT0 + 1);
  rig.settle(kT0 + 2);
  ASSERT_EQ(rig.service->counters().refresh_refreshed, 1u);
  stored = rig.disk.apply_durable();
  ASSERT_EQ(stored.replay_floor.count(rig.worker), 1u);
  EXPECT_EQ(stored.replay_floor.at(rig.worker), rig.client.next_seq() - 1);  // the heartbeat's seq
  later = rig.seal(hb);  // the supervisor's next heartbeat, sent after the takeover

  CoreRig rig2(kT0 + kNsPerS, stored, 2);
  rig2.deliver(captured, kT0 + kNsPerS);
  rig2.settle(kT0 + kNsPerS + 1);
  EXPECT_EQ(rig2.service->counters().refresh_refreshed, 0u);
  for (const auto& sent : rig2.net.sent) EXPECT_FALSE(std::holds_alternative<wire::HeartbeatAck>(rig2.decode(sent.bytes)));
  // The supervisor itself continues above the floor: refreshed.
  rig2.deliver(later, kT0 + kNsPerS + 2);
  rig2.settle(kT0 + kNsPerS + 3);
  EXPECT_EQ(rig2.service->counters().refresh_refreshed, 1u);
}

// Every lease a takeover (or restart) restores counts as refreshed at one instant; spread, they
// do not all fall due together - and none falls due before the restart rule's expiry.
TEST(ServiceCore, RestoredExpiriesAreSpreadAndNeverShortened) {
  StoredTable stored;
  const WorkerId w{0x77, 1};
  for (int i = 0; i < 64; ++i) {
    StoredName n;
    n.name = "spread/" + std::to_string(i);
    n.id = name_id_of(n.name);
    n.state = LockPhase::held;
    n.epoch = 1;
    n.owner = sandbox(100 + i);
    n.worker = w;
    stored.names.push_back(n);
  }
  LockdConfig cfg;
  cfg.ttl_ms = 8'000;
  const std::int64_t ttl = 8'000 * 1'000'000LL;
  CoreRig rig(kT0, stored, 2, cfg);
  std::set<std::int64_t> expiries;
  for (const StoredName& n : stored.names) {
    const LockState s = rig.service->table().state(n.id);
    ASSERT_EQ(s.phase, LockPhase::held);
    EXPECT_GE(s.expiry_ns, kT0 + ttl);               // the rule's expiry (a full TTL: no marks)
    EXPECT_LT(s.expiry_ns, kT0 + ttl + ttl / 8);     // at most an eighth of a TTL later
    EXPECT_EQ(s.expiry_ns, kT0 + ttl + restored_expiry_spread_ns(n.id, ttl));  // by the name alone
    expiries.insert(s.expiry_ns);
  }
  EXPECT_GE(expiries.size(), 60u);  // 64 names, 4096 steps: spread, not one instant
  EXPECT_EQ(restored_expiry_spread_ns(name_id_of("x"), 0), 0);
}

// The lived marks a restart needs are those above the oldest seen mark of a worker holding a
// lease; the first batch of the next incarnation deletes the others (they grew by one per
// restart or takeover for ever), and the restored leases are what they were with them.
TEST(ServiceCore, LivedMarksNoRestartNeedsArePrunedWithTheFirstBatch) {
  const WorkerId w1{0x77, 1}, w2{0x77, 2};
  StoredTable stored;
  StoredName held;
  held.name = "prune/held";
  held.id = name_id_of(held.name);
  held.state = LockPhase::held;
  held.epoch = 1;
  held.owner = sandbox(50);
  held.worker = w1;
  StoredName freed = held;
  freed.name = "prune/free";
  freed.id = name_id_of(freed.name);
  freed.state = LockPhase::free;
  freed.owner = {};
  freed.worker = w2;
  stored.names = {held, freed};
  stored.epoch_high_water = 1;
  stored.lived_ns = {{1, 100'000'000}, {2, 200'000'000}, {3, 300'000'000}, {5, 50'000'000}};
  stored.seen = {{w1, 3}, {w2, 1}};  // w2 holds nothing: its old mark keeps nothing alive
  const std::int64_t ttl = 10'000 * 1'000'000LL;
  CoreRig rig(kT0, stored, 6);
  // The rule as before: w1's lease less lived/5, the only incarnation after its mark.
  const LockState s = rig.service->table().state(held.id);
  EXPECT_EQ(s.expiry_ns, kT0 + ttl - 50'000'000 + restored_expiry_spread_ns(held.id, ttl));
  rig.settle(kT0 + 1);  // the lived checkpoint (a lease is held): the first batch
  ASSERT_FALSE(rig.disk.submitted.empty());
  EXPECT_EQ(rig.disk.submitted[0].marks.drop_lived, (std::vector<std::uint64_t>{1, 2, 3}));
  const StoredTable after = rig.disk.apply_durable();
  stored.lived_ns = {{5, 50'000'000}};
  for (const auto& [j, v] : after.lived_ns) stored.lived_ns[j] = v;
  // The next incarnation restores the same lease from the pruned marks (plus what 6 lived).
  CoreRig rig2(kT0 + 2, stored, 7);
  EXPECT_EQ(rig2.service->table().state(held.id).expiry_ns,
            kT0 + 2 + ttl - 50'000'000 - stored.lived_ns.at(6) + restored_expiry_spread_ns(held.id, ttl));
  // Nobody holds anything: every earlier mark goes.
  StoredTable idle;
  idle.lived_ns = {{1, 1}, {4, 1}};
  CoreRig rig3(kT0, idle, 9);
  rig3.deliver(rig3.acquire("prune/x", sandbox(51)), kT0);
  rig3.settle(kT0 + 1);
  ASSERT_FALSE(rig3.disk.submitted.empty());
  EXPECT_EQ(rig3.disk.submitted[0].marks.drop_lived, (std::vector<std::uint64_t>{1, 4}));
}

// An orderly stop records each acknowledged worker's floor as it is then: a heartbeat sent after
// the worker's first acknowledgement (above the floor its first mark carried) is refused by the
// next incarnation too.
TEST(ServiceCore, AnOrderlyStopRecordsTheFloorOfEveryWorkerSeen) {
  const SandboxId sb = sandbox(12);
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/d", sb), kT0);
  rig.settle(kT0 + 1);  // the grant's batch: the first mark, floor = the acquire's seq
  wire::Heartbeat hb;
  hb.entries.push_back(wire::HeartbeatEntry{name_id_of("jobs/d"), sb, 1});
  const std::vector<std::uint8_t> captured = rig.seal(hb);
  rig.deliver(captured, kT0 + 2);
  rig.settle(kT0 + 3);
  ASSERT_EQ(rig.service->counters().refresh_refreshed, 1u);
  ASSERT_LT(rig.disk.apply_durable().replay_floor.at(rig.worker), rig.client.next_seq() - 1);
  rig.service->begin_drain();
  rig.settle(kT0 + 4);
  ASSERT_TRUE(rig.service->drained());
  const StoredTable stored = rig.disk.apply_durable();
  EXPECT_EQ(stored.replay_floor.at(rig.worker), rig.client.next_seq() - 1);  // the heartbeat's
  EXPECT_EQ(stored.seen.at(rig.worker), 1u);

  CoreRig rig2(kT0 + kNsPerS, stored, 2);
  rig2.deliver(captured, kT0 + kNsPerS);
  rig2.settle(kT0 + kNsPerS + 1);
  EXPECT_EQ(rig2.service->counters().refresh_refreshed, 0u);
}

// The service's end of "now is monotone": a clock reading earlier than the last one served,
// in a datagram or a tick, aborts (the table would otherwise order deadlines by it).
TEST(ServiceCore, ANameOfAnotherShardIsAnsweredWithThatShardsLeaderAndChangesNothing) {
  LockdConfig c;
  c.shard = 0;
  c.shards = 2;
  CoreRig rig(kT0, {}, 1, c);
  rig.service->set_shard_leaders({"127.0.0.1:7400", "127.0.0.1:7401"}, "127.0.0.1:7400");
  // "agent-1" is in shard 1 of 2, "db/primary" in shard 0 (tests/lease/shard_test.cpp).
  rig.deliver(rig.acquire("agent-1", sandbox(1)), kT0);
  rig.settle(kT0);
  EXPECT_TRUE(rig.disk.submitted.empty());
  ASSERT_EQ(rig.net.sent.size(), 1u);
  EXPECT_EQ(std::get<wire::Error>(rig.decode(rig.net.sent[0].bytes)),
            (wire::Error{wire::ErrorCode::not_leader, "127.0.0.1:7401", 0}));
  rig.deliver(rig.acquire("db/primary", sandbox(2)), kT0 + 10);
  rig.settle(kT0 + 10);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  const auto grant = std::get<wire::Grant>(rig.decode(rig.net.sent[1].bytes));
  EXPECT_EQ(grant.name_id, name_id_of("db/primary"));

  // A heartbeat of shard 1 goes to shard 1's leader; one of both shards is refused whole.
  wire::Heartbeat other;
  other.entries.push_back({name_id_of("agent-1"), sandbox(1), 1});
  rig.deliver(rig.seal(other), kT0 + 20);
  ASSERT_EQ(rig.net.sent.size(), 3u);
  EXPECT_EQ(std::get<wire::Error>(rig.decode(rig.net.sent[2].bytes)).message, "127.0.0.1:7401");
  wire::Heartbeat mixed;
  mixed.entries.push_back({name_id_of("db/primary"), sandbox(2), grant.epoch});
  mixed.entries.push_back({name_id_of("agent-1"), sandbox(1), 1});
  rig.deliver(rig.seal(mixed), kT0 + 30);
  ASSERT_EQ(rig.net.sent.size(), 4u);
  EXPECT_EQ(std::get<wire::Error>(rig.decode(rig.net.sent[3].bytes)),
            (wire::Error{wire::ErrorCode::unsupported,
                         "a heartbeat of names of shards 0 and 1 (of 2): send one heartbeat per shard, each to its "
                         "shard's leader",
                         0}));
  wire::Heartbeat mine;
  mine.entries.push_back({name_id_of("db/primary"), sandbox(2), grant.epoch});
  rig.deliver(rig.seal(mine), kT0 + 40);
  ASSERT_EQ(rig.net.sent.size(), 5u);
  EXPECT_EQ(std::get<wire::HeartbeatAck>(rig.decode(rig.net.sent[4].bytes)).entries.at(0).status,
            RefreshStatus::refreshed);

  // Never itself as the hint (a stale election key naming this process): no hint at all.
  rig.service->set_shard_leaders({"127.0.0.1:7400", "127.0.0.1:7400"}, "127.0.0.1:7400");
  rig.deliver(rig.acquire("agent-1", sandbox(1)), kT0 + 50);
  ASSERT_EQ(rig.net.sent.size(), 6u);
  EXPECT_EQ(std::get<wire::Error>(rig.decode(rig.net.sent[5].bytes)), (wire::Error{wire::ErrorCode::not_leader, "", 0}));
  EXPECT_EQ(rig.disk.submitted.size(), 1u);  // the one grant of its own shard
}

TEST(ServiceCoreDeathTest, AClockThatGoesBackwardsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(1)), kT0 + 10);
  rig.service->tick(kT0 + 10);  // the same instant again is fine
  EXPECT_DEATH(rig.deliver(rig.acquire("jobs/b", sandbox(2)), kT0 + 9), "LEASEHOLD_ASSERT\\(now_ns >= now_ns_\\) failed");
  EXPECT_DEATH(rig.service->tick(kT0 + 9), "LEASEHOLD_ASSERT\\(now_ns >= now_ns_\\) failed");
  rig.settle(kT0 + 11);
  EXPECT_EQ(rig.net.sent.size(), 1u);
}

// The service's end of "answered only once durable": a verdict for a change it never handed to
// the store aborts rather than releasing answers no disk holds.
TEST(ServiceCoreDeathTest, AVerdictForAChangeNeverSubmittedAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(1)), kT0);
  rig.service->tick(kT0);
  ASSERT_EQ(rig.disk.submitted.size(), 1u);
  const std::uint64_t last = rig.disk.submitted[0].last_seq;
  rig.disk.ready.push_back(DurabilityVerdict{last + 1, DurabilityVerdict::Kind::durable, {}});
  EXPECT_DEATH(rig.service->tick(kT0 + 1), "LEASEHOLD_ASSERT\\(v.seq != 0 && v.seq <= submitted_seq_\\) failed");
  rig.disk.ready.clear();
  rig.settle(kT0 + 2);
  EXPECT_EQ(rig.net.sent.size(), 1u) << "the real verdict still releases the grant";
}


/// Every counter of the Stats answer's pages (first = 0, then the count so far, to an empty page).
std::map<std::string, std::uint64_t> every_counter(const LockService& service) {
  std::map<std::string, std::uint64_t> out;
  std::uint16_t first = 0;
  for (;;) {
    const wire::StatsAnswer page = service.stats_answer(first);
    if (page.counters.empty()) return out;
    for (const wire::Counter& k : page.counters) EXPECT_TRUE(out.emplace(k.key, k.value).second) << k.key;
    first = static_cast<std::uint16_t>(first + page.counters.size());
  }
}

/// The lines of `log` that contain `what`.
std::vector<std::string> lines_with(const std::string& log, const std::string& what) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (from < log.size()) {
    const std::size_t nl = log.find('\n', from);
    const std::string line = log.substr(from, nl == std::string::npos ? std::string::npos : nl - from);
    if (line.find(what) != std::string::npos) out.push_back(line);
    if (nl == std::string::npos) break;
    from = nl + 1;
  }
  return out;
}

// A datagram under a wrong key is counted by reason and logged with where it came from and the
// key it claims, at most one line a second; the next line says how many went unlogged.
TEST(ServiceCore, AWrongKeyIsCountedAndLoggedAtMostOncePerInterval) {
  CoreRig rig(kT0);
  std::string log;
  rig.service->take_log(log);  // the start-up lines
  // The worker's id and key id, but a key derived from another cluster key: the tag fails.
  wire::Sender forger(rig.worker, 1, wire::derive_worker_key(wire::WireKey(std::vector<std::uint8_t>(32, 0x43)), rig.worker));
  auto forged = [&](std::uint64_t request_id) {
    wire::Datagram dg;
    EXPECT_TRUE(forger.seal(request_id, wire::Stats{}, dg));
    const auto v = dg.view();
    return std::vector<std::uint8_t>(v.begin(), v.end());
  };
  rig.deliver(forged(1), kT0);
  log.clear();
  rig.service->take_log(log);
  const std::string who = "from=127.0.0.1:40001 sender=" + rig.worker.str();
  EXPECT_EQ(lines_with(log, "event=datagram_rejected"),
            std::vector<std::string>{"ts_boot_ns=" + std::to_string(kT0) + " event=datagram_rejected reason=bad_tag " +
                                     who + " key_id=1 unlogged_since_last=0"});
  rig.deliver(forged(2), kT0 + 1'000'000);
  rig.deliver(forged(3), kT0 + 2'000'000);
  log.clear();
  rig.service->take_log(log);
  EXPECT_TRUE(lines_with(log, "event=datagram_rejected").empty()) << log;
  // A key id lockd does not have for this worker, a second later: logged, with the two before.
  wire::WireKey other_id = rig.worker_key;
  other_id.key_id = 9;
  wire::Sender stranger(rig.worker, 1, other_id);
  wire::Datagram dg;
  ASSERT_TRUE(stranger.seal(4, wire::Stats{}, dg));
  const auto v = dg.view();
  rig.deliver(std::vector<std::uint8_t>(v.begin(), v.end()), kT0 + LockService::kKeyRejectLogIntervalNs);
  log.clear();
  rig.service->take_log(log);
  EXPECT_EQ(lines_with(log, "event=datagram_rejected"),
            std::vector<std::string>{"ts_boot_ns=" + std::to_string(kT0 + LockService::kKeyRejectLogIntervalNs) +
                                     " event=datagram_rejected reason=unknown_key " + who +
                                     " key_id=9 unlogged_since_last=2"});
  // None is answered; the two that were logged got the key-rejected notice, to their source,
  // naming the request, the key id and the reason, and no larger than the datagram.
  ASSERT_EQ(rig.net.sent.size(), 2u);
  EXPECT_EQ(wire::decode_key_rejected(rig.net.sent[0].bytes),
            (wire::KeyRejected{1, 1, wire::KeyRejectReason::bad_mac}));
  EXPECT_EQ(wire::decode_key_rejected(rig.net.sent[1].bytes),
            (wire::KeyRejected{4, 9, wire::KeyRejectReason::unknown_key}));
  for (const auto& sent : rig.net.sent) {
    EXPECT_EQ(sent.to.str(), "127.0.0.1:40001");
    EXPECT_LE(sent.bytes.size(), v.size());
  }
  std::map<std::string, std::uint64_t> c = every_counter(*rig.service);
  EXPECT_EQ(c["reject_bad_tag"], 3u);
  EXPECT_EQ(c["reject_unknown_key"], 1u);
  EXPECT_EQ(c["key_rejected_notices"], 2u);
}

// A flood of datagrams under a wrong key gets the notice under the log's limiter: one per
// interval, whatever the count; an answer (not a request) under a wrong key gets none.
TEST(ServiceCore, KeyRejectedNoticesAreRateLimitedLikeTheLog) {
  CoreRig rig(kT0);
  wire::Sender forger(rig.worker, 1, wire::derive_worker_key(wire::WireKey(std::vector<std::uint8_t>(32, 0x43)), rig.worker));
  auto forged = [&](std::uint64_t request_id, const wire::Body& body) {
    wire::Datagram dg;
    EXPECT_TRUE(forger.seal(request_id, body, dg));
    const auto v = dg.view();
    return std::vector<std::uint8_t>(v.begin(), v.end());
  };
  constexpr int kFlood = 200;
  for (int i = 0; i < kFlood; ++i)
    rig.deliver(forged(100 + static_cast<std::uint64_t>(i), wire::Stats{}), kT0 + i * 1'000'000LL / kFlood);
  EXPECT_EQ(rig.net.sent.size(), 1u);
  // The next interval: one more (the first datagram of it).
  for (int i = 0; i < kFlood; ++i)
    rig.deliver(forged(1000 + static_cast<std::uint64_t>(i), wire::Stats{}),
                kT0 + LockService::kKeyRejectLogIntervalNs + i);
  ASSERT_EQ(rig.net.sent.size(), 2u);
  EXPECT_EQ(wire::decode_key_rejected(rig.net.sent[1].bytes)->request_id, 1000u);
  // An answer under a wrong key, in a later interval: logged, never answered.
  rig.deliver(forged(5000, wire::StatsAnswer{{{"x", 1}}}), kT0 + 3 * LockService::kKeyRejectLogIntervalNs);
  EXPECT_EQ(rig.net.sent.size(), 2u);
  std::map<std::string, std::uint64_t> c = every_counter(*rig.service);
  EXPECT_EQ(c["key_rejected_notices"], 2u);
  EXPECT_EQ(c["reject_bad_tag"], 2u * kFlood + 1);
}

// refreshes_per_s: the refreshes of the last 10 s per second, rounded up. Under 10 heartbeats a
// second it is 10; under one heartbeat every 3 s (a supervisor's cadence for one name) it is 1,
// not 0 (a one-second window truncated 1 refresh in 1.002 s to 0 and saw none in most seconds).
TEST(ServiceCore, TheRefreshRateFollowsTheHeartbeats) {
  CoreRig rig(kT0);
  const SandboxId sb = sandbox(12);
  rig.deliver(rig.acquire("jobs/rate", sb), kT0);
  rig.settle(kT0 + 1);
  wire::Heartbeat hb;
  hb.entries.push_back(wire::HeartbeatEntry{name_id_of("jobs/rate"), sb, 1});
  auto rate = [&] { return rig.service->counters().refreshes_per_s; };
  EXPECT_EQ(rate(), 0u);
  // Ten heartbeats a second for three seconds, the loop's ticks between them.
  std::int64_t now = kT0 + 2;
  for (int i = 0; i < 30; ++i) {
    now += 100'000'000;
    rig.deliver(rig.seal(hb), now);
    rig.settle(now + 1);
  }
  EXPECT_EQ(rig.service->counters().refresh_entries, 30u);
  EXPECT_EQ(rate(), 10u);
  // Then one every 3 s, ticks every 100 ms, for 30 s: the 10/s seconds leave the window.
  for (int i = 1; i <= 300; ++i) {
    now += 100'000'000;
    if (i % 30 == 0) rig.deliver(rig.seal(hb), now);
    rig.settle(now + 1);
  }
  EXPECT_EQ(rig.service->counters().refresh_entries, 40u);
  EXPECT_EQ(rate(), 1u);
}

// The Stats answer's pages hold every counter of the metric list (what /metrics exports), each
// once, in the list's order: more than one datagram holds.
TEST(ServiceCore, TheStatsPagesHoldEveryCounter) {
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(1)), kT0);
  rig.settle(kT0 + 1);
  std::vector<metrics::Sample> samples;
  rig.service->metric_samples(samples);
  std::vector<std::string> expected;
  for (const metrics::Sample& m : samples)
    if (!(m.sparse && m.value == 0))
      expected.push_back(std::string(m.name) + (m.reason.empty() ? "" : "_" + std::string(m.reason)));
  std::vector<std::string> paged;
  std::size_t pages = 0;
  for (std::uint16_t first = 0;;) {
    const wire::StatsAnswer page = rig.service->stats_answer(first);
    if (page.counters.empty()) break;
    ++pages;
    EXPECT_LE(wire::payload_bytes(page), wire::kPayloadBytesMax);
    for (const wire::Counter& c : page.counters) paged.push_back(c.key);
    first = static_cast<std::uint16_t>(first + page.counters.size());
  }
  EXPECT_EQ(paged, expected);
  EXPECT_GE(pages, 2u);
  EXPECT_LT(rig.service->stats_answer().counters.size(), expected.size());  // one datagram's worth
  EXPECT_EQ(paged.front(), "version_major");
}

// The Stats answer is the metric list: its keys are the list's in order (a reason as
// <name>_<reason>, only when not zero), as many as fit one datagram; nothing is named twice.
TEST(ServiceCore, TheStatsAnswerIsTheMetricListInOrder) {
  CoreRig rig(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(1)), kT0);
  rig.settle(kT0);
  rig.deliver(rig.acquire("jobs/a", sandbox(2)), kT0 + 10);  // refused: held
  rig.settle(kT0 + 10);
  std::vector<metrics::Sample> all;
  rig.service->metric_samples(all);
  std::set<std::string> seen;
  std::map<std::string, metrics::Kind> kinds;
  std::vector<std::pair<std::string, std::uint64_t>> expected;
  for (const metrics::Sample& m : all) {
    const std::string key = m.reason.empty() ? std::string(m.name) : std::string(m.name) + "_" + std::string(m.reason);
    EXPECT_TRUE(seen.insert(key).second) << key << " is listed twice";
    const auto [k, fresh] = kinds.try_emplace(std::string(m.name), m.kind);
    EXPECT_TRUE(fresh || k->second == m.kind) << m.name << " is both a counter and a gauge";
    EXPECT_FALSE(m.help.empty()) << m.name;
    if (!(m.sparse && m.value == 0)) expected.emplace_back(key, m.value);
  }
  EXPECT_EQ(kinds.at("grants"), metrics::Kind::counter);
  EXPECT_EQ(kinds.at("held"), metrics::Kind::gauge);
  const wire::StatsAnswer a = rig.service->stats_answer();
  ASSERT_GT(a.counters.size(), 40u);
  EXPECT_LE(wire::payload_bytes(a), wire::kPayloadBytesMax);
  std::size_t at = 0;  // every key of the answer, in the list's order (a key that did not fit is passed over)
  for (const wire::Counter& c : a.counters) {
    while (at < expected.size() && expected[at].first != c.key) ++at;
    ASSERT_LT(at, expected.size()) << c.key << " is not in the list, or out of its order";
    EXPECT_EQ(c.value, expected[at].second) << c.key;
  }
  std::map<std::string, std::uint64_t> c;
  for (const wire::Counter& k : a.counters) c[k.key] = k.value;
  EXPECT_EQ(c.at("grants"), 1u);
  EXPECT_EQ(c.at("held"), 1u);
  EXPECT_EQ(c.at("refusal_held"), 1u);
  EXPECT_EQ(c.count("refusal_lock_delay"), 0u);  // zero: left out of the datagram
  EXPECT_EQ(seen.count("refusal_lock_delay"), 1u);  // but in the list /metrics exports
}

}  // namespace
}  // namespace leasehold::lockd
