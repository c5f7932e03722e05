#!/usr/bin/env bash
# The main job: install missing packages, build the release preset, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
exec build/release/tools/leasehold demo "$@"
