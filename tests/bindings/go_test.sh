#!/bin/sh
# The Go binding (bindings/go/leaseholdcheck) built as a runtime author builds it: libleasehold-check
# and its -dev files installed into a temporary prefix, the package compiled with cgo against them
# through pkg-config alone, offline (no module proxy, no module outside the tree), then vetted and
# its tests run against the fixture writer's table (check_test.go); its source must be gofmt's.
# Usage: go_test.sh BUILD_DIR SOURCE_DIR FIXTURE_WRITER CHECK_VERSION GO_CACHE_DIR [PRELOAD]
# PRELOAD: libraries the test program needs first (a sanitized build's runtime). Exit 77 (skipped)
# without go.
set -eu
build=$1; src=$2; fixture=$3; version=$4; cache=$5; preload=${6:-}
command -v go >/dev/null || { echo "SKIP: go is not installed (scripts/setup.sh installs golang-go)"; exit 77; }
tmp=$(mktemp -d /tmp/lh-go-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

for c in leasehold-check leasehold-check-dev; do
  cmake --install "$build" --prefix "$tmp/prefix" --component "$c" >/dev/null
done
pc=$(dirname "$(find "$tmp/prefix" -name leasehold-check.pc)")
libdir=$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir leasehold-check)
# Offline and reproducible: the toolchain installed here, no proxy, caches in the build tree.
export PKG_CONFIG_PATH="$pc" GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=readonly GO111MODULE=on CGO_ENABLED=1 \
       GOCACHE="$cache/build" GOPATH="$cache/path" CGO_LDFLAGS="-Wl,-rpath,$libdir"
cd "$src/bindings/go/leaseholdcheck"
unformatted=$(gofmt -l .)
[ -z "$unformatted" ] || { echo "FAIL: not gofmt-formatted: $unformatted"; exit 1; }
go vet .
go test -c -o "$tmp/leaseholdcheck.test" .
ldd "$tmp/leaseholdcheck.test" | grep -q "$libdir/libleasehold-check.so.1" ||
  { echo "FAIL: not linked to the installed library"; ldd "$tmp/leaseholdcheck.test"; exit 1; }
LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 LEASEHOLD_TEST_FIXTURE_WRITER="$fixture" \
  LEASEHOLD_TEST_CHECK_VERSION="$version" "$tmp/leaseholdcheck.test" -test.v -test.count=1
