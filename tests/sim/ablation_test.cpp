// Built against an ablated simulator library (LEASEHOLD_SIM_ABLATE_<X>): the seed at which
// scripts/sim.sh's sweep first catches the ablation (LEASEHOLD_SIM_CATCHING_SEED, set per ablation
// in tests/sim/CMakeLists.txt) must violate the invariant that catches it there
// (LEASEHOLD_SIM_CAUGHT_BY) in this build. That the unablated build runs the same seeds clean is
// scripts/sim.sh's: its clean sweep (seeds 1..9000 of one lockd, 1..1000 of three, the default
// configuration these tests use) holds every catching seed. The sweep that every ablation is caught
// within seeds 1..300 is scripts/sim.sh's too, on the release build.
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
