// Tests of the supervisor's sandbox table (supervisor/sandbox_table.hpp): a sandbox is found by
// id, slot and name; erasing it empties its slot and unbinds its names; a change that would make
// the indexes disagree aborts.
#include "leasehold/supervisor/sandbox_table.hpp"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

Sandbox sandbox(std::uint64_t n, std::uint32_t slot) {
  Sandbox s;
  s.id = SandboxId{0x5a, n};
  s.slot = slot;
  return s;
}

SandboxId id(std::uint64_t n) { return SandboxId{0x5a, n}; }

// Two sandboxes: 1 in slot 1 with the names `first` and `second`, 2 in slot 0 with `other`.
SandboxTable two_sandboxes(const char* first, const char* second, const char* other) {
  SandboxTable t(2);
  t.add(sandbox(1, 1));
  t.add(sandbox(2, 0));
  t.bind_name(first, id(1));
  t.bind_name(second, id(1));
  t.bind_name(other, id(2));
  return t;
}

TEST(SandboxTable, FindsASandboxByIdSlotAndName) {
  SandboxTable t(4);
  Sandbox& a = t.add(sandbox(1, 2));
  t.add(sandbox(2, 0));
  t.bind_name("agent-1", a.id);
  EXPECT_EQ(t.size(), 2u);
  ASSERT_NE(t.find(id(1)), nullptr);
  EXPECT_EQ(t.find(id(1))->slot, 2u);
  ASSERT_NE(t.at_slot(2), nullptr);
  EXPECT_EQ(t.at_slot(2)->id, id(1));
  EXPECT_EQ(t.at_slot(0)->id, id(2));
  EXPECT_EQ(t.at_slot(1), nullptr);
  EXPECT_EQ(t.at_slot(4), nullptr);  // out of range: none
  ASSERT_NE(t.holder_of("agent-1"), nullptr);
  EXPECT_EQ(*t.holder_of("agent-1"), id(1));
  EXPECT_EQ(t.holder_of("agent-2"), nullptr);
  t.check();
}

TEST(SandboxTable, EraseEmptiesTheSlotAndUnbindsEveryNameOfIt) {
  SandboxTable t = two_sandboxes("a", "b", "c");
  t.erase(id(1));
  EXPECT_EQ(t.find(id(1)), nullptr);
  EXPECT_EQ(t.at_slot(1), nullptr);
  EXPECT_EQ(t.holder_of("a"), nullptr);
  EXPECT_EQ(t.holder_of("b"), nullptr);
  ASSERT_NE(t.holder_of("c"), nullptr);
  EXPECT_EQ(t.names().size(), 1u);
  // The slot is free for another sandbox.
  t.add(sandbox(3, 1));
  EXPECT_EQ(t.at_slot(1)->id, id(3));
  t.erase(id(9));  // absent: nothing changes
  EXPECT_EQ(t.size(), 2u);
  t.check();
}

TEST(SandboxTable, UnbindingKeepsTheHeldNameAndOnlyTheOwnersNames) {
  SandboxTable t = two_sandboxes("held", "acquiring", "other");
  t.unbind_name("other", id(1));  // not its name: stays
  ASSERT_NE(t.holder_of("other"), nullptr);
  t.unbind_names_except(id(1), std::string("held"));
  EXPECT_NE(t.holder_of("held"), nullptr);
  EXPECT_EQ(t.holder_of("acquiring"), nullptr);
  EXPECT_NE(t.holder_of("other"), nullptr);
  t.unbind_names_except(id(1), std::nullopt);
  EXPECT_EQ(t.holder_of("held"), nullptr);
  EXPECT_EQ(t.names().size(), 1u);
}

TEST(SandboxTableDeathTest, ATakenSlotOrAReusedIdAborts) {
  SandboxTable t(2);
  t.add(sandbox(1, 1));
  EXPECT_DEATH(t.add(sandbox(2, 1)), "LEASEHOLD_ASSERT\\(by_slot_\\[s.slot\\].is_nil\\(\\)\\) failed");
  EXPECT_DEATH(t.add(sandbox(1, 0)), "LEASEHOLD_ASSERT\\(added\\) failed");
}

TEST(SandboxTableDeathTest, ASlotOutOfRangeAborts) {
  SandboxTable t(2);
  EXPECT_DEATH(t.add(sandbox(1, 2)), "LEASEHOLD_ASSERT\\(s.slot < by_slot_.size\\(\\)\\) failed");
}

