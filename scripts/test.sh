#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   1. install missing packages (scripts/setup.sh)
#   2. unit + integration tests under ASan+UBSan (debug preset)
#   3. the concurrent tests under TSan (tsan preset, label "concurrent")
#   4. the wire decoder fuzzer for a bounded time (fuzz preset, clang/libFuzzer)
#   5. the module graph (scripts/check-modules: #include lines, CMake link graph,
#      docs/ARCHITECTURE.md), and a test of the checker on bad trees
#   6. the formal models (specs/check, Spin), and their mutation test (specs/mutate)
#   7. the deterministic simulator: 9,000 seeds of one lockd and 1,000 of three lockd on a
#      simulated etcd clean, every ablation caught (scripts/sim.sh)
# Exits non-zero on the first failing stage.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Each stage line says how long the one before it took (CI has a time budget: README "Tests").
suite_start=$(date +%s)
stage_start=$suite_start
stage() {
  local now; now=$(date +%s)
  printf '\n==== %s ==== (previous stage %d s, suite %d s)\n' "$*" $((now - stage_start)) $((now - suite_start))
  stage_start=$now
}

stage "setup"
scripts/setup.sh

stage "debug (ASan+UBSan): build"
cmake --preset debug >/dev/null
cmake --build --preset debug -j"$jobs"
stage "debug (ASan+UBSan): tests"
ctest --preset debug -j"$jobs"

stage "module graph (docs/ARCHITECTURE.md)"
scripts/check-modules --self-test
scripts/check-modules --build build/debug

stage "tsan: build"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j"$jobs" --target leasehold_concurrent_tests
stage "tsan: concurrent tests"
ctest --preset tsan -j"$jobs"

if [ -x scripts/fuzz.sh ]; then
  stage "fuzz: wire decoder"
  scripts/fuzz.sh "${LEASEHOLD_FUZZ_SECONDS:-60}"
fi

if [ -x specs/check ]; then
  stage "specs: model checking (Spin)"
  specs/check
fi

if [ -x specs/mutate ]; then
  stage "specs: mutation test (every guard and effect weakened; survivors must be explained)"
  specs/mutate --verified specs/mutate.verified lease transfer preemptible
  specs/mutate --verified specs/mutate.verified failover
  specs/mutate --verified specs/mutate.verified token
fi

if [ -x scripts/sim.sh ]; then
  stage "sim: 9,000 seeds of one lockd and 1,000 of three on etcd, with faults, and every ablation caught"
  scripts/sim.sh "${LEASEHOLD_SIM_SEEDS:-9000}" 300 "${LEASEHOLD_SIM_CLUSTER_SEEDS:-1000}"
fi

stage "all stages passed"
