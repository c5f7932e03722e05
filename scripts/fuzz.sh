#!/usr/bin/env bash
# scripts/fuzz.sh [seconds]: builds the libFuzzer targets with the `fuzz` preset (clang,
# ASan+UBSan) and runs the wire decoder fuzzer for that many seconds (default 60).
# Starts from the committed seed corpus (fuzz/corpus/wire_decode); inputs found during the run go
# to a scratch copy, never into the repository. Exits non-zero if the fuzzer finds a crash, a leak,
# a timeout or a broken property; the input that triggered it is kept in $build/fuzz/artifacts/.
# LEASEHOLD_FUZZ_BUILD_DIR overrides the build directory (default: the preset's build/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
case "$seconds" in
  ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [seconds]   (seconds must be a whole number, got '$seconds')" >&2; exit 2 ;;
esac
build=${LEASEHOLD_FUZZ_BUILD_DIR:-build/fuzz}
jobs=$(nproc)

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found; install clang (scripts/setup.sh installs clang-14 and libFuzzer)" >&2
  exit 1
fi

cmake --preset fuzz -B "$build" >/dev/null
cmake --build "$build" --target wire_decode_fuzz -j"$jobs"

corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
cp fuzz/corpus/wire_decode/* "$corpus"/
artifacts="$build/fuzz/artifacts"
mkdir -p "$artifacts"

echo "fuzzing the wire decoder for ${seconds}s (seeds: $(ls fuzz/corpus/wire_decode | wc -l))"
"$build/fuzz/wire_decode_fuzz" \
  -max_total_time="$seconds" \
  -max_len=1500 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" \
  "$corpus"
