// One test per transition of DESIGN.md "Lock states" and one per refusal reason.
#include "leasehold/lease/lease_table.hpp"

#include "tests/lease/lease_test_util.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace leasehold {
namespace {

using namespace leasehold::testing;

constexpr std::int64_t kT0 = 1000 * kSecondNs;

class LeaseTableTest : public ::testing::Test {
 protected:
  LeaseTable table{small_config()};
  NameId id(std::string_view n) { return name_id_of(n); }
  std::vector<Expiry> advance_to(std::int64_t now_ns) {
    std::vector<Expiry> out;
    table.advance(now_ns, out);
    return out;
  }
};

// ---- transitions --------------------------------------------------------------------------

TEST_F(LeaseTableTest, AcquireFreeToHeldTakesEpochPlusOne) {
  const Outcome o = table.acquire("db", kA, kW1, kT0);
  ASSERT_TRUE(o.ok()) << to_string(o.refusal);
  EXPECT_EQ(o.name, id("db"));
  EXPECT_EQ(o.token, (Token{id("db"), 1, kA}));
  EXPECT_EQ(o.state.phase, LockPhase::held);
  EXPECT_EQ(o.state.owner, kA);
  EXPECT_EQ(o.state.worker, kW1);
  EXPECT_EQ(o.state.expiry_ns, kT0 + 10 * kSecondNs);
  EXPECT_EQ(table.held(), 1u);
  EXPECT_TRUE(table.may_mutate(id("db"), kA, 1, kT0));
  EXPECT_FALSE(table.may_mutate(id("db"), kB, 1, kT0));
}

// A sandbox id is no secret: the holder's grant again, a pending 2-phase acquire and a
// reservation are given only to the worker they are bound to; another worker naming the same
// sandbox is refused forbidden and nothing changes.
TEST_F(LeaseTableTest, GrantsAndReservationsAreBoundToTheirWorker) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const LockState held = table.state(id("db"));
  EXPECT_EQ(table.acquire("db", kA, kW2, kT0).refusal, Refusal::forbidden);
  EXPECT_EQ(table.state(id("db")), held);
  ASSERT_TRUE(table.acquire_2pc("pending", kB, kT0, kW1).ok());
  EXPECT_EQ(table.acquire_2pc("pending", kB, kT0, kW2).refusal, Refusal::forbidden);
  EXPECT_TRUE(table.acquire_2pc("pending", kB, kT0, kW1).ok());  // idempotent for its worker
  // Transfer to (C, W2): only W2 may take the reservation.
  const Outcome tb = table.begin_transfer(id("db"), kA, 1, kC, kT0, kW2);
  ASSERT_TRUE(tb.ok());
  EXPECT_EQ(tb.state.reserved_worker, kW2);
  ASSERT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0).ok());  // the transfer guard: A is dead
  const Outcome done = table.complete_release(id("db"), kA, 2, kT0);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done.state.reserved_for, kC);
  EXPECT_EQ(done.state.reserved_worker, kW2);
  EXPECT_EQ(table.acquire("db", kC, kW1, kT0).refusal, Refusal::forbidden);
  const Outcome taken = table.acquire("db", kC, kW2, kT0);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(taken.state.worker, kW2);
  EXPECT_EQ(taken.token.epoch, 2u);
  // Reassign to (A, W1).
  ASSERT_TRUE(table.release(id("db"), kC, 2, kT0).ok());
  ASSERT_TRUE(table.reassign("db", kA, kT0, kW1).ok());
  EXPECT_EQ(table.acquire("db", kA, kW2, kT0).refusal, Refusal::forbidden);
  EXPECT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  // Restored from the store: the worker is kept.
  LeaseTable fresh(LeaseConfig{});
  DurableSnapshot snap;
  DurableRecord r;
  r.name = id("moved");
  r.name_fingerprint = name_fingerprint_of("moved");
  r.phase = LockPhase::free;
  r.epoch = 5;
  r.epoch_fresh = true;
  r.to = kB;
  r.to_worker = kW2;
  snap.records.push_back(r);
  ASSERT_TRUE(fresh.restore(snap, kT0).ok());
  EXPECT_EQ(fresh.state(id("moved")).reserved_worker, kW2);
  EXPECT_EQ(fresh.acquire("moved", kB, kW1, kT0).refusal, Refusal::forbidden);
  EXPECT_TRUE(fresh.acquire("moved", kB, kW2, kT0).ok());
}

TEST_F(LeaseTableTest, AcquireWithExplicitTtl) {
  const Outcome o = table.acquire("db", kA, kW1, kT0, 3 * kSecondNs);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.expiry_ns, kT0 + 3 * kSecondNs);
}

TEST_F(LeaseTableTest, AcquireByHolderIsIdempotent) {
  const Outcome first = table.acquire("db", kA, kW1, kT0);
  const Outcome again = table.acquire("db", kA, kW1, kT0 + kSecondNs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.token, first.token);
  EXPECT_EQ(again.state, first.state);  // nothing moved, not even the expiry
}

TEST_F(LeaseTableTest, AcquireAfterReleaseTakesNextEpoch) {
  for (Epoch e = 1; e <= 5; ++e) {
    const Outcome o = table.acquire("db", kA, kW1, kT0);
    ASSERT_TRUE(o.ok());
    EXPECT_EQ(o.token.epoch, e);
    ASSERT_TRUE(table.release(id("db"), kA, e, kT0).ok());
  }
  EXPECT_EQ(table.state(id("db")).epoch, 5u);
}

TEST_F(LeaseTableTest, UnknownNameIsFreeAtTheHighWaterMark) {
  ASSERT_TRUE(table.acquire("one", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.acquire("two", kA, kW1, kT0).ok());
  const LockState s = table.state(id("three"));
  EXPECT_FALSE(s.known);
  EXPECT_EQ(s.phase, LockPhase::free);
  EXPECT_EQ(s.epoch, 2u);
  EXPECT_EQ(table.acquire("three", kB, kW1, kT0).token.epoch, 3u);
}

TEST_F(LeaseTableTest, Acquire2pcGoesToAcquiringWithTheEpoch) {
  const Outcome o = table.acquire_2pc("db", kA, kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::acquiring);
  EXPECT_EQ(o.token.epoch, 1u);
  EXPECT_EQ(o.state.deadline_ns, kT0 + 5 * kSecondNs);
  EXPECT_FALSE(table.may_mutate(id("db"), kA, 1, kT0));  // not until commit
  const Outcome again = table.acquire_2pc("db", kA, kT0 + 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.token, o.token);
}

TEST_F(LeaseTableTest, CommitMovesAcquiringToHeldWithTheWorker) {
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0).ok());
  const Outcome o = table.commit(id("db"), kA, 1, kW2, kT0 + kSecondNs);
  ASSERT_TRUE(o.ok()) << to_string(o.refusal);
  EXPECT_EQ(o.state.phase, LockPhase::held);
  EXPECT_EQ(o.state.worker, kW2);
  EXPECT_EQ(o.state.epoch, 1u);
  EXPECT_EQ(o.state.expiry_ns, kT0 + 11 * kSecondNs);
  EXPECT_TRUE(table.may_mutate(id("db"), kA, 1, kT0 + kSecondNs));
  EXPECT_TRUE(table.commit(id("db"), kA, 1, kW2, kT0 + kSecondNs).ok());  // idempotent
}

TEST_F(LeaseTableTest, Acquire2pcIsBoundToItsWorkerUntilItLeavesAcquiring) {
  const Outcome o = table.acquire_2pc("db", kA, kT0, kW1);
  ASSERT_TRUE(o.ok()) << to_string(o.refusal);
  EXPECT_EQ(o.state.worker, kW1);
  EXPECT_EQ(table.state(id("db")).worker, kW1);
  EXPECT_EQ(table.acquire_2pc("db", kA, kT0, kW2).state.worker, kW1);  // idempotent: the first stays
  EXPECT_TRUE(table.acquire_2pc("free", kB, kT0).state.worker.is_nil());   // none named
  // Every way out of Acquiring drops the binding (and its worker reference).
  ASSERT_TRUE(table.commit(id("db"), kA, 1, kW1, kT0).ok());
  EXPECT_EQ(table.state(id("db")).worker, kW1);
  ASSERT_TRUE(table.release(id("db"), kA, 1, kT0).ok());
  const Outcome again = table.acquire_2pc("db", kA, kT0, kW2);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.state.worker, kW2);
  ASSERT_TRUE(table.release(id("db"), kA, again.token.epoch, kT0).ok());  // abort
  EXPECT_TRUE(table.state(id("db")).worker.is_nil());
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0, kW2).ok());
  ASSERT_TRUE(table.revoke(id("db"), kT0).ok());
  EXPECT_TRUE(table.state(id("db")).worker.is_nil());
  ASSERT_TRUE(table.acquire_2pc("other", kC, kT0, kW2).ok());
  ASSERT_EQ(advance_to(kT0 + 5 * kSecondNs).size(), 3u);  // "free", "other" lapse; db's revoke bound
  EXPECT_TRUE(table.state(id("other")).worker.is_nil());
}

