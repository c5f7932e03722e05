// Each invariant of sim/invariants.hpp fires on a hand-made violating history and stays quiet
// on the matching good one.
#include "leasehold/sim/invariants.hpp"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace leasehold::sim {
namespace {

const NameId kName{1, 1};
const NameId kOther{2, 2};
const SandboxId kA{10, 1};
const SandboxId kB{11, 2};

TEST(SimInvariants, SingleHolderFiresOnTwoSandboxesPassingForOneName) {
  Invariants inv;
  const std::vector<Passing> ok{{kName, kA, 3, 0}, {kOther, kB, 4, 1}};
  EXPECT_FALSE(inv.single_holder(ok, 100));
  const std::vector<Passing> bad{{kName, kA, 3, 0}, {kName, kB, 4, 1}};
  const auto v = inv.single_holder(bad, 200);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->invariant, "single_holder");
  EXPECT_EQ(v->at_ns, 200);
  EXPECT_NE(v->detail.find(kB.str()), std::string::npos) << v->detail;
}

TEST(SimInvariants, SingleHolderToleratesAnOverlapOnlyUntilTheRecoveryBound) {
  Invariants inv;
  const std::vector<Passing> bad{{kName, kA, 3, 0}, {kName, kB, 4, 1}};
  const std::vector<std::int64_t> worker1_paused{0, 500};  // worker 1 (kB's) paused past its budget
  EXPECT_FALSE(inv.single_holder(bad, 100, worker1_paused));
  EXPECT_FALSE(inv.single_holder(bad, 499, worker1_paused));
  const auto v = inv.single_holder(bad, 500, worker1_paused);
  ASSERT_TRUE(v);
  EXPECT_NE(v->detail.find("recovery bound"), std::string::npos) << v->detail;
}

TEST(SimInvariants, APauseExcusesOnlyOverlapsWithASandboxOfThePausedWorker) {
  Invariants inv;
  const std::vector<Passing> bad{{kName, kA, 3, 0}, {kName, kB, 4, 1}};
  const std::vector<std::int64_t> worker2_paused{0, 0, 500};
  const auto v = inv.single_holder(bad, 100, worker2_paused);
  ASSERT_TRUE(v);  // workers 0 and 1 overlap; worker 2's pause excuses neither
  EXPECT_EQ(v->invariant, "single_holder");
}

TEST(SimInvariants, KillBeforeExpiryFiresUnlessTheSandboxIsDead) {
  Invariants inv;
  SandboxFate running{true, false, 0, false, 0, true};
  const auto v = inv.kill_before_expiry(kName, 5, kA, running, 1000);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->invariant, "kill_before_expiry");
  // A kill after the expiry is as bad as none.
  SandboxFate late{true, false, 0, true, 1001, true};
  EXPECT_TRUE(inv.kill_before_expiry(kName, 5, kA, late, 1000));
  // Killed but not yet dead: the kill has not landed.
  SandboxFate killed{true, false, 0, true, 999, true};
  const auto not_dead = inv.kill_before_expiry(kName, 5, kA, killed, 1000);
  ASSERT_TRUE(not_dead);
  EXPECT_NE(not_dead->detail.find("not yet dead"), std::string::npos) << not_dead->detail;
  // Dead (killed or exited by itself) before the expiry, or excused by an over-budget pause: fine.
  SandboxFate died{true, true, 990, true, 980, true};
  EXPECT_FALSE(inv.kill_before_expiry(kName, 5, kA, died, 1000));
  // Never passed its check (stopped before its epoch was published): it could not act.
  SandboxFate unpublished{true, false, 0, true, 999, false};
  EXPECT_FALSE(inv.kill_before_expiry(kName, 5, kA, unpublished, 1000));
  SandboxFate died_again{true, true, 990, true, 980, true};
  EXPECT_FALSE(inv.kill_before_expiry(kName, 5, kA, died_again, 1000));
  SandboxFate exited{true, true, 900, false, 0, true};
  EXPECT_FALSE(inv.kill_before_expiry(kName, 5, kA, exited, 1000));
  // Dead only after the grant's end (its lease's deadline, before lockd noticed the expiry).
  SandboxFate dead_late{true, true, 1002, true, 995, true};
  const auto after = inv.kill_before_expiry(kName, 5, kA, dead_late, 1000);
  ASSERT_TRUE(after);
  EXPECT_NE(after->detail.find("dead only at 1002"), std::string::npos) << after->detail;
  EXPECT_FALSE(inv.kill_before_expiry(kName, 5, kA, running, 1000, /*excused=*/true));
}

