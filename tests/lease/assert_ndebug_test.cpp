// LEASEHOLD_ASSERT stays on in a release build (NDEBUG defined, as RelWithDebInfo does), and
// LEASEHOLD_ASSERT_SLOW is off there unless the build asks for slow assertions.
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include "leasehold/lease/assert.hpp"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

TEST(AssertNdebugDeathTest, LeaseholdAssertIsOnUnderNdebug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  volatile int epoch = 3;
  EXPECT_DEATH(LEASEHOLD_ASSERT(epoch > 4), "assert_ndebug_test\\.cpp:[0-9]+: LEASEHOLD_ASSERT\\(epoch > 4\\) failed");
}

TEST(AssertNdebug, SlowAssertIsOffUnderNdebug) {
#if LEASEHOLD_SLOW_ASSERTS
  GTEST_SKIP() << "this build turns slow assertions on (LEASEHOLD_SLOW_ASSERTS)";
#else
  int evaluated = 0;
  LEASEHOLD_ASSERT_SLOW(++evaluated == 100);  // neither evaluated nor aborting
  EXPECT_EQ(evaluated, 0);
#endif
}

// After enable_slow_asserts() (the simulator calls it) code compiled under NDEBUG checks its
// slow invariants too. Last in this file: it turns them on for the rest of the process.
TEST(AssertNdebugDeathTest, SlowAssertRunsAfterEnableSlowAsserts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  enable_slow_asserts();
  int evaluated = 0;
  LEASEHOLD_ASSERT_SLOW(++evaluated == 1);
  EXPECT_EQ(evaluated, 1);
  EXPECT_DEATH(LEASEHOLD_ASSERT_SLOW(evaluated == 2), "LEASEHOLD_ASSERT\\(evaluated == 2\\) failed");
}

}  // namespace
}  // namespace leasehold