TEST_F(LeaseTableTest, AcquiringTimesOutThroughAdvance) {
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0).ok());
  EXPECT_TRUE(advance_to(kT0 + 5 * kSecondNs - 1).empty());
  const auto expired = advance_to(kT0 + 5 * kSecondNs);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].was, LockPhase::acquiring);
  EXPECT_EQ(expired[0].holder, kA);
  EXPECT_EQ(expired[0].epoch, 1u);
  EXPECT_EQ(table.state(id("db")).phase, LockPhase::free);
  // The Acquiring epoch stays burned: the next grant is above it.
  EXPECT_EQ(table.acquire("db", kB, kW1, kT0 + 6 * kSecondNs).token.epoch, 2u);
}

TEST_F(LeaseTableTest, RefreshAnswersPerEntry) {
  ASSERT_TRUE(table.acquire("mine", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.acquire("theirs", kB, kW2, kT0).ok());
  const RefreshEntry entries[] = {{id("mine"), kA, 1}, {id("theirs"), kA, 2}, {id("nobody"), kA, 1}};
  RefreshAnswer answers[3];
  ASSERT_EQ(table.refresh(kW1, entries, kT0 + 4 * kSecondNs, answers), Refusal::none);
  EXPECT_EQ(answers[0].status, RefreshStatus::refreshed);
  EXPECT_EQ(answers[0].expiry_ns, kT0 + 14 * kSecondNs);
  EXPECT_EQ(answers[1].status, RefreshStatus::lost);
  EXPECT_EQ(answers[1].holder, kB);
  EXPECT_EQ(answers[1].epoch, 2u);
  EXPECT_EQ(answers[2].status, RefreshStatus::unknown);
  EXPECT_EQ(table.state(id("mine")).expiry_ns, kT0 + 14 * kSecondNs);
  EXPECT_EQ(table.state(id("theirs")).expiry_ns, kT0 + 10 * kSecondNs);
}

TEST_F(LeaseTableTest, RefreshIsIdempotentUnderAFixedEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const RefreshEntry e[] = {{id("db"), kA, 1}};
  RefreshAnswer a[1];
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(table.refresh(kW1, e, kT0 + kSecondNs, a), Refusal::none);
    EXPECT_EQ(a[0].status, RefreshStatus::refreshed);
    EXPECT_EQ(a[0].expiry_ns, kT0 + 11 * kSecondNs);
  }
  EXPECT_EQ(table.state(id("db")).epoch, 1u);
  EXPECT_EQ(table.state(id("db")).owner, kA);
}

TEST_F(LeaseTableTest, RefreshFromAnotherWorkerIsLost) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const RefreshEntry e[] = {{id("db"), kA, 1}};
  RefreshAnswer a[1];
  ASSERT_EQ(table.refresh(kW2, e, kT0 + kSecondNs, a), Refusal::none);
  EXPECT_EQ(a[0].status, RefreshStatus::lost);
  EXPECT_EQ(table.state(id("db")).expiry_ns, kT0 + 10 * kSecondNs);
}

TEST_F(LeaseTableTest, ExpiredLeaseIsNeverRefreshedBackToLife) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const RefreshEntry e[] = {{id("db"), kA, 1}};
  RefreshAnswer a[1];
  // Not yet reclaimed by advance, but past expiry: refused all the same.
  ASSERT_EQ(table.refresh(kW1, e, kT0 + 10 * kSecondNs, a), Refusal::none);
  EXPECT_EQ(a[0].status, RefreshStatus::lost);
  EXPECT_TRUE(a[0].holder.is_nil());
  EXPECT_FALSE(table.may_mutate(id("db"), kA, 1, kT0 + 10 * kSecondNs));
  ASSERT_EQ(advance_to(kT0 + 10 * kSecondNs).size(), 1u);
  ASSERT_EQ(table.refresh(kW1, e, kT0 + 10 * kSecondNs, a), Refusal::none);
  EXPECT_NE(a[0].status, RefreshStatus::refreshed);
}

TEST_F(LeaseTableTest, ReleaseByHolderFreesTheNameKeepingTheEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const Outcome o = table.release(id("db"), kA, 1, kT0 + 1);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::free);
  EXPECT_EQ(o.state.epoch, 1u);
  EXPECT_EQ(table.held(), 0u);
  EXPECT_EQ(table.size(), 0u);  // a plain Free record is dropped
  EXPECT_TRUE(advance_to(kT0 + 100 * kSecondNs).empty());  // its timer is an orphan now
}

TEST_F(LeaseTableTest, ReleaseAbortsA2pcAcquisition) {
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0).ok());
  ASSERT_TRUE(table.release(id("db"), kA, 1, kT0).ok());
  EXPECT_EQ(table.acquire_2pc("db", kB, kT0).token.epoch, 2u);
}

TEST_F(LeaseTableTest, AdvanceReportsExpiriesInDeadlineOrder) {
  // "late" is acquired first (its timer is armed first) but refreshed past the others.
  ASSERT_TRUE(table.acquire("late", kA, kW1, kT0, 1 * kSecondNs).ok());
  ASSERT_TRUE(table.acquire("mid", kB, kW1, kT0, 3 * kSecondNs).ok());
  ASSERT_TRUE(table.acquire("early", kC, kW1, kT0, 2 * kSecondNs).ok());
  const RefreshEntry e[] = {{id("late"), kA, 1}};
  RefreshAnswer a[1];
  ASSERT_EQ(table.refresh(kW1, e, kT0 + kSecondNs / 2, a, 4 * kSecondNs), Refusal::none);
  ASSERT_EQ(a[0].status, RefreshStatus::refreshed);
  const auto expired = advance_to(kT0 + 10 * kSecondNs);
  ASSERT_EQ(expired.size(), 3u);
  EXPECT_EQ(expired[0].name, id("early"));
  EXPECT_EQ(expired[0].deadline_ns, kT0 + 2 * kSecondNs);
  EXPECT_EQ(expired[1].name, id("mid"));
  EXPECT_EQ(expired[2].name, id("late"));
  EXPECT_EQ(expired[2].deadline_ns, kT0 + kSecondNs / 2 + 4 * kSecondNs);
  EXPECT_EQ(expired[2].worker, kW1);
  EXPECT_EQ(table.held(), 0u);
}

TEST_F(LeaseTableTest, AdvanceHonoursItsLimitAndResumesInOrder) {
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(table.acquire("n" + std::to_string(i), kA, kW1, kT0, (i + 1) * kSecondNs).ok());
  std::vector<Expiry> out;
  EXPECT_EQ(table.advance(kT0 + 10 * kSecondNs, out, 2), 2u);
  EXPECT_EQ(table.advance(kT0 + 10 * kSecondNs, out, 2), 2u);
  EXPECT_EQ(table.advance(kT0 + 10 * kSecondNs, out, 2), 1u);
  ASSERT_EQ(out.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i].name, id("n" + std::to_string(i)));
}

TEST_F(LeaseTableTest, AdvanceSkipsARefreshedLease) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const RefreshEntry e[] = {{id("db"), kA, 1}};
  RefreshAnswer a[1];
  ASSERT_EQ(table.refresh(kW1, e, kT0 + 9 * kSecondNs, a), Refusal::none);
  EXPECT_TRUE(advance_to(kT0 + 10 * kSecondNs).empty());  // re-armed lazily, not expired
  EXPECT_EQ(table.state(id("db")).phase, LockPhase::held);
  EXPECT_EQ(advance_to(kT0 + 19 * kSecondNs).size(), 1u);
}

TEST_F(LeaseTableTest, BeginTransferAllocatesTheNewEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const Outcome o = table.begin_transfer(id("db"), kA, 1, kB, kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::transferring);
  EXPECT_EQ(o.state.owner, kA);
  EXPECT_EQ(o.state.to, kB);
  EXPECT_EQ(o.state.old_epoch, 1u);
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_FALSE(table.may_mutate(id("db"), kA, 1, kT0));
  EXPECT_FALSE(table.may_mutate(id("db"), kB, 2, kT0));
  EXPECT_FALSE(table.valid_fence(id("db"), 1));
  EXPECT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());  // idempotent retry
}

