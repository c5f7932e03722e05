// Built against an ablated simulator library (LEASEHOLD_SIM_ABLATE_<X>): the sweep must find a
// violation within a few seeds. The unablated build runs the same seeds clean
// (world_test.cpp, TheUnablatedBuildViolatesNothingInTheSeedsTheAblationFailsOn).
#include "leasehold/sim/world.hpp"

#include <gtest/gtest.h>

namespace leasehold::sim {
namespace {

TEST(SimAblation, TheAblatedBuildIsCaughtWithinSixteenSeeds) {
  ASSERT_FALSE(ablation_name().empty()) << "this test must link an ablated simulator library";
  bool caught = false;
  for (std::uint64_t s = 1; s <= 16 && !caught; ++s) {
    SimConfig c;
    c.seed = s;
    const RunResult r = run_seed(c);
    if (r.violation) {
      caught = true;
      RecordProperty("seed", static_cast<int>(s));
      RecordProperty("invariant", r.violation->invariant);
      EXPECT_FALSE(r.violation->invariant.empty());
    }
  }
  EXPECT_TRUE(caught) << "ablation " << ablation_name() << " not caught in seeds 1..16";
}

}  // namespace
}  // namespace leasehold::sim