TEST(SimInvariants, CurrentGrantFiresOnAPassingSandboxLockdDoesNotHaveAsHolder) {
  Invariants inv;
  const Passing p[] = {Passing{kName, kA, 5, 0}};
  auto held_by = [](SandboxId owner, Epoch e) {
    return [owner, e](NameId) { return RestoredName{true, owner, e}; };
  };
  EXPECT_FALSE(inv.current_grant(std::span<const Passing>(p), held_by(kA, 5), 1000));
  const auto other = inv.current_grant(std::span<const Passing>(p), held_by(kB, 6), 1000);
  ASSERT_TRUE(other);
  EXPECT_EQ(other->invariant, "current_grant");
  const auto free = inv.current_grant(std::span<const Passing>(p), [](NameId) { return RestoredName{}; }, 1000);
  ASSERT_TRUE(free);
  EXPECT_NE(free->detail.find("not held"), std::string::npos) << free->detail;
  // An older epoch of the same sandbox is not the current grant either.
  EXPECT_TRUE(inv.current_grant(std::span<const Passing>(p), held_by(kA, 6), 1000));
  // Excused by an over-budget pause of its own worker until the recovery bound, not of another.
  const std::vector<std::int64_t> worker0_paused{2000}, worker1_paused{0, 2000};
  EXPECT_FALSE(inv.current_grant(std::span<const Passing>(p), held_by(kB, 6), 1000, worker0_paused));
  EXPECT_TRUE(inv.current_grant(std::span<const Passing>(p), held_by(kB, 6), 1000, worker1_paused));
  EXPECT_TRUE(inv.current_grant(std::span<const Passing>(p), held_by(kB, 6), 2000, worker0_paused));
}

TEST(SimInvariants, EpochMonotoneFiresOnAnEpochThatDoesNotGrow) {
  Invariants inv;
  EXPECT_FALSE(inv.epoch_monotone(kName, 3, kA, 10));
  EXPECT_FALSE(inv.epoch_monotone(kName, 3, kA, 20));  // the same grant again (a cached answer)
  EXPECT_FALSE(inv.epoch_monotone(kName, 5, kB, 30));
  EXPECT_FALSE(inv.epoch_monotone(kName, 3, kA, 40));  // a late repeat of the old grant
  const auto regress = inv.epoch_monotone(kName, 4, kA, 50);
  ASSERT_TRUE(regress);
  EXPECT_EQ(regress->invariant, "epoch_monotone");
  const auto reused = inv.epoch_monotone(kName, 5, kA, 60);  // epoch 5 went to kB
  ASSERT_TRUE(reused);
  EXPECT_NE(reused->detail.find(kB.str()), std::string::npos);
}

TEST(SimInvariants, ResourceFencedFiresOnAStaleAcceptAndOnAnUngrantedEpoch) {
  Invariants inv;
  ASSERT_FALSE(inv.epoch_monotone(kName, 2, kA, 0));
  ASSERT_FALSE(inv.epoch_monotone(kName, 3, kB, 0));
  EXPECT_FALSE(inv.resource_fenced({10, kName, 2, kA, true, 2}));
  EXPECT_FALSE(inv.resource_fenced({20, kName, 3, kB, true, 3}));
  EXPECT_FALSE(inv.resource_fenced({30, kName, 2, kA, false, 3}));  // stale, rejected
  const auto stale = inv.resource_fenced({40, kName, 2, kA, true, 3});
  ASSERT_TRUE(stale);
  EXPECT_EQ(stale->invariant, "resource_fenced");
  Invariants other;
  ASSERT_FALSE(other.epoch_monotone(kName, 2, kA, 0));
  const auto forged = other.resource_fenced({10, kName, 2, kB, true, 2});  // epoch 2 is kA's
  ASSERT_TRUE(forged);
  EXPECT_NE(forged->detail.find(kA.str()), std::string::npos);
}