TEST_F(LeaseTableTest, CompleteReleaseLeavesFreeReservedForTheRecipient) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  ASSERT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0).ok());
  const Outcome o = table.complete_release(id("db"), kA, 2, kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::free);
  EXPECT_EQ(o.state.reserved_for, kB);
  EXPECT_TRUE(o.state.epoch_fresh);
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_TRUE(table.complete_release(id("db"), kA, 2, kT0).ok());  // idempotent retry
}

TEST_F(LeaseTableTest, AcquireByTheRecipientGetsTheTransferEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  ASSERT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0).ok());
  ASSERT_TRUE(table.complete_release(id("db"), kA, 2, kT0).ok());
  const Outcome o = table.acquire("db", kB, kW2, kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.token, (Token{id("db"), 2, kB}));
  EXPECT_TRUE(table.may_mutate(id("db"), kB, 2, kT0));
}

// The transfer guard: `from` may still run after begin_transfer, so neither the reserved
// sandbox nor anyone else gets the name until from's worker confirms the kill or from's
// lease (+ lock-delay) would have ended.
TEST_F(LeaseTableTest, TransferCompletesOnlyAfterTheOldHoldersKillIsConfirmed) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());  // expires at kT0 + 10 s
  const Outcome b = table.begin_transfer(id("db"), kA, 1, kB, kT0);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b.state.revoke_pending);
  EXPECT_EQ(b.state.revoked_worker, kW1);
  EXPECT_EQ(b.state.revoked_epoch, 1u);
  EXPECT_EQ(b.state.lock_delay_until_ns, kT0 + 10 * kSecondNs);
  const Outcome early = table.complete_release(id("db"), kA, 2, kT0 + kSecondNs);
  EXPECT_EQ(early.refusal, Refusal::lock_delay);
  EXPECT_EQ(early.state.phase, LockPhase::transferring);
  EXPECT_EQ(early.state.lock_delay_until_ns, kT0 + 10 * kSecondNs);
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0 + kSecondNs).refusal, Refusal::transferring);
  // Only from's worker, for the outgoing grant's epoch, lifts it.
  EXPECT_EQ(table.confirm_kill(id("db"), kW2, 1, kT0 + kSecondNs).refusal, Refusal::not_holder);
  EXPECT_EQ(table.confirm_kill(id("db"), kW1, 2, kT0 + kSecondNs).refusal, Refusal::stale_epoch);
  EXPECT_TRUE(table.state(id("db")).revoke_pending);
  const Outcome c = table.confirm_kill(id("db"), kW1, 1, kT0 + kSecondNs);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c.state.revoke_pending);
  EXPECT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0 + kSecondNs).ok());  // idempotent
  const Outcome done = table.complete_release(id("db"), kA, 2, kT0 + kSecondNs);
  ASSERT_TRUE(done.ok()) << to_string(done.refusal);
  EXPECT_EQ(done.state.reserved_for, kB);
  EXPECT_TRUE(table.acquire("db", kB, kW2, kT0 + kSecondNs).ok());
}

TEST_F(LeaseTableTest, TransferGuardEndsAtTheOldLeasesExpiryPlusLockDelay) {
  LeaseConfig c = small_config();
  c.lock_delay_ns = 2 * kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0, 4 * kSecondNs).ok());  // expires at kT0 + 4 s
  ASSERT_TRUE(t.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  EXPECT_EQ(t.state(id("db")).lock_delay_until_ns, kT0 + 6 * kSecondNs);
  EXPECT_EQ(t.complete_release(id("db"), kA, 2, kT0 + 6 * kSecondNs - 1).refusal, Refusal::lock_delay);
  std::vector<Expiry> out;
  EXPECT_EQ(t.advance(kT0 + 6 * kSecondNs - 1, out), 0u);
  ASSERT_EQ(t.advance(kT0 + 6 * kSecondNs, out), 1u);
  EXPECT_EQ(out[0].kind, ExpiryKind::revoke_bound);
  EXPECT_EQ(out[0].was, LockPhase::transferring);
  EXPECT_EQ(out[0].worker, kW1);
  EXPECT_EQ(out[0].epoch, 2u);
  EXPECT_FALSE(t.state(id("db")).revoke_pending);
  EXPECT_TRUE(t.complete_release(id("db"), kA, 2, kT0 + 6 * kSecondNs).ok());
  // Also without advance: a complete at the bound is accepted (a second table: time into one
  // table never goes backwards).
  LeaseTable t2(c);
  ASSERT_TRUE(t2.acquire("db2", kA, kW1, kT0, 4 * kSecondNs).ok());
  ASSERT_TRUE(t2.begin_transfer(id("db2"), kA, 1, kB, kT0).ok());
  EXPECT_TRUE(t2.complete_release(id("db2"), kA, 2, kT0 + 6 * kSecondNs).ok());
}

TEST_F(LeaseTableTest, TransferGuardAblatedCompletesAtOnce) {
  LeaseConfig c = small_config();
  c.ablate_transfer_guard = true;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0).ok());
  const Outcome b = t.begin_transfer(id("db"), kA, 1, kB, kT0);
  EXPECT_FALSE(b.state.revoke_pending);
  EXPECT_TRUE(t.complete_release(id("db"), kA, 2, kT0).ok());  // the old holder may still run
}

TEST_F(LeaseTableTest, PreemptibleTransferGuardIsTheLivenessTtlFromTheBegin) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0), Refusal::none);
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0, kW1).ok());
  ASSERT_TRUE(t.commit(id("db"), kA, 1, kW1, kT0).ok());
  ASSERT_TRUE(t.begin_transfer(id("db"), kA, 1, kB, kT0 + kSecondNs).ok());
  EXPECT_EQ(t.state(id("db")).lock_delay_until_ns, kT0 + 11 * kSecondNs);
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0 + 5 * kSecondNs), Refusal::none);  // does not move it
  EXPECT_EQ(t.state(id("db")).lock_delay_until_ns, kT0 + 11 * kSecondNs);
  EXPECT_EQ(t.complete_release(id("db"), kA, 2, kT0 + 11 * kSecondNs - 1).refusal, Refusal::lock_delay);
  EXPECT_TRUE(t.complete_release(id("db"), kA, 2, kT0 + 11 * kSecondNs).ok());
}

TEST_F(LeaseTableTest, RevokeFreesFromEveryStateWithEpochPlusOne) {
  ASSERT_TRUE(table.acquire("held", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.acquire_2pc("acq", kA, kT0).ok());
  ASSERT_TRUE(table.acquire("xfer", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("xfer"), kA, 3, kB, kT0).ok());
  for (auto [name, before] : {std::pair{"held", 1u}, {"acq", 2u}, {"xfer", 4u}}) {
    const Outcome o = table.revoke(id(name), kT0);
    ASSERT_TRUE(o.ok()) << name;
    EXPECT_EQ(o.state.phase, LockPhase::free) << name;
    EXPECT_EQ(o.state.epoch, before + 1) << name;
    EXPECT_TRUE(o.state.epoch_fresh) << name;
    EXPECT_TRUE(o.state.reserved_for.is_nil()) << name;
  }
  // Free -> Free is refused unless forced, which burns one.
  EXPECT_EQ(table.revoke(id("held"), kT0).refusal, Refusal::not_held);
  EXPECT_EQ(table.revoke(id("held"), kT0, 0, /*force=*/true).state.epoch, 3u);
  EXPECT_EQ(table.held(), 0u);
  // The old holder's worker confirms its kill; whoever acquires next gets the fresh epoch.
  ASSERT_TRUE(table.confirm_kill(id("held"), kW1, 1, kT0).ok());
  EXPECT_EQ(table.acquire("held", kC, kW1, kT0).token.epoch, 3u);
}

// ---- revoke: lock-delay until the kill is confirmed or the old lease would have expired ----

TEST_F(LeaseTableTest, RevokedNameIsNotGrantableUntilTheOldLeaseWouldHaveExpired) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());  // expiry kT0 + 10 s
  const Outcome o = table.revoke(id("db"), kT0 + kSecondNs);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::free);
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_TRUE(o.state.revoke_pending);
  EXPECT_EQ(o.state.revoked_epoch, 1u);
  EXPECT_EQ(o.state.revoked_worker, kW1);
  EXPECT_EQ(o.state.lock_delay_until_ns, kT0 + 10 * kSecondNs);
  EXPECT_FALSE(table.valid_fence(id("db"), 1));  // the old token is fenced out at once
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0 + 2 * kSecondNs).refusal, Refusal::lock_delay);
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0 + 10 * kSecondNs - 1).refusal, Refusal::lock_delay);
  std::vector<Expiry> out;
  EXPECT_EQ(table.advance(kT0 + 10 * kSecondNs - 1, out), 0u);
  ASSERT_EQ(table.advance(kT0 + 10 * kSecondNs, out), 1u);
  EXPECT_EQ(out[0].kind, ExpiryKind::revoke_bound);
  EXPECT_EQ(out[0].was, LockPhase::free);
  EXPECT_EQ(out[0].worker, kW1);
  EXPECT_EQ(out[0].epoch, 2u);
  EXPECT_FALSE(table.state(id("db")).revoke_pending);
  EXPECT_TRUE(table.state(id("db")).epoch_fresh);
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0 + 10 * kSecondNs).token.epoch, 2u);
}

