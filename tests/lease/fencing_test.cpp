// The headline fencing scenario (issue 2; ownership model "Capability tokens"): A holds a name
// at epoch 41; B takes over at 42 - by transfer, by revoke and by expiry; A comes back with
// its epoch-41 token: token_authorized is false, the FenceGate rejects it, B's writes pass.
#include "leasehold/lease/fence.hpp"
#include "leasehold/lease/lease_table.hpp"

#include "tests/lease/lease_test_util.hpp"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

using namespace leasehold::testing;

constexpr std::int64_t kT0 = 5000 * kSecondNs;
const NameId kName = name_id_of("orders-db");

// A table where "orders-db" had 40 earlier grants and A now holds it at 41.
Token a_holds_at_41(LeaseTable& t, FenceGate& gate) {
  for (Epoch e = 1; e <= 40; ++e) {
    const Outcome o = t.acquire("orders-db", kC, kW2, kT0);
    EXPECT_TRUE(o.ok());
    EXPECT_EQ(o.token.epoch, e);
    EXPECT_TRUE(t.release(kName, kC, e, kT0).ok());
  }
  const Outcome a = t.acquire("orders-db", kA, kW1, kT0);
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(a.token, (Token{kName, 41, kA}));
  EXPECT_TRUE(gate.admit(a.token).accepted());  // A wrote while it held the name
  return a.token;
}

void expect_b_fences_a(LeaseTable& t, FenceGate& gate, const Token& a, const Token& b,
                       std::int64_t now_ns) {
  EXPECT_EQ(b, (Token{kName, 42, kB}));
  EXPECT_TRUE(t.token_authorized(b, now_ns));
  EXPECT_FALSE(t.token_authorized(a, now_ns));
  EXPECT_FALSE(t.may_mutate(kName, kA, 41, now_ns));
  EXPECT_FALSE(t.valid_fence(kName, 41));
  EXPECT_TRUE(t.valid_fence(kName, 42));
  // B's first write raises the fence; A's late write is rejected; B keeps writing.
  EXPECT_TRUE(gate.admit(b).accepted());
  const FenceGate::Admission stale = gate.admit(a);
  EXPECT_EQ(stale.verdict, FenceGate::Verdict::stale);
  EXPECT_EQ(stale.highest, 42u);
  EXPECT_TRUE(gate.admit(b).accepted());
  EXPECT_EQ(gate.highest(kName), 42u);
}

TEST(Fencing, TakeoverByTransfer) {
  LeaseTable t(small_config());
  FenceGate gate;
  const Token a = a_holds_at_41(t, gate);
  ASSERT_TRUE(t.begin_transfer(kName, kA, 41, kB, kT0).ok());
  EXPECT_FALSE(t.token_authorized(a, kT0));  // fenced from the moment the transfer begins
  ASSERT_TRUE(t.confirm_kill(kName, kW1, 41, kT0).ok());  // A's worker saw it die
  ASSERT_TRUE(t.complete_release(kName, kA, 42, kT0).ok());
  const Outcome b = t.acquire("orders-db", kB, kW2, kT0);
  ASSERT_TRUE(b.ok());
  expect_b_fences_a(t, gate, a, b.token, kT0);
}

TEST(Fencing, TakeoverByRevoke) {
  LeaseTable t(small_config());
  FenceGate gate;
  const Token a = a_holds_at_41(t, gate);
  ASSERT_TRUE(t.revoke(kName, kT0).ok());  // A is not asked
  EXPECT_FALSE(t.token_authorized(a, kT0));  // fenced at once
  // A's worker confirms the kill: grantable (without it, after A's lease would have expired).
  ASSERT_TRUE(t.confirm_kill(kName, kW1, 41, kT0).ok());
  const Outcome b = t.acquire("orders-db", kB, kW2, kT0 + 1);
  ASSERT_TRUE(b.ok());
  expect_b_fences_a(t, gate, a, b.token, kT0 + 1);
}

TEST(Fencing, TakeoverByExpiry) {
  LeaseTable t(small_config());
  FenceGate gate;
  const Token a = a_holds_at_41(t, gate);
  const std::int64_t later = kT0 + 10 * kSecondNs;
  std::vector<Expiry> out;
  ASSERT_EQ(t.advance(later, out), 1u);
  EXPECT_EQ(out[0].epoch, 41u);
  const Outcome b = t.acquire("orders-db", kB, kW2, later);
  ASSERT_TRUE(b.ok());
  expect_b_fences_a(t, gate, a, b.token, later);
}

TEST(Fencing, PredicatesFollowTheOwnershipModel) {
  LockState held;
  held.phase = LockPhase::held;
  held.owner = kA;
  held.epoch = 41;
  held.expiry_ns = 100;
  EXPECT_TRUE(may_mutate(held, kA, 41));
  EXPECT_FALSE(may_mutate(held, kA, 40));
  EXPECT_FALSE(may_mutate(held, kB, 41));
  EXPECT_TRUE(may_mutate(held, kA, 41, 99));
  EXPECT_FALSE(may_mutate(held, kA, 41, 100));
  EXPECT_TRUE(valid_fence(held, 41));
  EXPECT_TRUE(valid_fence(held, 42));
  EXPECT_FALSE(valid_fence(held, 40));
  LockState xfer;
  xfer.phase = LockPhase::transferring;
  xfer.owner = kA;
  xfer.to = kB;
  xfer.old_epoch = 41;
  xfer.epoch = 42;
  EXPECT_FALSE(may_mutate(xfer, kA, 41));
  EXPECT_FALSE(may_mutate(xfer, kB, 42));
  EXPECT_FALSE(valid_fence(xfer, 41));  // current epoch of a transfer is the new one
  EXPECT_FALSE(token_authorized(xfer, Token{kName, 41, kA}));
}

TEST(FenceGate, RejectsLowerEpochsPerName) {
  FenceGate gate;
  const NameId other = name_id_of("other");
  EXPECT_TRUE(gate.admit(kName, 5).accepted());
  EXPECT_TRUE(gate.admit(kName, 5).accepted());  // the same grant keeps writing
  EXPECT_EQ(gate.admit(kName, 4).verdict, FenceGate::Verdict::stale);
  EXPECT_TRUE(gate.admit(other, 1).accepted());  // names are independent
  EXPECT_EQ(gate.highest(kName), 5u);
  EXPECT_EQ(gate.highest(name_id_of("never")), 0u);
  EXPECT_EQ(gate.size(), 2u);
}

TEST(FenceGate, RefusesInvalidAndBoundsItsSize) {
  FenceGate gate(2);
  EXPECT_EQ(gate.admit(kName, 0).verdict, FenceGate::Verdict::invalid);
  EXPECT_EQ(gate.admit(NameId{}, 3).verdict, FenceGate::Verdict::invalid);
  EXPECT_TRUE(gate.admit(name_id_of("a"), 1).accepted());
  EXPECT_TRUE(gate.admit(name_id_of("b"), 1).accepted());
  EXPECT_EQ(gate.admit(name_id_of("c"), 1).verdict, FenceGate::Verdict::full);
  EXPECT_TRUE(gate.admit(name_id_of("a"), 2).accepted());  // known names still work
  EXPECT_EQ(gate.size(), 2u);
  EXPECT_EQ(to_string(FenceGate::Verdict::stale), "stale");
}

}  // namespace
}  // namespace leasehold