TEST(SimInvariants, NoLostGrantFiresWhenTheRestartedTableLacksAnAcknowledgedGrant) {
  Invariants inv;
  const std::vector<Invariants::AckedGrant> current{{kName, 7, kA}};
  EXPECT_FALSE(inv.no_lost_grant(current, [](NameId) { return RestoredName{true, kA, 7}; }, 100));
  const auto v = inv.no_lost_grant(current, [](NameId) { return RestoredName{false, {}, 6}; }, 100);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->invariant, "no_lost_grant");
  EXPECT_TRUE(inv.no_lost_grant(current, [](NameId) { return RestoredName{true, kB, 7}; }, 100));
}

// A waiter's grant from lockd's FIFO (Acquiring) told epoch 9; a restart that rebuilt the name
// at epoch 8 could tell 9 to another sandbox. At 9 or above (a 2-phase grant is dropped at a
// restart, its epoch kept) it holds.
TEST(SimInvariants, EpochDurableFiresWhenTheRebuiltTableIsBelowAnEpochLockdTold) {
  Invariants inv;
  const std::map<NameId, Epoch> told{{kName, 9}, {kOther, 4}};
  EXPECT_FALSE(inv.epoch_durable(told, [](NameId) { return Epoch{9}; }, 100));
  EXPECT_FALSE(inv.epoch_durable(told, [](NameId n) { return n == kName ? Epoch{12} : Epoch{4}; }, 100));
  const auto v = inv.epoch_durable(told, [](NameId n) { return n == kName ? Epoch{8} : Epoch{4}; }, 100);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->invariant, "epoch_durable");
  EXPECT_EQ(v->at_ns, 100);
  EXPECT_NE(v->detail.find("epoch 9"), std::string::npos) << v->detail;
  EXPECT_NE(v->detail.find("at epoch 8"), std::string::npos) << v->detail;
}

// A 2-phase grant counts like a Held one: its epoch told to a second sandbox is a violation.
TEST(SimInvariants, EpochMonotoneCountsTheEpochOfATwoPhaseGrant) {
  Invariants inv;
  EXPECT_FALSE(inv.epoch_monotone(kName, 9, kA, 10));   // Acquiring, from the FIFO
  EXPECT_FALSE(inv.epoch_monotone(kName, 9, kA, 20));   // its Commit's Held answer
  const auto v = inv.epoch_monotone(kName, 9, kB, 30);  // after a restart forgot it
  ASSERT_TRUE(v);
  EXPECT_EQ(v->invariant, "epoch_monotone");
}

TEST(SimInvariants, FreeNameAcquiredFiresWhenNoGrantFollowsTheHealWithinTheBound) {
  Invariants inv;
  EXPECT_FALSE(inv.free_name_acquired(kName, 95 * kS, 90 * kS, 20 * kS, 120 * kS));
  EXPECT_FALSE(inv.free_name_acquired(kName, -1, 90 * kS, 40 * kS, 120 * kS));  // run too short to tell
  const auto never = inv.free_name_acquired(kName, -1, 90 * kS, 20 * kS, 120 * kS);
  ASSERT_TRUE(never);
  EXPECT_EQ(never->invariant, "free_name_acquired");
  EXPECT_TRUE(inv.free_name_acquired(kName, 115 * kS, 90 * kS, 20 * kS, 120 * kS));
}

}  // namespace
}  // namespace leasehold::sim