TEST_F(LeaseTableTest, RevokeBoundIncludesTheConfiguredLockDelay) {
  LeaseConfig c = small_config();
  c.lock_delay_ns = 2 * kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(t.revoke(id("db"), kT0).state.lock_delay_until_ns, kT0 + 12 * kSecondNs);
}

TEST_F(LeaseTableTest, KillConfirmationLiftsTheRevokeOnlyFromTheHoldersWorkerForThatEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.revoke(id("db"), kT0).ok());
  const LockState pending = table.state(id("db"));
  EXPECT_EQ(table.confirm_kill(id("db"), kW2, 1, kT0).refusal, Refusal::not_holder);
  EXPECT_EQ(table.confirm_kill(id("db"), kW1, 2, kT0).refusal, Refusal::stale_epoch);
  EXPECT_EQ(table.confirm_kill(id("db"), WorkerId{}, 1, kT0).refusal, Refusal::bad_request);
  EXPECT_EQ(table.confirm_kill(id("nope"), kW1, 1, kT0).refusal, Refusal::unknown_name);
  EXPECT_EQ(table.state(id("db")), pending);  // refused: nothing changed
  const Outcome o = table.confirm_kill(id("db"), kW1, 1, kT0 + 1);
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o.state.revoke_pending);
  EXPECT_EQ(o.state.lock_delay_until_ns, 0);
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0 + 2).ok());  // idempotent
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0 + 2).token.epoch, 2u);
  // A late confirmation of the old grant cannot touch the new holder.
  EXPECT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0 + 3).ok());
  EXPECT_EQ(table.state(id("db")).owner, kB);
}

TEST_F(LeaseTableTest, RevokeOfAnExpiredOrAcquiringOrTransferringGrant) {
  // A lease past its expiry (not yet reclaimed): nothing can still run it, no lock-delay.
  // (Checked last, at kT0 + 10 s: time into the table never goes backwards.)
  ASSERT_TRUE(table.acquire("gone", kA, kW1, kT0).ok());
  // Acquiring: until its commit deadline, no worker can confirm.
  ASSERT_TRUE(table.acquire_2pc("acq", kA, kT0).ok());
  const Outcome a = table.revoke(id("acq"), kT0);
  EXPECT_TRUE(a.state.revoke_pending);
  EXPECT_TRUE(a.state.revoked_worker.is_nil());
  EXPECT_EQ(a.state.lock_delay_until_ns, kT0 + 5 * kSecondNs);
  EXPECT_EQ(table.confirm_kill(id("acq"), kW1, 1, kT0).refusal, Refusal::not_holder);
  // Transferring: `from` may still run; the transfer guard carries over (its bound, its
  // worker's confirmation of the outgoing grant).
  const Epoch xe = table.acquire("xfer", kA, kW1, kT0).token.epoch;
  ASSERT_TRUE(table.begin_transfer(id("xfer"), kA, xe, kB, kT0).ok());
  const Outcome x = table.revoke(id("xfer"), kT0);
  EXPECT_TRUE(x.state.revoke_pending);
  EXPECT_EQ(x.state.lock_delay_until_ns, kT0 + 10 * kSecondNs);
  EXPECT_EQ(x.state.revoked_worker, kW1);
  EXPECT_EQ(x.state.revoked_epoch, xe);
  EXPECT_TRUE(table.confirm_kill(id("xfer"), kW1, xe, kT0).ok());
  EXPECT_TRUE(table.acquire("xfer", kC, kW2, kT0).ok());
  // A transfer whose guard was lifted (the old holder is dead): nothing is pending.
  const Epoch ye = table.acquire("xfer2", kA, kW1, kT0).token.epoch;
  ASSERT_TRUE(table.begin_transfer(id("xfer2"), kA, ye, kB, kT0).ok());
  ASSERT_TRUE(table.confirm_kill(id("xfer2"), kW1, ye, kT0).ok());
  EXPECT_FALSE(table.revoke(id("xfer2"), kT0).state.revoke_pending);
  const Outcome g = table.revoke(id("gone"), kT0 + 10 * kSecondNs);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g.state.revoke_pending);
  EXPECT_TRUE(table.acquire("gone", kB, kW2, kT0 + 10 * kSecondNs).ok());
}

TEST_F(LeaseTableTest, RevokeAtAnExpectedEpochOnly) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const LockState before = table.state(id("db"));
  EXPECT_EQ(table.revoke(id("db"), kT0, 2).refusal, Refusal::stale_epoch);
  EXPECT_EQ(table.state(id("db")), before);
  const Outcome o = table.revoke(id("db"), kT0, 1);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.epoch, 2u);  // exactly expected + 1: a caller can announce it first
}

TEST_F(LeaseTableTest, RevokeOfAFreeNameIsNotHeldUnlessForced) {
  ASSERT_TRUE(table.reassign("db", kC, kT0).ok());  // Free at epoch 1, reserved for C
  const LockState before = table.state(id("db"));
  EXPECT_EQ(table.revoke(id("db"), kT0).refusal, Refusal::not_held);
  EXPECT_EQ(table.state(id("db")), before);  // no epoch burned
  const Outcome o = table.revoke(id("db"), kT0, 0, true);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_TRUE(o.state.reserved_for.is_nil());
  EXPECT_FALSE(o.state.revoke_pending);
  // A pending revoke survives a forced revoke: the old holder may still run.
  ASSERT_TRUE(table.acquire("x", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.revoke(id("x"), kT0).ok());
  const Outcome again = table.revoke(id("x"), kT0, 0, true);
  EXPECT_TRUE(again.state.revoke_pending);
  EXPECT_EQ(again.state.revoked_epoch, table.state(id("x")).epoch - 2);
  EXPECT_EQ(table.acquire("x", kB, kW2, kT0).refusal, Refusal::lock_delay);
  EXPECT_TRUE(table.confirm_kill(id("x"), kW1, again.state.revoked_epoch, kT0).ok());
  EXPECT_TRUE(table.acquire("x", kB, kW2, kT0).ok());
}

TEST_F(LeaseTableTest, PreemptibleRevokeWaitsForTheHoldersWorkerLiveness) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0), Refusal::none);  // live until kT0 + 10 s
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0).ok());
  ASSERT_TRUE(t.commit(id("db"), kA, 1, kW1, kT0).ok());
  const Outcome o = t.revoke(id("db"), kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o.state.revoke_pending);
  EXPECT_EQ(o.state.lock_delay_until_ns, kT0 + 10 * kSecondNs);
  // The bound is fixed: the worker's beats do not move it (a worker that beats but gets no
  // answer has its kill-switch fire within the liveness TTL of its last acknowledged beat).
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0 + 5 * kSecondNs), Refusal::none);
  EXPECT_EQ(t.state(id("db")).lock_delay_until_ns, kT0 + 10 * kSecondNs);
  EXPECT_EQ(t.acquire_2pc("db", kB, kT0 + 10 * kSecondNs - 1).refusal, Refusal::lock_delay);
  std::vector<Expiry> out;
  EXPECT_EQ(t.advance(kT0 + 10 * kSecondNs - 1, out), 0u);
  ASSERT_EQ(t.advance(kT0 + 10 * kSecondNs, out), 1u);
  EXPECT_EQ(out[0].kind, ExpiryKind::revoke_bound);
  EXPECT_TRUE(t.acquire_2pc("db", kB, kT0 + 10 * kSecondNs).ok());
}

// ---- reservations lapse ----

