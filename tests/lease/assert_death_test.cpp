// LEASEHOLD_ASSERT (lease/assert.hpp) and the invariants it guards in LeaseTable: each death
// test feeds the violation and expects the abort with file:line and the expression.
#include "leasehold/lease/assert.hpp"
#include "leasehold/lease/lease_table.hpp"

#include "tests/lease/lease_test_util.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace leasehold {
namespace {

using namespace leasehold::testing;

constexpr std::int64_t kT0 = 1000 * kSecondNs;

class AssertDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(AssertDeathTest, PrintsFileLineAndExpressionAndAborts) {
  const int two = 2;
  EXPECT_DEATH(LEASEHOLD_ASSERT(two + 2 == 5), "assert_death_test\\.cpp:[0-9]+: LEASEHOLD_ASSERT\\(two \\+ 2 == 5\\) failed");
  LEASEHOLD_ASSERT(two + 2 == 4);  // a holding invariant costs a compare and nothing else
}

TEST_F(AssertDeathTest, LeaseTableRefusesAClockThatGoesBackwards) {
  LeaseTable table(small_config());
  ASSERT_TRUE(table.acquire("db", kA, kW1, kT0 + kSecondNs).ok());
  // The same instant again is fine (two operations in one tick) ...
  ASSERT_TRUE(table.acquire("other", kA, kW1, kT0 + kSecondNs).ok());
  const Token t{name_id_of("db"), 1, kA};
  // ... one ns earlier is a clock going backwards, in every mutating call.
  EXPECT_DEATH(table.release(t.name, kA, 1, kT0 + kSecondNs - 1), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns\\) failed");
  std::vector<Expiry> out;
  EXPECT_DEATH(table.advance(kT0, out), "LEASEHOLD_ASSERT\\(now_ns >= last_now_ns\\) failed");
  const RefreshEntry e{t.name, kA, 1};
  std::vector<RefreshAnswer> answers(1);
  EXPECT_DEATH(table.refresh(kW1, std::span(&e, 1), kT0, answers), "now_ns >= last_now_ns");
  // The parent's table is untouched by the children's aborts.
  EXPECT_TRUE(table.release(t.name, kA, 1, kT0 + 2 * kSecondNs).ok());
}

TEST_F(AssertDeathTest, RestoreStartsTheClockAtTheRestartTime) {
  LeaseTable table(small_config());
  ASSERT_TRUE(table.restore(DurableSnapshot{}, kT0).ok());
  EXPECT_DEATH(table.acquire("db", kA, kW1, kT0 - 1), "now_ns >= last_now_ns");
  EXPECT_TRUE(table.acquire("db", kA, kW1, kT0).ok());
}

}  // namespace
}  // namespace leasehold
