#!/bin/sh
# `leasehold dump` against a live table, its JSON, a dead writer, a missing and a corrupt table.
# Usage: dump_test.sh LEASEHOLD_BIN FIXTURE_WRITER
set -eu
cli=$1; fixture=$2
tmp=$(mktemp -d /tmp/lh-dump-XXXXXX)
loc=/dev/shm/lh-dump-$$
cleanup() { [ -n "${wpid:-}" ] && kill -9 "$wpid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp" "$loc"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$fixture" "$loc" "$tmp/ready" 20 200 & wpid=$!
i=0; while [ ! -s "$tmp/ready" ]; do i=$((i+1)); [ $i -lt 500 ] || fail "fixture did not start"; sleep 0.01; done

"$cli" dump --shm "$loc" > "$tmp/out" || fail "dump of a live table exited $?"
cat "$tmp/out"
grep -q "ALIVE" "$tmp/out" || fail "writer not shown alive"
grep -q "published.*valid.*42.*0f8fad5b-d9cb-469f-a165-70867728950e.*fixtur" "$tmp/out" || fail "live slot row missing"
grep -q "revoked" "$tmp/out" || fail "revoked slot not shown"
grep -q "kills 1" "$tmp/out" || fail "kills counter missing"

"$cli" dump --shm "$loc" --json > "$tmp/json" || fail "dump --json exited $?"
python3 - "$tmp/json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["writer"]["alive"] is True, d["writer"]
assert d["census"]["published"] == 2, d["census"]
s = [x for x in d["slots"] if x["epoch"] == 42][0]
assert s["name_prefix"] == "fixtur" and s["name_bytes"] == 12 and not s["revoked"], s
assert d["stats"]["kill_latency_ns"]["count"] == 1
PY

"$cli" dump --shm "$loc" --watch 0.05 --count 2 > "$tmp/watch" || fail "dump --watch exited $?"
[ "$(grep -c 'ALIVE' "$tmp/watch")" -eq 2 ] || fail "--watch --count 2 did not draw twice"
"$cli" top --shm "$loc" --interval 0.05 --count 1 > /dev/null || fail "top exited $?"
rc=0; "$cli" dump --shm "$loc" --count 2 > /dev/null 2> "$tmp/count.err" || rc=$?
[ $rc -eq 2 ] || fail "--count without --watch: exit $rc, want 2"
grep -q "needs --watch" "$tmp/count.err" || fail "--count without --watch: message"

kill -9 "$wpid"; wait "$wpid" 2>/dev/null || true; wpid=
sleep 0.3   # past the fixture's 200 ms liveness timeout
set +e
"$cli" dump --shm "$loc" > "$tmp/dead" 2> "$tmp/dead.err"; rc=$?
set -e
cat "$tmp/dead" "$tmp/dead.err"
[ $rc -eq 6 ] || fail "dead writer: exit $rc, want 6 (kTableError)"
grep -q "DEAD" "$tmp/dead" || fail "dead writer not reported"
grep -q "fixtur" "$tmp/dead" || fail "dump of a dead writer's table lost its slots"
# A heartbeat from another boot (ahead of this boot's clock): no valid heartbeat, said plainly.
python3 -c 'import struct,sys; f=open(sys.argv[1],"r+b"); f.seek(128); f.write(struct.pack("<Q", 2**62)); f.close()' "$loc"
"$cli" dump --shm "$loc" > "$tmp/boot" 2>&1 || true
grep -q "heartbeat none" "$tmp/boot" || fail "heartbeat from another boot not shown as none"
grep -q "DEAD (no valid heartbeat)" "$tmp/boot" || fail "dead reason for a heartbeat from another boot"
! grep -q "never ago" "$tmp/boot" || fail "dump printed 'never ago'"

set +e
"$cli" dump --shm lh-no-such-table-$$ 2> "$tmp/missing.err"; rc=$?
set -e
[ $rc -eq 6 ] || fail "missing table: exit $rc, want 6"
grep -q "does not exist" "$tmp/missing.err" || fail "missing table message"

head -c 100 /dev/urandom > "$loc"
set +e
"$cli" dump --shm "$loc" 2> "$tmp/corrupt.err"; rc=$?
set -e
[ $rc -eq 6 ] || fail "corrupt table: exit $rc, want 6"
grep -q "smaller than the 128-byte header" "$tmp/corrupt.err" || fail "corrupt table message"
echo PASS