TEST_F(LeaseTableTest, ReservationLapsesToPlainFreeAtTheSameEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  ASSERT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0).ok());
  const Outcome o = table.complete_release(id("db"), kA, 2, kT0);
  EXPECT_EQ(o.state.reservation_until_ns, kT0 + 30 * kSecondNs);  // reservation_ttl_ns default
  EXPECT_EQ(table.acquire("db", kC, kW2, kT0 + kSecondNs).refusal, Refusal::reserved);
  std::vector<Expiry> out;
  EXPECT_EQ(table.advance(kT0 + 30 * kSecondNs - 1, out), 0u);
  ASSERT_EQ(table.advance(kT0 + 30 * kSecondNs, out), 1u);
  EXPECT_EQ(out[0].kind, ExpiryKind::reservation);
  EXPECT_EQ(out[0].holder, kB);
  const LockState s = table.state(id("db"));
  EXPECT_TRUE(s.known);
  EXPECT_TRUE(s.reserved_for.is_nil());
  EXPECT_TRUE(s.epoch_fresh);  // the fresh epoch is kept: still above every token issued
  EXPECT_EQ(s.epoch, 2u);
  EXPECT_EQ(table.acquire("db", kC, kW2, kT0 + 30 * kSecondNs).token.epoch, 2u);
}

TEST_F(LeaseTableTest, AReservationPastItsLapseIsNotHonouredBeforeAdvance) {
  ASSERT_TRUE(table.reassign("db", kB, kT0).ok());
  EXPECT_EQ(table.acquire("db", kC, kW2, kT0 + 30 * kSecondNs).token.epoch, 1u);
}

TEST_F(LeaseTableTest, ReservationTtlStartsWhenAPendingRevokeEnds) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.revoke(id("db"), kT0).ok());  // pending until kT0 + 10 s
  const Outcome r = table.reassign("db", kB, kT0);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.state.revoke_pending);
  EXPECT_EQ(r.state.reservation_until_ns, 0);
  EXPECT_EQ(table.acquire("db", kB, kW2, kT0).refusal, Refusal::lock_delay);  // not even the reservee
  ASSERT_TRUE(table.confirm_kill(id("db"), kW1, 1, kT0 + kSecondNs).ok());
  EXPECT_EQ(table.state(id("db")).reservation_until_ns, kT0 + 31 * kSecondNs);
  EXPECT_EQ(table.acquire("db", kC, kW2, kT0 + kSecondNs).refusal, Refusal::reserved);
  EXPECT_TRUE(table.acquire("db", kB, kW2, kT0 + kSecondNs).ok());
}

TEST_F(LeaseTableTest, PendingRevokeAndReservationSurviveARestart) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.revoke(id("db"), kT0).ok());
  ASSERT_TRUE(table.reassign("res", kB, kT0).ok());
  const DurableSnapshot snap = table.export_durable(kT0);
  const std::int64_t restart = kT0 + 5 * kSecondNs;
  LeaseTable r(small_config());
  ASSERT_TRUE(r.restore(snap, restart).ok());
  const LockState s = r.state(id("db"));
  EXPECT_TRUE(s.revoke_pending);
  EXPECT_EQ(s.revoked_epoch, 1u);
  EXPECT_EQ(s.revoked_worker, kW1);
  EXPECT_EQ(s.lock_delay_until_ns, restart + 60 * kSecondNs);  // a full TTL: times are not durable
  LeaseTable later(small_config());  // the same restart, asked 59 s on
  ASSERT_TRUE(later.restore(snap, restart).ok());
  EXPECT_EQ(later.acquire("db", kB, kW2, restart + 59 * kSecondNs).refusal, Refusal::lock_delay);
  EXPECT_TRUE(r.confirm_kill(id("db"), kW1, 1, restart).ok());
  EXPECT_EQ(r.acquire("db", kB, kW2, restart).token.epoch, 2u);
  EXPECT_EQ(r.state(id("res")).reservation_until_ns, restart + 30 * kSecondNs);  // a fresh TTL
}

TEST_F(LeaseTableTest, ReassignReservesAFreeNameWithEpochPlusOne) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.release(id("db"), kA, 1, kT0).ok());
  const Outcome o = table.reassign("db", kC, kT0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.reserved_for, kC);
  EXPECT_EQ(o.state.epoch, 2u);
  EXPECT_EQ(table.acquire("db", kC, kW1, kT0).token.epoch, 2u);
  // Reassign creates a record for a name the table does not know.
  const Outcome fresh = table.reassign("new-name", kB, kT0);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh.state.epoch, 3u);
}

TEST_F(LeaseTableTest, PreemptAfterWorkerLivenessLapsed) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0).ok());
  const Outcome c = t.commit(id("db"), kA, 1, kW1, kT0);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c.state.expiry_ns, kNoExpiry);
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0), Refusal::none);
  EXPECT_EQ(t.preempt(id("db"), kA, 1, false, kT0 + 9 * kSecondNs).refusal, Refusal::worker_alive);
  const Outcome o = t.preempt(id("db"), kA, 1, false, kT0 + 10 * kSecondNs);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o.state.phase, LockPhase::free);
  EXPECT_EQ(o.state.epoch, 1u);  // preempt keeps the epoch; the next grant is +1
  ASSERT_TRUE(t.acquire_2pc("db", kB, kT0 + 10 * kSecondNs).ok());
  EXPECT_EQ(t.state(id("db")).epoch, 2u);
}

TEST_F(LeaseTableTest, PreemptWhenTheLiveWorkerSaysNotRunning) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0).ok());
  ASSERT_TRUE(t.commit(id("db"), kA, 1, kW1, kT0).ok());
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0), Refusal::none);
  const Outcome o = t.preempt(id("db"), kA, 1, true, kT0 + 1);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(t.held(), 0u);
}

TEST_F(LeaseTableTest, PreemptibleHeldNamesDoNotExpireByTtl) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0).ok());
  ASSERT_TRUE(t.commit(id("db"), kA, 1, kW1, kT0).ok());
  std::vector<Expiry> out;
  EXPECT_EQ(t.advance(kT0 + 1000 * kSecondNs, out), 0u);
  EXPECT_TRUE(t.may_mutate(id("db"), kA, 1, kT0 + 1000 * kSecondNs));
}

TEST_F(LeaseTableTest, WorkerHeartbeatKeepsAWorkerAlive) {
  EXPECT_FALSE(table.worker_alive(kW1, kT0));
  ASSERT_EQ(table.worker_heartbeat(kW1, kT0), Refusal::none);
  EXPECT_TRUE(table.worker_alive(kW1, kT0 + 10 * kSecondNs - 1));
  EXPECT_FALSE(table.worker_alive(kW1, kT0 + 10 * kSecondNs));
  // A refresh batch counts as a heartbeat too.
  const RefreshEntry none[1] = {};
  RefreshAnswer a[1];
  ASSERT_EQ(table.refresh(kW1, std::span(none, 0), kT0 + 20 * kSecondNs, a), Refusal::none);
  EXPECT_TRUE(table.worker_alive(kW1, kT0 + 25 * kSecondNs));
}

TEST_F(LeaseTableTest, LockDelayAfterExpiryThenFree) {
  LeaseConfig c = small_config();
  c.lock_delay_ns = 2 * kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0).ok());
  std::vector<Expiry> out;
  ASSERT_EQ(t.advance(kT0 + 10 * kSecondNs, out), 1u);
  const LockState s = t.state(id("db"));
  EXPECT_EQ(s.lock_delay_until_ns, kT0 + 12 * kSecondNs);
  // The delay applies to everyone, the former holder included (its delayed requests are
  // what the delay protects against).
  EXPECT_EQ(t.acquire("db", kA, kW1, kT0 + 11 * kSecondNs).refusal, Refusal::lock_delay);
  EXPECT_EQ(t.acquire("db", kB, kW1, kT0 + 11 * kSecondNs).refusal, Refusal::lock_delay);
  EXPECT_EQ(t.advance(kT0 + 12 * kSecondNs, out), 0u);  // lock-delay end is not an expiry
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.acquire("db", kB, kW1, kT0 + 12 * kSecondNs).token.epoch, 2u);
}

TEST_F(LeaseTableTest, ReleaseDoesNotStartALockDelay) {
  LeaseConfig c = small_config();
  c.lock_delay_ns = 2 * kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(t.release(id("db"), kA, 1, kT0).ok());
  EXPECT_TRUE(t.acquire("db", kB, kW1, kT0).ok());
}

// ---- refusals -----------------------------------------------------------------------------

