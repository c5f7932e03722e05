// The Clock port's production implementation: CLOCK_BOOTTIME, and an abort rather than a
// reading that went backwards.
#include "leasehold/io/clock.hpp"

#include <gtest/gtest.h>

namespace leasehold {
namespace {

TEST(BootClock, ReadsCLOCK_BOOTTIMEAndNeverDecreases) {
  BootClock c;
  const std::int64_t before = boottime_ns();
  std::int64_t last = c.now_ns();
  EXPECT_GE(last, before);
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t t = c.now_ns();
    EXPECT_GE(t, last);
    last = t;
  }
  EXPECT_LE(last, boottime_ns());
}

TEST(BootClockDeathTest, AbortsWhenAReadingIsBelowThePreviousOne) {
  BootClock c;
  // The previous reading an hour ahead of the clock: the next real reading is below it.
  c.set_floor_for_test(boottime_ns() + 3'600 * kNsPerS);
  // Both readings, then the invariant that broke (LEASEHOLD_ASSERT: file:line and the expression).
  EXPECT_DEATH(c.now_ns(), "CLOCK_BOOTTIME went backwards: read [0-9]+ ns after [0-9]+ ns(.|\n)*"
                           "clock.hpp:[0-9]+: LEASEHOLD_ASSERT\\(t >= last_ns_\\) failed");
}

}  // namespace
}  // namespace leasehold