TEST(SandboxTableDeathTest, ANameBoundToTwoSandboxesAborts) {
  SandboxTable t(2);
  t.add(sandbox(1, 0));
  t.add(sandbox(2, 1));
  t.bind_name("agent", id(1));
  t.bind_name("agent", id(1));  // the same binding again is fine
  EXPECT_DEATH(t.bind_name("agent", id(2)), "LEASEHOLD_ASSERT\\(added \\|\\| it->second == id\\) failed");
}

TEST(SandboxTableDeathTest, ANameOfAnAbsentSandboxAborts) {
  SandboxTable t(2);
  EXPECT_DEATH(t.bind_name("agent", id(7)), "LEASEHOLD_ASSERT\\(sandboxes_.contains\\(id\\)\\) failed");
}

// The O(1) cross-check with the shm table's owner of a slot (SupervisorCore runs it wherever a
// slot is bound to a sandbox or let go): the slot names the same sandbox in both, and that
// sandbox's record names the slot; a sandbox that left while shm keeps its slot claimed
// (quarantined, kept) is named by shm and by nobody here.
TEST(SandboxTable, CheckSlotAcceptsTablesThatAgree) {
  SandboxTable t(3);
  t.add(sandbox(1, 1));
  t.check_slot(1, id(1));
  t.check_slot(0, SandboxId{});
  t.check_slot(2, SandboxId{});
  t.erase(id(1));
  t.check_slot(1, SandboxId{});    // freed in both
  t.check_slot(1, id(1), id(1));   // or still claimed in shm for the one that left
}

TEST(SandboxTableDeathTest, ASlotTheShmTableGivesAnotherOwnerAborts) {
  SandboxTable t(3);
  t.add(sandbox(1, 1));
  constexpr const char* kDisagree = "LEASEHOLD_ASSERT\\(by_slot_\\[slot\\] == shm_owner\\) failed";
  EXPECT_DEATH(t.check_slot(1, id(2)), kDisagree);       // shm: another sandbox
  EXPECT_DEATH(t.check_slot(1, SandboxId{}), kDisagree);  // shm: free, here taken
  EXPECT_DEATH(t.check_slot(0, id(1)), kDisagree);       // shm: taken, here free
  EXPECT_DEATH(t.check_slot(3, SandboxId{}), "LEASEHOLD_ASSERT\\(slot < by_slot_.size\\(\\)\\) failed");
  // Said to have left, but still here.
  EXPECT_DEATH(t.check_slot(1, id(1), id(1)), "LEASEHOLD_ASSERT\\(by_slot_\\[slot\\].is_nil\\(\\)\\) failed");
  t.erase(id(1));
  // Left with its slot kept in shm, but shm freed it (or gave it to another).
  EXPECT_DEATH(t.check_slot(1, SandboxId{}, id(1)), "LEASEHOLD_ASSERT\\(shm_owner == left\\) failed");
  EXPECT_DEATH(t.check_slot(1, id(2), id(1)), "LEASEHOLD_ASSERT\\(shm_owner == left\\) failed");
}

// A record whose slot field no longer matches the slot index (the record is the caller's to
// change): every lookup through the index aborts rather than act for the wrong sandbox.
TEST(SandboxTableDeathTest, ARecordNamingAnotherSlotAborts) {
  SandboxTable t(3);
  Sandbox& a = t.add(sandbox(1, 1));
  a.slot = 2;
  EXPECT_DEATH(t.check_slot(1, id(1)),
               "LEASEHOLD_ASSERT\\(it != sandboxes_.end\\(\\) && it->second.slot == slot\\) failed");
  EXPECT_DEATH((void)t.at_slot(1), "LEASEHOLD_ASSERT\\(s != nullptr && s->slot == slot\\) failed");
  EXPECT_DEATH(t.erase(id(1)), "LEASEHOLD_ASSERT\\(by_slot_\\[it->second.slot\\] == id\\) failed");
  EXPECT_DEATH(t.check(), "LEASEHOLD_ASSERT\\(s.slot < by_slot_.size\\(\\) && by_slot_\\[s.slot\\] == id\\) failed");
  a.slot = 1;  // back in agreement
  t.check();
  t.erase(id(1));
  EXPECT_EQ(t.size(), 0u);
}

TEST(SandboxTableDeathTest, ARecordWhoseIdChangedAborts) {
  SandboxTable t(2);
  Sandbox& a = t.add(sandbox(1, 0));
  a.id = id(9);
  EXPECT_DEATH(t.check(), "LEASEHOLD_ASSERT\\(s.id == id\\) failed");
  a.id = id(1);
  t.check();
}

}  // namespace
}  // namespace leasehold