TEST_F(LeaseTableTest, RefusesInvalidName) {
  EXPECT_EQ(table.acquire("", kA, kW1, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.acquire("has space", kA, kW1, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.acquire_2pc(std::string(129, 'x'), kA, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.reassign("é", kA, kT0).refusal, Refusal::invalid_name);
  // A new name does not begin with '-' (validate_new_name): "-" means none in listings.
  EXPECT_EQ(table.acquire("-", kA, kW1, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.acquire_2pc("-x", kA, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.reassign("-", kA, kT0).refusal, Refusal::invalid_name);
  EXPECT_EQ(table.size(), 0u);
}

TEST_F(LeaseTableTest, RefusesNameCollision) {
  // A record whose id is name_id_of("db") but whose text was different: what a SHA-1
  // collision would look like. Built through restore (the only way to forge one).
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("db"), name_fingerprint_of("other-text"),
                                       LockPhase::held, 7, kA, {}, kW1, false});
  ASSERT_TRUE(table.restore(snap, kT0).ok());
  const Outcome o = table.acquire("db", kB, kW1, kT0);
  EXPECT_EQ(o.refusal, Refusal::name_collision);
  EXPECT_EQ(table.reassign("db", kB, kT0).refusal, Refusal::name_collision);
}

TEST_F(LeaseTableTest, RefusesHeldWithHolderAndEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const Outcome o = table.acquire("db", kB, kW2, kT0);
  EXPECT_EQ(o.refusal, Refusal::held);
  EXPECT_EQ(o.state.owner, kA);
  EXPECT_EQ(o.state.worker, kW1);
  EXPECT_EQ(o.state.epoch, 1u);
  EXPECT_EQ(o.state.expiry_ns, kT0 + 10 * kSecondNs);
  EXPECT_EQ(o.token, Token{});
}

TEST_F(LeaseTableTest, RefusesAcquiring) {
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0).ok());
  EXPECT_EQ(table.acquire("db", kB, kW1, kT0).refusal, Refusal::acquiring);
  EXPECT_EQ(table.acquire_2pc("db", kB, kT0).refusal, Refusal::acquiring);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kB, kT0).refusal, Refusal::acquiring);
}

TEST_F(LeaseTableTest, RefusesTransferring) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  EXPECT_EQ(table.acquire("db", kB, kW1, kT0).refusal, Refusal::transferring);
  EXPECT_EQ(table.release(id("db"), kA, 1, kT0).refusal, Refusal::transferring);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 2, kC, kT0).refusal, Refusal::transferring);
}

TEST_F(LeaseTableTest, RefusesReserved) {
  ASSERT_TRUE(table.reassign("db", kB, kT0).ok());
  const Outcome o = table.acquire("db", kC, kW1, kT0);
  EXPECT_EQ(o.refusal, Refusal::reserved);
  EXPECT_EQ(o.state.reserved_for, kB);
}

TEST_F(LeaseTableTest, RefusesLockDelay) {
  LeaseConfig c = small_config();
  c.lock_delay_ns = kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("db", kA, kW1, kT0).ok());
  std::vector<Expiry> out;
  t.advance(kT0 + 10 * kSecondNs, out);
  const Outcome o = t.acquire_2pc("db", kB, kT0 + 10 * kSecondNs);
  EXPECT_EQ(o.refusal, Refusal::lock_delay);
  EXPECT_EQ(o.state.lock_delay_until_ns, kT0 + 11 * kSecondNs);
}

TEST_F(LeaseTableTest, RefusesUnknownName) {
  EXPECT_EQ(table.release(id("db"), kA, 1, kT0).refusal, Refusal::unknown_name);
  EXPECT_EQ(table.commit(id("db"), kA, 1, kW1, kT0).refusal, Refusal::unknown_name);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kB, kT0).refusal, Refusal::unknown_name);
  EXPECT_EQ(table.complete_release(id("db"), kA, 1, kT0).refusal, Refusal::unknown_name);
  EXPECT_EQ(table.revoke(id("db"), kT0).refusal, Refusal::unknown_name);
}

TEST_F(LeaseTableTest, RefusesNotHolder) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(table.release(id("db"), kB, 1, kT0).refusal, Refusal::not_holder);
  EXPECT_EQ(table.begin_transfer(id("db"), kB, 1, kC, kT0).refusal, Refusal::not_holder);
  ASSERT_TRUE(table.acquire_2pc("two", kA, kT0).ok());
  EXPECT_EQ(table.commit(id("two"), kB, 2, kW1, kT0).refusal, Refusal::not_holder);
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 1, kB, kT0).ok());
  EXPECT_EQ(table.complete_release(id("db"), kC, 2, kT0).refusal, Refusal::not_holder);
}

TEST_F(LeaseTableTest, RefusesStaleEpoch) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.release(id("db"), kA, 1, kT0).ok());
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());  // epoch 2
  EXPECT_EQ(table.release(id("db"), kA, 1, kT0).refusal, Refusal::stale_epoch);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kB, kT0).refusal, Refusal::stale_epoch);
  ASSERT_TRUE(table.begin_transfer(id("db"), kA, 2, kB, kT0).ok());
  EXPECT_EQ(table.complete_release(id("db"), kA, 2, kT0).refusal, Refusal::stale_epoch);
  ASSERT_TRUE(table.acquire_2pc("two", kA, kT0).ok());
  EXPECT_EQ(table.commit(id("two"), kA, 1, kW1, kT0).refusal, Refusal::stale_epoch);
}

TEST_F(LeaseTableTest, RefusesNotAcquiring) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(table.commit(id("db"), kB, 1, kW1, kT0).refusal, Refusal::not_acquiring);
}

TEST_F(LeaseTableTest, RefusesAcquiringExpiredAtTheMomentOfCommit) {
  ASSERT_TRUE(table.acquire_2pc("db", kA, kT0).ok());
  // advance has not run: commit re-checks the deadline itself.
  const Outcome o = table.commit(id("db"), kA, 1, kW1, kT0 + 5 * kSecondNs);
  EXPECT_EQ(o.refusal, Refusal::acquiring_expired);
  EXPECT_EQ(o.state.phase, LockPhase::acquiring);
  LeaseTable in_time(small_config());  // one ns before the deadline (a second table: time
  ASSERT_TRUE(in_time.acquire_2pc("db", kA, kT0).ok());  // into one never goes backwards)
  EXPECT_TRUE(in_time.commit(id("db"), kA, 1, kW1, kT0 + 5 * kSecondNs - 1).ok());
}

TEST_F(LeaseTableTest, RefusesNotTransferring) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(table.complete_release(id("db"), kA, 1, kT0).refusal, Refusal::not_transferring);
}

TEST_F(LeaseTableTest, RefusesNotFree) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(table.reassign("db", kB, kT0).refusal, Refusal::not_free);
}

TEST_F(LeaseTableTest, RefusesWrongMode) {
  EXPECT_EQ(table.preempt(id("db"), kA, 1, true, kT0).refusal, Refusal::wrong_mode);
  LeaseTable t(small_config(LockMode::preemptible));
  EXPECT_EQ(t.acquire("db", kA, kW1, kT0).refusal, Refusal::wrong_mode);
}

TEST_F(LeaseTableTest, RefusesPreemptWhileWorkerAliveAndRunning) {
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_TRUE(t.acquire_2pc("db", kA, kT0).ok());
  EXPECT_EQ(t.preempt(id("db"), kA, 1, true, kT0).refusal, Refusal::acquiring);  // never
  ASSERT_TRUE(t.commit(id("db"), kA, 1, kW1, kT0).ok());
  ASSERT_EQ(t.worker_heartbeat(kW1, kT0), Refusal::none);
  const Outcome o = t.preempt(id("db"), kA, 1, false, kT0 + kSecondNs);
  EXPECT_EQ(o.refusal, Refusal::worker_alive);
  EXPECT_EQ(o.state.phase, LockPhase::held);
  // A decision about an older grant cannot free a newer one.
  EXPECT_EQ(t.preempt(id("db"), kA, 0, true, kT0 + kSecondNs).refusal, Refusal::stale_epoch);
  EXPECT_EQ(t.preempt(id("db"), kB, 1, true, kT0 + kSecondNs).refusal, Refusal::not_holder);
}

TEST_F(LeaseTableTest, RefusesTableFull) {
  LeaseConfig c = small_config();
  c.capacity = 2;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire("a", kA, kW1, kT0).ok());
  ASSERT_TRUE(t.acquire("b", kA, kW1, kT0).ok());
  EXPECT_EQ(t.acquire("c", kA, kW1, kT0).refusal, Refusal::table_full);
  EXPECT_EQ(t.reassign("c", kA, kT0).refusal, Refusal::table_full);
  ASSERT_TRUE(t.release(name_id_of("a"), kA, 1, kT0).ok());  // frees the record
  EXPECT_TRUE(t.acquire("c", kA, kW1, kT0).ok());
}

