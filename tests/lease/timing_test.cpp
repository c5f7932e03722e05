// The safety inequality, the pause budget and the kill deadline (lease/timing.hpp, DESIGN.md
// "Time"): integer ns, every rounding toward safety, the boundary one ns either side.
#include "leasehold/lease/timing.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace leasehold::timing {
namespace {

constexpr std::int64_t kMs = 1'000'000;

Inputs inputs(std::int64_t ttl_ns, std::int64_t kill_after_ns, std::int64_t granularity_ns,
              std::int64_t kill_budget_ns, std::int64_t rho_ppb) {
  Inputs in;
  in.ttl_ns = ttl_ns;
  in.kill_after_ns = kill_after_ns;
  in.wheel_granularity_ns = granularity_ns;
  in.kill_latency_budget_ns = kill_budget_ns;
  in.rho_ppb = rho_ppb;
  return in;
}

TEST(Timing, BoundaryWithoutDriftIsStrict) {
  // ρ = 0: safe iff kill_after + granularity + kill budget < ttl.
  const std::int64_t ttl = 1000 * kMs;
  const Safety below = check_safety(inputs(ttl, 600 * kMs, kMs, ttl - 601 * kMs - 1, 0));
  EXPECT_TRUE(below.safe);
  EXPECT_EQ(below.left_ns, ttl - 1);
  EXPECT_EQ(below.right_ns, ttl);
  EXPECT_EQ(below.pause_budget_ns, 1);
  const Safety at = check_safety(inputs(ttl, 600 * kMs, kMs, ttl - 601 * kMs, 0));
  EXPECT_FALSE(at.safe);
  EXPECT_EQ(at.pause_budget_ns, 0);
  const Safety above = check_safety(inputs(ttl, 600 * kMs, kMs, ttl - 601 * kMs + 1, 0));
  EXPECT_FALSE(above.safe);
  EXPECT_EQ(above.pause_budget_ns, -1);
}

TEST(Timing, BoundaryWithDrift) {
  // ρ = 1e-3: ttl·(1−ρ) = 9'990'000'000, kill_after·(1+ρ) = 7'007'000'000 (DESIGN.md's example).
  const std::int64_t rho = rho_ppb_of(1e-3);
  ASSERT_EQ(rho, 1'000'000);
  const std::int64_t ttl = 10'000 * kMs, kill_after = 7'000 * kMs, g = kMs;
  const std::int64_t room = 9'990'000'000 - 7'007'000'000 - g;  // kill budget that reaches the limit
  const Safety below = check_safety(inputs(ttl, kill_after, g, room - 1, rho));
  EXPECT_TRUE(below.safe);
  EXPECT_EQ(below.right_ns, 9'990'000'000);
  EXPECT_EQ(below.left_ns, 9'989'999'999);
  EXPECT_FALSE(check_safety(inputs(ttl, kill_after, g, room, rho)).safe);
  // The budget is ttl − left (the right side's ρ is not subtracted: DESIGN.md's definition).
  EXPECT_EQ(check_safety(inputs(ttl, kill_after, g, 50 * kMs, rho)).pause_budget_ns,
            10'000'000'000 - 7'007'000'000 - g - 50 * kMs);
}

TEST(Timing, RoundsTowardSafety) {
  // ρ rounds up to the next ppb; a half ppb is one ppb, not zero.
  EXPECT_EQ(rho_ppb_of(0.5e-9), 1);
  EXPECT_EQ(rho_ppb_of(1.5e-9), 2);
  EXPECT_EQ(rho_ppb_of(0.0), 0);
  EXPECT_EQ(rho_ppb_of(-1.0), 0);
  EXPECT_EQ(rho_ppb_of(std::numeric_limits<double>::quiet_NaN()), 0);
  // kill_after·(1+ρ) rounds up, ttl·(1−ρ) rounds down.
  EXPECT_EQ(stretch_up_ns(1, 1), 2);                      // 1.000000001 -> 2
  EXPECT_EQ(stretch_up_ns(1'000'000'000, 1), 1'000'000'001);  // exact
  EXPECT_EQ(shrink_down_ns(999'999'999, 1), 999'999'998);  // 999'999'998.000000001 -> down
  EXPECT_EQ(shrink_down_ns(1'000'000'000, 1), 999'999'999);  // exact
  // Exact equality is unsafe ...
  const Safety eq = check_safety(inputs(3'000'000'000, 1'000'000'000, 0, 1'999'999'992, 2));
  EXPECT_EQ(eq.left_ns, 2'999'999'994);
  EXPECT_EQ(eq.right_ns, 2'999'999'994);
  EXPECT_FALSE(eq.safe);
  // ... and so is a configuration exact arithmetic calls safe by half a ns: kill_after·(1+ρ) =
  // 1'500'000'001.5 counts as 1'500'000'002, so left = 2'999'999'997 = ttl·(1−ρ).
  const Safety half = check_safety(inputs(3'000'000'000, 1'500'000'000, 0, 1'499'999'995, 1));
  EXPECT_EQ(half.left_ns, 2'999'999'997);
  EXPECT_EQ(half.right_ns, 2'999'999'997);
  EXPECT_FALSE(half.safe);
  EXPECT_EQ(half.pause_budget_ns, 3);  // exact 3.5, rounded down
}

TEST(Timing, MeasuredBudgetUsesTheMeasuredTerms) {
  const Inputs in = inputs(1000 * kMs, 600 * kMs, kMs, 50 * kMs, rho_ppb_of(1e-3));
  // 1000 - 600.6 - 0.2 - 3 = 396.2 ms (the pause model's example).
  EXPECT_EQ(measured_pause_budget_ns(in, 200'000, 3 * kMs), 396'200'000);
  EXPECT_EQ(check_safety(in).pause_budget_ns, 348'400'000);
}

TEST(Timing, SaturatesInsteadOfOverflowing) {
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(stretch_up_ns(big, kPpb), big);
  EXPECT_EQ(ms_to_ns(std::numeric_limits<std::uint64_t>::max()), big);
  const Safety s = check_safety(inputs(kMs, big, big, big, 0));
  EXPECT_FALSE(s.safe);
  EXPECT_EQ(s.pause_budget_ns, std::numeric_limits<std::int64_t>::min());
  // Negative inputs count as 0.
  EXPECT_TRUE(check_safety(inputs(kMs, -5, -5, -5, -5)).safe);
}

// inputs_of(): a configuration in its flags' units (ms, ns granularity, ρ as a fraction) to the
// inequality's inputs, the one conversion the supervisor and the pause model share.
struct Flags {
  std::uint64_t ttl_ms = 0;
  std::uint64_t kill_after_ms = 0;
  std::uint64_t kill_latency_budget_ms = 0;
  std::uint64_t wheel_granularity_ns = 0;
  double clock_rate_bound = 0;
};
static_assert(ConfiguredTiming<Flags>);
static_assert(!ConfiguredTiming<Inputs>, "Inputs is already in ns: it is not a configuration");

TEST(Timing, InputsOfConvertsTheFlagsUnitsTowardSafety) {
  const Inputs in = inputs_of(Flags{1000, 600, 50, 1'000'000, 1.5e-9});
  EXPECT_EQ(in.ttl_ns, 1000 * kMs);
  EXPECT_EQ(in.kill_after_ns, 600 * kMs);
  EXPECT_EQ(in.kill_latency_budget_ns, 50 * kMs);
  EXPECT_EQ(in.wheel_granularity_ns, 1'000'000);
  EXPECT_EQ(in.rho_ppb, 2) << "rounded up";
  EXPECT_EQ(check_safety(inputs_of(Flags{1000, 600, 50, 1'000'000, 1e-3})).pause_budget_ns, 348'400'000);
  const std::int64_t big = std::numeric_limits<std::int64_t>::max();
  const Inputs huge = inputs_of(Flags{std::numeric_limits<std::uint64_t>::max(), 0, 0,
                                      std::numeric_limits<std::uint64_t>::max(), 0});
  EXPECT_EQ(huge.ttl_ns, big);
  EXPECT_EQ(huge.wheel_granularity_ns, big) << "saturates, never wraps negative";
}

// kill_deadline_ns(): the supervisor's deadline, send + kill_after, in unsigned boot-clock ns.
TEST(Timing, KillDeadlineIsTheSendPlusKillAfter) {
  // The daemon's defaults: a request sent 5 s after boot, kill_after 7000 ms.
  const std::uint64_t send = 5'000'000'000;
  EXPECT_EQ(kill_deadline_ns(send, static_cast<std::uint64_t>(ms_to_ns(7000))), 12'000'000'000u);
  EXPECT_EQ(kill_deadline_ns(0, 600'000'000), 600'000'000u);
  EXPECT_EQ(kill_deadline_ns(send, 0), send);
  // The largest kill_after the flags can give (ms_to_ns saturates at INT64_MAX) from the largest
  // boot-clock reading: exact, 2^64 - 2.
  const auto most = static_cast<std::uint64_t>(ms_to_ns(std::numeric_limits<std::uint64_t>::max()));
  EXPECT_EQ(most, static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  EXPECT_EQ(kill_deadline_ns(most, most), std::numeric_limits<std::uint64_t>::max() - 1);
  static_assert(kill_deadline_ns(1, 2) == 3, "usable in constant expressions");
}

// A send time above INT64_MAX is a send time that wrapped below zero (a short grant's shortfall
// subtracted from a send just after boot): no deadline is right for it. Saturating gave the
// kill-switch "never" (the lease outlived lockd's expiry); it aborts instead.
TEST(TimingDeathTest, KillDeadlineOfAWrappedSendAborts) {
  const std::uint64_t wrapped = std::uint64_t{1'600'000'000} - std::uint64_t{2'000'000'000};  // 1.6 s - 2 s
  EXPECT_DEATH((void)kill_deadline_ns(wrapped, 7'000'000'000),
               "LEASEHOLD_ASSERT\\(send_ns <= kMaxTerm && kill_after_ns <= kMaxTerm\\) failed");
  EXPECT_DEATH((void)kill_deadline_ns(0, std::numeric_limits<std::uint64_t>::max()), "kMaxTerm");
}

}  // namespace
}  // namespace leasehold::timing
