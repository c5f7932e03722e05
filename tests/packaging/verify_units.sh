#!/usr/bin/env bash
# The systemd units in packaging/systemd/ pass `systemd-analyze verify` (unknown keys, bad
# values, missing executables), with ExecStart pointed at this build's daemons. systemd-analyze
# exits 0 on many problems and only prints them, so any line about a unit is a failure; a unit
# broken on purpose first shows that such a line is seen. Exit 77 (skipped) without systemd-analyze.
# Usage: verify_units.sh SOURCE_DIR LOCKD_BINARY SUPERVISOR_BINARY
set -euo pipefail
src=$1 lockd=$(realpath "$2") supervisor=$(realpath "$3")
if ! command -v systemd-analyze >/dev/null; then
  echo "skipped: systemd-analyze is not installed (Debian package systemd)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed "s|/usr/bin/leasehold-lockd|$lockd|" "$src/packaging/systemd/leasehold-lockd.service" > "$work/leasehold-lockd.service"
sed "s|/usr/bin/leasehold-supervisor|$supervisor|" "$src/packaging/systemd/leasehold-supervisor.service" \
  > "$work/leasehold-supervisor.service"
for u in lockd supervisor; do
  grep -q "^Type=notify$" "$work/leasehold-$u.service" || { echo "leasehold-$u.service is not Type=notify"; exit 1; }
done
grep -q '^Delegate=yes$' "$work/leasehold-supervisor.service" || { echo "the supervisor's unit does not delegate its cgroup"; exit 1; }

# The check itself: a broken copy must be reported.
sed 's/^KillMode=mixed/KillMode=mixd/' "$work/leasehold-supervisor.service" > "$work/broken.service"
out=$(cd "$work" && systemd-analyze verify --man=no broken.service 2>&1 || true)
if ! grep -q 'broken.service' <<<"$out"; then
  echo "systemd-analyze verify did not report a broken unit; its output: $out"
  exit 1
fi
rm "$work/broken.service"

rc=0
out=$(cd "$work" && systemd-analyze verify --man=no leasehold-lockd.service leasehold-supervisor.service 2>&1) || rc=$?
echo "$out"
if [ "$rc" -ne 0 ] || grep -q 'leasehold-' <<<"$out"; then
  echo "systemd-analyze verify found problems in the units (exit $rc)"
  exit 1
fi
echo "ok: leasehold-lockd.service and leasehold-supervisor.service verify"