TEST_F(LeaseTableTest, RefusesBadRequest) {
  EXPECT_EQ(table.acquire("db", SandboxId{}, kW1, kT0).refusal, Refusal::bad_request);
  EXPECT_EQ(table.acquire("db", kA, WorkerId{}, kT0).refusal, Refusal::bad_request);
  EXPECT_EQ(table.acquire("db", kA, kW1, kT0, 61 * kSecondNs).refusal, Refusal::bad_request);
  EXPECT_EQ(table.acquire("db", kA, kW1, -1).refusal, Refusal::bad_request);
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kA, kT0).refusal, Refusal::bad_request);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, SandboxId{}, kT0).refusal, Refusal::bad_request);
  EXPECT_EQ(table.reassign("x", SandboxId{}, kT0).refusal, Refusal::bad_request);
  std::vector<RefreshEntry> many(kRefreshBatchMax + 1);
  std::vector<RefreshAnswer> answers(kRefreshBatchMax + 1);
  EXPECT_EQ(table.refresh(kW1, many, kT0, answers), Refusal::bad_request);
  std::vector<RefreshEntry> two(2);
  EXPECT_EQ(table.refresh(kW1, two, kT0, std::span(answers.data(), 1)), Refusal::bad_request);
  EXPECT_EQ(table.refresh(WorkerId{}, two, kT0, answers), Refusal::bad_request);
  EXPECT_EQ(table.worker_heartbeat(WorkerId{}, kT0), Refusal::bad_request);
  EXPECT_EQ(table.state(id("db")).epoch, 1u);  // nothing changed
}

TEST_F(LeaseTableTest, RefusesEpochExhaustedRatherThanWrap) {
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("db"), name_fingerprint_of("db"), LockPhase::held,
                                       kEpochMax, kA, {}, kW1, false});
  ASSERT_TRUE(table.restore(snap, kT0).ok());
  EXPECT_EQ(table.begin_transfer(id("db"), kA, kEpochMax, kB, kT0).refusal,
            Refusal::epoch_exhausted);
  EXPECT_EQ(table.revoke(id("db"), kT0).refusal, Refusal::epoch_exhausted);
  EXPECT_EQ(table.acquire("other", kA, kW1, kT0).refusal, Refusal::epoch_exhausted);
  ASSERT_TRUE(table.release(id("db"), kA, kEpochMax, kT0).ok());
  EXPECT_EQ(table.acquire("db", kA, kW1, kT0).refusal, Refusal::epoch_exhausted);
  EXPECT_EQ(table.epoch_high_water(), kEpochMax);
}

TEST_F(LeaseTableTest, EpochLimitIsTheShmLimitAndNoGrantGoesPastIt) {
  // 2^63-1: bit 63 of a shm check word is the revoked flag, so no larger epoch is publishable.
  static_assert(kEpochMax == (Epoch{1} << 63) - 1);
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("db"), name_fingerprint_of("db"), LockPhase::held,
                                       kEpochMax - 1, kA, {}, kW1, false});
  ASSERT_TRUE(table.restore(snap, kT0).ok());
  // The last epoch below the limit is still granted (a transfer begins at kEpochMax) ...
  const Outcome begun = table.begin_transfer(id("db"), kA, kEpochMax - 1, kB, kT0);
  ASSERT_TRUE(begun.ok()) << to_string(begun.refusal);
  EXPECT_EQ(begun.state.epoch, kEpochMax);
  // ... and nothing goes past it: a fresh name would need kEpochMax + 1.
  EXPECT_EQ(table.acquire("other", kA, kW1, kT0).refusal, Refusal::epoch_exhausted);
  EXPECT_EQ(table.epoch_high_water(), kEpochMax);
}

TEST_F(LeaseTableTest, RestoreRefusesAnEpochAboveTheLimit) {
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("db"), name_fingerprint_of("db"), LockPhase::held,
                                       kEpochMax + 1, kA, {}, kW1, false});
  EXPECT_NE(table.restore(snap, kT0).message().find("above the epoch limit"), std::string::npos);
  LeaseTable fresh(small_config(LockMode::lease));
  DurableSnapshot high;
  high.epoch_high_water = kEpochMax + 1;
  EXPECT_NE(fresh.restore(high, kT0).message().find("above the epoch limit"), std::string::npos);
  EXPECT_EQ(fresh.size(), 0u);
}

TEST_F(LeaseTableTest, RefusesNotHeld) {
  ASSERT_TRUE(table.reassign("db", kA, kT0).ok());
  EXPECT_EQ(table.release(id("db"), kA, 1, kT0).refusal, Refusal::not_held);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kB, kT0).refusal, Refusal::not_held);
  LeaseTable t(small_config(LockMode::preemptible));
  ASSERT_TRUE(t.reassign("db", kA, kT0).ok());
  EXPECT_EQ(t.preempt(id("db"), kA, 1, true, kT0).refusal, Refusal::not_held);
}

TEST_F(LeaseTableTest, RefusesExpiredBeforeAdvanceReclaimsIt) {
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
  const std::int64_t late = kT0 + 10 * kSecondNs;
  EXPECT_EQ(table.acquire("db", kA, kW1, late).refusal, Refusal::expired);
  EXPECT_EQ(table.acquire("db", kB, kW1, late).refusal, Refusal::expired);
  EXPECT_EQ(table.release(id("db"), kA, 1, late).refusal, Refusal::expired);
  EXPECT_EQ(table.begin_transfer(id("db"), kA, 1, kB, late).refusal, Refusal::expired);
  EXPECT_FALSE(table.token_authorized(Token{id("db"), 1, kA}, late));
}

// ---- configuration, restart, accounting ---------------------------------------------------

TEST(LeaseConfigTest, InvalidConfigIsRefusedWithTheField) {
  LeaseConfig c = small_config();
  c.default_ttl_ns = 0;
  EXPECT_NE(validate_config(c).message().find("default_ttl_ns is 0 ns"), std::string::npos);
  EXPECT_THROW(LeaseTable{c}, std::invalid_argument);
  c = small_config();
  c.default_ttl_ns = c.max_ttl_ns + 1;
  EXPECT_NE(validate_config(c).message().find("exceeds max_ttl_ns"), std::string::npos);
  c = small_config();
  c.capacity = kLeaseCapacityMax + 1;
  EXPECT_NE(validate_config(c).message().find("capacity"), std::string::npos);
  c = small_config();
  c.lock_delay_ns = -1;
  EXPECT_NE(validate_config(c).message().find("lock_delay_ns"), std::string::npos);
  EXPECT_TRUE(validate_config(small_config()).ok());
}

TEST_F(LeaseTableTest, RestoreCountsHeldLeasesAsRefreshedAtRestart) {
  ASSERT_TRUE(table.acquire("held", kA, kW1, kT0, 5 * kSecondNs).ok());
  ASSERT_TRUE(table.acquire_2pc("acq", kB, kT0).ok());
  ASSERT_TRUE(table.acquire("xfer", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.begin_transfer(id("xfer"), kA, 3, kC, kT0).ok());
  ASSERT_TRUE(table.reassign("resv", kC, kT0).ok());
  const DurableSnapshot snap = table.export_durable();
  EXPECT_EQ(snap.epoch_high_water, 5u);
  EXPECT_EQ(snap.records.size(), 3u);  // the Acquiring record is not durable

  const std::int64_t restart = kT0 + 3 * kSecondNs;
  LeaseTable r(small_config());
  ASSERT_TRUE(r.restore(snap, restart).ok());
  const LockState held = r.state(id("held"));
  EXPECT_EQ(held.phase, LockPhase::held);
  EXPECT_EQ(held.owner, kA);
  EXPECT_EQ(held.worker, kW1);
  EXPECT_EQ(held.epoch, 1u);
  EXPECT_EQ(held.expiry_ns, restart + 60 * kSecondNs);  // max TTL: never shortened
  EXPECT_TRUE(r.worker_alive(kW1, restart));
  EXPECT_EQ(r.state(id("acq")).known, false);
  EXPECT_EQ(r.state(id("xfer")).phase, LockPhase::transferring);
  EXPECT_EQ(r.state(id("xfer")).to, kC);
  EXPECT_EQ(r.state(id("xfer")).epoch, 4u);
  // Its guard is not durable: it waits a full TTL from the restart, or kW1's confirmation.
  EXPECT_TRUE(r.state(id("xfer")).revoke_pending);
  EXPECT_EQ(r.state(id("xfer")).revoked_worker, kW1);
  EXPECT_EQ(r.state(id("xfer")).lock_delay_until_ns, restart + 60 * kSecondNs);
  EXPECT_EQ(r.state(id("resv")).reserved_for, kC);
  // The burned Acquiring epoch (2) is not reused: epochs continue above the high-water mark.
  EXPECT_EQ(r.acquire_2pc("acq", kB, restart).token.epoch, 6u);
  // The restored lease expires on the restored table's timers.
  std::vector<Expiry> out;
  r.advance(restart + 60 * kSecondNs, out);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].name, id("acq"));  // the new 2-phase acquisition's deadline comes first
  EXPECT_EQ(out[1].name, id("resv"));  // the reservation's fresh TTL
  EXPECT_EQ(out[1].kind, ExpiryKind::reservation);
  EXPECT_EQ(out[1].deadline_ns, restart + 30 * kSecondNs);
  EXPECT_EQ(out[2].deadline_ns, restart + 60 * kSecondNs);  // the lease and the transfer guard
  EXPECT_EQ(out[3].deadline_ns, restart + 60 * kSecondNs);
  EXPECT_EQ((out[2].name == id("held") ? out[3] : out[2]).kind, ExpiryKind::revoke_bound);
}

