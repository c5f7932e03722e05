#!/bin/sh
# The Debian packages (packaging/CMakeLists.txt), as an operator gets them: CPack makes them from
# this build tree, dpkg installs them into a root of their own whose package database is a copy
# of this machine's (so dpkg checks every Depends against the packages really installed here, and
# a missing or misnamed dependency fails the install), and then the installed programs run from
# that root: lockd serves, a supervisor joins it, the CLI runs a named sandbox through the
# supervisor and reads the name back from lockd. It also checks what the packages carry: stripped
# programs, man pages, completion, the library's soname link, the -dev files, the bindings.
# Usage: deb_test.sh BUILD_DIR. Exit 77 (skipped) when dpkg or cpack is missing, or when not root
# (the supervisor needs root for its sandboxes' cgroups and uids).
set -eu
build=$(cd "$1" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
for tool in cpack dpkg dpkg-deb file; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root (dpkg --root and the supervisor's sandboxes need it)"; exit 77; }

tmp=$(mktemp -d /tmp/lh-deb-XXXXXX)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

# ---- make the packages --------------------------------------------------------------------------
# Uncompressed: the test reads them at once (a release's packages keep CPack's compression).
cpack --config "$build/CPackConfig.cmake" -B "$tmp/out" -D CPACK_DEBIAN_COMPRESSION_TYPE=none >"$tmp/cpack.log" 2>&1 ||
  { cat "$tmp/cpack.log"; fail "cpack"; }
deb() { ls "$tmp/out/$1"_*.deb 2>/dev/null | head -1; }
for p in leasehold-lockd leasehold-supervisor leasehold libleasehold-check1 libleasehold-check-dev python3-leasehold-check; do
  [ -n "$(deb "$p")" ] || fail "no package $p (made: $(ls "$tmp/out"))"
  [ "$(dpkg-deb -f "$(deb "$p")" Package)" = "$p" ] || fail "$p: wrong Package field"
done

# What each package must hold (a file missing here is missing on every machine that installs it).
holds() {
  dpkg-deb -c "$(deb "$1")" | awk '{print $6}' | grep -qx "./$2" || fail "package $1 lacks /$2"
}
holds leasehold-lockd usr/bin/leasehold-lockd
holds leasehold-lockd usr/share/man/man1/leasehold-lockd.1.gz
holds leasehold-lockd usr/share/bash-completion/completions/leasehold-lockd
holds leasehold-supervisor usr/bin/leasehold-supervisor
holds leasehold-supervisor usr/share/man/man1/leasehold-supervisor.1.gz
holds leasehold-supervisor usr/share/bash-completion/completions/leasehold-supervisor
holds leasehold usr/bin/leasehold
holds leasehold usr/share/man/man1/leasehold.1.gz
holds leasehold usr/share/bash-completion/completions/leasehold
holds leasehold usr/share/zsh/vendor-completions/_leasehold
holds libleasehold-check-dev usr/include/leasehold/check.h
holds leasehold-lockd usr/lib/systemd/system/leasehold-lockd.service
holds leasehold-lockd usr/lib/sysusers.d/leasehold.conf
holds leasehold-lockd etc/leasehold/lockd.toml
holds leasehold-supervisor usr/lib/systemd/system/leasehold-supervisor.service
holds leasehold-supervisor etc/leasehold/supervisor.toml
holds leasehold usr/share/doc/leasehold/README.md
for d in lockd supervisor; do  # an operator's edits survive an upgrade
  dpkg-deb -I "$(deb leasehold-$d)" conffiles | grep -qx "/etc/leasehold/$d.toml" ||
    fail "leasehold-$d: /etc/leasehold/$d.toml is not a conffile"
done
dpkg-deb -f "$(deb libleasehold-check-dev)" Depends | grep -q "libleasehold-check1 (= " ||
  fail "libleasehold-check-dev does not depend on its library's exact version"
holds libleasehold-check-dev usr/share/gocode/src/leasehold.dev/leaseholdcheck/check.go
holds libleasehold-check-dev usr/share/gocode/src/leasehold.dev/leaseholdcheck/go.mod
holds python3-leasehold-check usr/lib/python3/dist-packages/leasehold_check.py
dpkg-deb -f "$(deb python3-leasehold-check)" Depends | grep -q "libleasehold-check1 (= " ||
  fail "python3-leasehold-check does not depend on its library's exact version"
dpkg-deb -f "$(deb python3-leasehold-check)" Depends | grep -q "python3" || fail "python3-leasehold-check does not depend on python3"
[ "$(dpkg-deb -f "$(deb python3-leasehold-check)" Architecture)" = all ] || fail "python3-leasehold-check is not Architecture: all"
dpkg-deb -f "$(deb leasehold-lockd)" Depends | grep -q "liburing2" || fail "leasehold-lockd does not depend on liburing2"
dpkg-deb -f "$(deb leasehold-supervisor)" Depends | grep -q "libseccomp2" ||
  fail "leasehold-supervisor does not depend on libseccomp2"

# ---- install them into a root of their own ------------------------------------------------------
root=$tmp/root
mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info"
cp /var/lib/dpkg/status "$root/var/lib/dpkg/status"
touch "$root/var/lib/dpkg/available"
# The maintainer scripts (the library's ldconfig) run outside the root: it has no shell of its own.
dpkg --root="$root" --log=/dev/null --force-script-chrootless -i "$tmp"/out/*.deb >"$tmp/dpkg.log" 2>&1 ||
  { cat "$tmp/dpkg.log"; fail "dpkg -i refused the packages (a dependency this machine does not satisfy?)"; }
for p in leasehold-lockd leasehold-supervisor leasehold libleasehold-check1 libleasehold-check-dev python3-leasehold-check; do
  dpkg --root="$root" -s "$p" 2>/dev/null | grep -q "^Status: install ok installed" || fail "$p is not installed"
done
# lockd's postinst made the system user its unit runs as (systemd-sysusers, in the root).
if command -v systemd-sysusers >/dev/null; then
  grep -q "^leasehold:" "$root/etc/passwd" 2>/dev/null || fail "leasehold-lockd's postinst made no leasehold user"
fi
bin=$root/usr/bin
for prog in leasehold-lockd leasehold-supervisor leasehold; do
  file -L "$bin/$prog" | grep -q ", stripped" || fail "$prog is not stripped: $(file -L "$bin/$prog")"
done
lib=$(find "$root/usr" -name 'libleasehold-check.so.1' | head -1)
[ -n "$lib" ] || fail "no libleasehold-check.so.1 link"
readelf -d "$lib" | grep -q "SONAME.*libleasehold-check.so.1" || fail "wrong soname: $(readelf -d "$lib" | grep SONAME)"
[ -L "$(dirname "$lib")/libleasehold-check.so" ] || fail "libleasehold-check-dev lacks the .so link"

# ---- run the installed programs -----------------------------------------------------------------
"$bin/leasehold-lockd" --version | grep -qx "leasehold-lockd [0-9.]*" || fail "leasehold-lockd --version"
"$bin/leasehold-supervisor" --version | grep -qx "leasehold-supervisor [0-9.]*" || fail "leasehold-supervisor --version"
"$bin/leasehold" version | grep -q "^leasehold [0-9.]*" || fail "leasehold version"
"$bin/leasehold-lockd" --generate-key "$tmp/cluster.key" >/dev/null
worker=$(cat /proc/sys/kernel/random/uuid)
"$bin/leasehold-lockd" --derive-worker-key --worker-id "$worker" --key-file "$tmp/cluster.key" \
  --out "$tmp/worker.key" >/dev/null
# The shipped config file, with the command line overriding its store and key (flags win).
"$bin/leasehold-lockd" --config "$root/etc/leasehold/lockd.toml" \
  --listen 127.0.0.1:0 --store "$tmp/lockd.db" --key-file "$tmp/cluster.key" \
  >"$tmp/lockd.out" 2>"$tmp/lockd.err" &
pids="$pids $!"
wait_line() {  # FILE TEXT: until FILE has a line with TEXT (20 s)
  i=0
  while ! grep -q "$2" "$1" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 400 ] || return 1; sleep 0.05
  done
}
wait_line "$tmp/lockd.out" "^listening " || { cat "$tmp/lockd.err"; fail "the installed lockd did not start"; }
addr=$(sed -n 's/^listening //p' "$tmp/lockd.out" | head -1)
mkdir -p "$tmp/logs"
"$bin/leasehold-supervisor" --lockd "$addr" --key-file "$tmp/worker.key" --worker-id "$worker" \
  --control-socket "$tmp/sup.sock" --sandbox-log-dir "$tmp/logs" --uid-range "$((20000000 + $$ % 30000 * 1024)):1024" \
  >"$tmp/sup.out" 2>"$tmp/sup.err" &
pids="$pids $!"
wait_line "$tmp/sup.out" "^ready" || { cat "$tmp/sup.err"; fail "the installed supervisor did not start"; }
"$bin/leasehold" run --supervisor "$tmp/sup.sock" --name pkg-test -- /bin/sleep 30 >"$tmp/run.out" 2>&1 ||
  { cat "$tmp/run.out"; fail "leasehold run through the installed supervisor"; }
"$bin/leasehold" show pkg-test --lockd "$addr" --key-file "$tmp/cluster.key" --json >"$tmp/show.json" 2>&1 ||
  { cat "$tmp/show.json"; fail "leasehold show"; }
grep -q '"state": *"held"' "$tmp/show.json" || { cat "$tmp/show.json"; fail "pkg-test is not held"; }
grep -q "\"worker\": *\"$worker\"" "$tmp/show.json" || { cat "$tmp/show.json"; fail "pkg-test is not held by $worker"; }
"$bin/leasehold" release --supervisor "$tmp/sup.sock" pkg-test >/dev/null 2>&1 || fail "leasehold release"
echo "PASS: $(ls "$tmp/out" | tr '\n' ' ')"
