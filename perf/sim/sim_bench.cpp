// The simulator's speed: each iteration runs one seed of the CI configuration (120 simulated
// seconds, three supervisors, faults on) and reports
//   sim_s_per_wall_s   simulated seconds per wall-clock second (one core)
//   seeds              seeds per wall-clock second on one core (x 60: seeds per minute; the CI
//                      sweep runs one process per core)
//   events             simulator events per wall-clock second
// Wall-clock time (UseRealTime): on a loaded machine the numbers fall with the load.
// Run: build/release/perf/sim/leasehold_sim_bench
#include "leasehold/sim/world.hpp"

#include <benchmark/benchmark.h>

namespace {

void run(benchmark::State& state, bool faults) {
  std::uint64_t seed = 1;
  double simulated_s = 0;
  double events = 0;
  for (auto _ : state) {
    leasehold::sim::SimConfig c;
    c.seed = seed++;
    c.faults = faults;
    const leasehold::sim::RunResult r = leasehold::sim::run_seed(c);
    if (r.violation) state.SkipWithError(("seed " + std::to_string(r.seed) + ": " + r.violation->invariant).c_str());
    simulated_s += static_cast<double>(r.simulated_ns) / 1e9;
    events += static_cast<double>(r.events);
  }
  state.counters["sim_s_per_wall_s"] = benchmark::Counter(simulated_s, benchmark::Counter::kIsRate);
  state.counters["seeds"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["events"] = benchmark::Counter(events, benchmark::Counter::kIsRate);
}

void BM_SimSeedWithFaults(benchmark::State& state) { run(state, true); }
void BM_SimSeedNoFaults(benchmark::State& state) { run(state, false); }

BENCHMARK(BM_SimSeedWithFaults)->Unit(benchmark::kMillisecond)->Iterations(200)->UseRealTime();
BENCHMARK(BM_SimSeedNoFaults)->Unit(benchmark::kMillisecond)->Iterations(100)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