TEST_F(LeaseTableTest, RestoreCapsALeaseAtWhatTheRestartRuleLeftIt) {
  ASSERT_TRUE(table.acquire("full", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.acquire("part", kB, kW2, kT0).ok());
  ASSERT_TRUE(table.acquire("gone", kC, kW2, kT0).ok());
  DurableSnapshot snap = table.export_durable();
  for (DurableRecord& r : snap.records) {
    if (r.name == id("part")) r.restore_left_ns = 2 * kSecondNs;
    if (r.name == id("gone")) r.restore_left_ns = 0;
    if (r.name == id("full")) r.restore_left_ns = 600 * kSecondNs;  // capped at the TTL
  }
  const std::int64_t restart = kT0 + kSecondNs;
  LeaseTable r(small_config());
  ASSERT_TRUE(r.restore(snap, restart).ok());
  EXPECT_EQ(r.state(id("full")).expiry_ns, restart + 60 * kSecondNs);
  EXPECT_EQ(r.state(id("part")).expiry_ns, restart + 2 * kSecondNs);
  EXPECT_EQ(r.state(id("gone")).expiry_ns, restart);
  EXPECT_FALSE(r.may_mutate(id("gone"), kC, 1, restart));
  std::vector<Expiry> out;
  r.advance(restart, out);  // the first tick frees the one the rule left nothing
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].name, id("gone"));
  r.advance(restart + 2 * kSecondNs, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].name, id("part"));
  EXPECT_EQ(r.state(id("full")).phase, LockPhase::held);
}

TEST(LeaseTablePreemptible, RestoreCapsWorkerLivenessAtWhatTheRestartRuleLeftIt) {
  LeaseConfig c;
  c.mode = LockMode::preemptible;
  c.worker_liveness_ttl_ns = 10 * kSecondNs;
  LeaseTable t(c);
  ASSERT_TRUE(t.acquire_2pc("p", kA, kT0).ok());
  ASSERT_TRUE(t.commit(name_id_of("p"), kA, 1, kW1, kT0).ok());
  DurableSnapshot snap = t.export_durable();
  ASSERT_EQ(snap.records.size(), 1u);
  snap.records[0].restore_left_ns = 3 * kSecondNs;
  LeaseTable r(c);
  ASSERT_TRUE(r.restore(snap, kT0 + kSecondNs).ok());
  EXPECT_TRUE(r.worker_alive(kW1, kT0 + 4 * kSecondNs - 1));
  EXPECT_FALSE(r.worker_alive(kW1, kT0 + 4 * kSecondNs));
  EXPECT_EQ(r.state(name_id_of("p")).expiry_ns, kNoExpiry);
}

// A lockd that restarted forgot every worker's liveness but that of workers with Held records.
// A worker that never beat this incarnation commits a name: the Commit is its liveness beat, so
// a competing acquire cannot preempt the name while the sandbox runs (found by the simulator,
// seed 99: an immediate preemption, two sandboxes passing their checks).
TEST(LeaseTablePreemptible, ACommitCountsAsItsWorkersLivenessBeat) {
  LeaseConfig c;
  c.mode = LockMode::preemptible;
  c.worker_liveness_ttl_ns = 10 * kSecondNs;
  LeaseTable t(c);
  EXPECT_FALSE(t.worker_alive(kW1, kT0));
  ASSERT_TRUE(t.acquire_2pc("p", kA, kT0, kW1).ok());
  EXPECT_FALSE(t.worker_alive(kW1, kT0));  // an Acquiring record is never preempted
  ASSERT_TRUE(t.commit(name_id_of("p"), kA, 1, kW1, kT0 + 1).ok());
  EXPECT_TRUE(t.worker_alive(kW1, kT0 + 10 * kSecondNs));
  EXPECT_FALSE(t.worker_alive(kW1, kT0 + 10 * kSecondNs + 1));
  const Outcome o = t.preempt(name_id_of("p"), kA, 1, false, kT0 + kSecondNs);
  EXPECT_EQ(o.refusal, Refusal::worker_alive);
  EXPECT_EQ(t.state(name_id_of("p")).phase, LockPhase::held);
}

TEST_F(LeaseTableTest, RestoreRefusesBadRecordsAndStaysEmpty) {
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("a"), name_fingerprint_of("a"), LockPhase::held, 3, kA,
                                       {}, kW1, false});
  snap.records.push_back(snap.records[0]);
  const Status twice = table.restore(snap, kT0);
  EXPECT_EQ(twice.code(), Errc::corrupt);
  EXPECT_NE(twice.message().find("appears twice"), std::string::npos) << twice.message();
  EXPECT_EQ(table.size(), 0u);
  snap.records.pop_back();
  snap.records[0].owner = SandboxId{};
  EXPECT_NE(table.restore(snap, kT0).message().find("nil owner"), std::string::npos);
  snap.records[0].owner = kA;
  snap.records[0].phase = static_cast<LockPhase>(9);
  EXPECT_NE(table.restore(snap, kT0).message().find("phase 9"), std::string::npos);
  EXPECT_EQ(table.size(), 0u);
  ASSERT_TRUE(table.acquire("x", kA, kW1, kT0).ok());
  snap.records[0].phase = LockPhase::held;
  const Status not_empty = table.restore(snap, kT0);
  EXPECT_EQ(not_empty.code(), Errc::invalid_argument);
  EXPECT_NE(not_empty.message().find("empty table"), std::string::npos) << not_empty.message();
}

// A snapshot cannot reach the grant path's asserts (an epoch in 1..2^63-1 entering Held, a
// record inserted only below the capacity, no name twice): restore refuses such records first,
// naming them, and leaves the table empty.
TEST_F(LeaseTableTest, RestoreRefusesEpochZeroAndMoreRecordsThanTheCapacity) {
  DurableSnapshot snap;
  snap.records.push_back(DurableRecord{id("a"), name_fingerprint_of("a"), LockPhase::held, 0, kA, {}, kW1, false});
  const Status zero = table.restore(snap, kT0);
  EXPECT_EQ(zero.code(), Errc::corrupt);
  EXPECT_NE(zero.message().find("durable record 0: epoch 0"), std::string::npos) << zero.message();
  EXPECT_EQ(table.size(), 0u);
  LeaseConfig c = small_config();
  c.capacity = 2;
  LeaseTable small(c);
  DurableSnapshot three;
  for (const char* n : {"a", "b", "c"})
    three.records.push_back(DurableRecord{id(n), name_fingerprint_of(n), LockPhase::held, 1, kA, {}, kW1, false});
  const Status full = small.restore(three, kT0);
  EXPECT_EQ(full.code(), Errc::corrupt);
  EXPECT_NE(full.message().find("durable record 2: more records than the capacity 2"), std::string::npos)
      << full.message();
  EXPECT_EQ(small.size(), 0u);
  three.records.pop_back();
  EXPECT_TRUE(small.restore(three, kT0).ok());
  EXPECT_EQ(small.size(), 2u);
}

TEST_F(LeaseTableTest, ForEachVisitsEveryRecord) {
  ASSERT_TRUE(table.acquire("a", kA, kW1, kT0).ok());
  ASSERT_TRUE(table.acquire_2pc("b", kB, kT0).ok());
  std::size_t n = 0, held = 0;
  table.for_each([&](NameId, const LockState& s) {
    ++n;
    held += s.phase == LockPhase::held;
  });
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(held, 1u);
  EXPECT_GE(table.memory_bytes(), 64u * 64u);
}

TEST(LockPhaseTest, TextIsStable) {
  EXPECT_EQ(to_string(LockPhase::transferring), "transferring");
  EXPECT_EQ(to_string(RefreshStatus::lost), "lost");
  EXPECT_EQ(to_string(Refusal::expired), "expired");
  EXPECT_EQ(to_string(Refusal::not_held), "not_held");
}

}  // namespace
}  // namespace leasehold
