#!/bin/sh
# Installs libleasehold-check to a temporary prefix, builds a C program against the installed
# header and library using only pkg-config, and checks a live slot with it.
# Usage: install_test.sh BUILD_DIR FIXTURE_WRITER EXAMPLE_C [EXTRA_CFLAGS]
set -eu
build=$1; fixture=$2; example=$3; extra=${4:-}
tmp=$(mktemp -d /tmp/lh-install-XXXXXX)
loc=/dev/shm/lh-install-$$
cleanup() { [ -n "${wpid:-}" ] && kill "$wpid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp" "$loc"; }
trap cleanup EXIT

cmake --install "$build" --prefix "$tmp/prefix" --component leasehold-check >/dev/null
cmake --install "$build" --prefix "$tmp/prefix" --component leasehold-check-dev >/dev/null
pc=$(find "$tmp/prefix" -name leasehold-check.pc)
[ -n "$pc" ] || { echo "FAIL: leasehold-check.pc not installed"; exit 1; }
[ -f "$tmp/prefix/include/leasehold/check.h" ] || { echo "FAIL: check.h not installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs leasehold-check)
libdir=$(pkg-config --variable=libdir leasehold-check)
echo "pkg-config: $flags"
# The .pc's version is the header's (LEASEHOLD_CHECK_ABI_VERSION.MINOR.PATCH).
hdr="$tmp/prefix/include/leasehold/check.h"
want=$(sed -n 's/^#define LEASEHOLD_CHECK_\(ABI_VERSION\|VERSION_MINOR\|VERSION_PATCH\) \([0-9]*\)$/\2/p' "$hdr" | paste -sd.)
got=$(pkg-config --modversion leasehold-check)
[ "$got" = "$want" ] || { echo "FAIL: leasehold-check.pc says version $got, check.h says $want"; exit 1; }
# Only the installed header and library: no source-tree include paths.
cc -std=c11 -Wall -Wextra -Werror $extra "$example" $flags -Wl,-rpath,"$libdir" -o "$tmp/check"
ldd "$tmp/check" | grep -q "$libdir/libleasehold-check.so.1" || { echo "FAIL: not linked to the installed library"; ldd "$tmp/check"; exit 1; }

"$fixture" "$loc" "$tmp/ready" 20 1000 & wpid=$!
i=0; while [ ! -s "$tmp/ready" ]; do i=$((i+1)); [ $i -lt 500 ] || { echo "FAIL: fixture did not start"; exit 1; }; sleep 0.01; done
read slot epoch < "$tmp/ready"
out=$(LEASEHOLD_SHM=$loc LEASEHOLD_SLOT=$slot LEASEHOLD_EPOCH=$epoch "$tmp/check")
echo "$out"
echo "$out" | grep -q "check=1 check_deadline=1 writer_alive=1" || { echo "FAIL: live slot not valid"; exit 1; }
# A wrong epoch must not pass.
if LEASEHOLD_SHM=$loc LEASEHOLD_SLOT=$slot LEASEHOLD_EPOCH=$((epoch+1)) "$tmp/check" >/dev/null; then
  echo "FAIL: wrong epoch accepted"; exit 1
fi
echo PASS
