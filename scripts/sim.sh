#!/usr/bin/env bash
# The simulator's CI stage (scripts/test.sh runs it): an optimised build of leasehold-sim and its
# ablated variants, then
#   1. a sweep of SEEDS seeds (default 10,000: each 120 simulated seconds with faults; 30% of them
#      with workers queueing for names) that must find no violation, on every core;
#   2. each ablated build (leasehold-sim-<ablation>) over seeds 1..ABLATION_SEEDS (default 300),
#      which must find a violation (exit 1): an ablation the sweep cannot catch fails CI.
#   3. a sweep of CLUSTER_SEEDS seeds (default 1,000) of lockd on etcd: three lockd replicas on a
#      simulated etcd with their failovers (--lockd-replicas 3), which must find no violation.
# Usage: scripts/sim.sh [SEEDS] [ABLATION_SEEDS] [CLUSTER_SEEDS]. Exits non-zero on the first
# failing check.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-10000}
ablation_seeds=${2:-300}
cluster_seeds=${3:-1000}
jobs=$(nproc)
build=build/release/sim

cmake --preset release >/dev/null
ablations=$(sed -n 's/^leasehold_sim_variant("_\([a-z_]*\)".*/\1/p' sim/CMakeLists.txt | tr '_' '-')
targets="leasehold-sim"
for a in $ablations; do targets="$targets leasehold-sim-$a"; done
# shellcheck disable=SC2086
cmake --build --preset release -j"$jobs" --target $targets

start=$(date +%s)
"$build/leasehold-sim" --seeds "1..$seeds" --jobs "$jobs"
echo "sim: $seeds seeds clean in $(( $(date +%s) - start )) s"

start=$(date +%s)
"$build/leasehold-sim" --seeds "1..$cluster_seeds" --jobs "$jobs" --lockd-replicas 3
echo "sim: $cluster_seeds seeds of three lockd on etcd clean in $(( $(date +%s) - start )) s"

for a in $ablations; do
  set +e
  out=$("$build/leasehold-sim-$a" --seeds "1..$ablation_seeds" --jobs "$jobs" --stop-at-first --quiet)
  rc=$?
  set -e
  if [ "$rc" -ne 1 ]; then
    echo "sim: ablation $a was NOT caught in seeds 1..$ablation_seeds (exit $rc)" >&2
    exit 1
  fi
  echo "sim: ablation $a caught: $(printf '%s\n' "$out" | head -1)"
done
