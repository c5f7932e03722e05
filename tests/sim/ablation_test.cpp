// Built against an ablated simulator library (LEASEHOLD_SIM_ABLATE_<X>): the seed at which
// scripts/sim.sh's sweep first catches the ablation (LEASEHOLD_SIM_CATCHING_SEED, set per ablation
// in tests/sim/CMakeLists.txt) must violate the invariant that catches it there
// (LEASEHOLD_SIM_CAUGHT_BY) in this build. The unablated build runs
// the same seeds clean (world_test.cpp, TheUnablatedBuildViolatesNothingInTheSeedsTheAblationsFailOn).
// The sweep itself (every ablation caught within seeds 1..300) is scripts/sim.sh's, on the
// release build.
#include "leasehold/sim/world.hpp"

#include <gtest/gtest.h>

namespace leasehold::sim {
namespace {

TEST(SimAblation, TheAblatedBuildViolatesAnInvariantAtItsCatchingSeed) {
  ASSERT_FALSE(ablation_name().empty()) << "this test must link an ablated simulator library";
  SimConfig c;
  c.seed = LEASEHOLD_SIM_CATCHING_SEED;
  c.lockd_replicas = LEASEHOLD_SIM_REPLICAS;  // the cluster's ablations: 3 (leasehold-sim's default for them)
  const RunResult r = run_seed(c);
  ASSERT_TRUE(r.violation) << "ablation " << ablation_name() << " no longer caught at seed " << c.seed
                           << " (find its new first seed with leasehold-sim-<ablation> --stop-at-first)";
  RecordProperty("invariant", r.violation->invariant);
  // The bug class shows as the invariant it breaks, not as any failure at all.
  EXPECT_EQ(r.violation->invariant, LEASEHOLD_SIM_CAUGHT_BY) << r.violation->detail;
}

}  // namespace
}  // namespace leasehold::sim
