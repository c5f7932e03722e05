#!/usr/bin/env bash
# Kill-switch latency and rt wake-up lateness of leasehold-supervisor, next to cyclictest on the
# same machine, plus the supervisor's CPU at 10,000 leases (issue 6, "Performance").
#
#   perf/supervisor/killswitch_latency.sh [BUILD_DIR] [OUT_DIR]
#
# BUILD_DIR: an optimised build (default build/release: cmake --preset release && cmake --build
# --preset release). Needs root (SCHED_FIFO, mlockall, cgroups), rt-tests (cyclictest).
# Environment: SECONDS_RT (default 10), CPU (default: the last CPU), PRIO (default 50),
# KILLS (default 300), LEASES (default 10000), CPU_SECONDS (default 30), SKIP_CPU=1.
#
# What is measured:
#  1. cyclictest  -p PRIO -a CPU -i 1000 for SECONDS_RT s: the machine's timer wake-up latency
#     (baseline). /dev/cpu_dma_latency is held at 0 for both runs, as cyclictest does for itself.
#  2. rt lateness: the supervisor's RtThread (same priority, CPU, 1 ms tick, mlockall) for the same
#     time; every tick's lateness is kept, so p50/p99/max are exact. Target: p99 <= 1.2x
#     cyclictest's p99.
#  3. kill-switch latency: KILLS `sleep` sandboxes in cgroup v2 leaves, each armed on the RtThread
#     with its own deadline; deadline -> cgroup.kill issued -> death confirmed (populated 0) ->
#     exit seen by a pidfd poll on another thread (when the io thread can reap).
#  3b. the same kills of isolated sandboxes (--isolation); then `spawn`: start latency (request ->
#     the command's first write on a pipe) and kill latency (kill -> pidfd exit and an empty leaf)
#     of the isolated spawn, the unisolated one and `bwrap --unshare-all` (skipped, with the
#     reason, where bwrap cannot run), as ratios, and the isolated kill p99 against the default
#     kill-latency budget (50 ms) and pause budget (SPAWN_RUNS, default 50). `ratio_gate`: the
#     supervisor's start (the child held before its exec while its deadline is armed) against the
#     same sandbox started in one step.
#  4. end to end through the daemon: lockd + supervisor (TTL 1000 ms, kill after 600 ms), 40 named
#     sandboxes, lockd SIGSTOPped; the supervisor's own log gives deadline -> confirmed per kill.
#  5. CPU: lockd + supervisor --synthetic (leases without processes: the heartbeat, shm, rt wheel
#     and lockd traffic are all real, only fork/exec is skipped), LEASES named leases at a 1 s
#     heartbeat interval; utime+stime of the supervisor over CPU_SECONDS s from /proc/PID/stat.
#     Target: < 2 % of one core. Run at the default 1 ms wheel tick and at 10 ms (CPU_TICKS_US).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build/release}
OUT=${2:-$BUILD/perf-supervisor}
SECONDS_RT=${SECONDS_RT:-10}
CPU=${CPU:-$(( $(nproc) - 1 ))}
PRIO=${PRIO:-50}
KILLS=${KILLS:-300}
LEASES=${LEASES:-10000}
CPU_SECONDS=${CPU_SECONDS:-30}
TOOL=$BUILD/perf/supervisor/leasehold_killswitch_latency
SUP=$BUILD/supervisor/leasehold-supervisor
LOCKD=$BUILD/lockd/leasehold-lockd
for f in "$TOOL" "$SUP" "$LOCKD"; do
  [ -x "$f" ] || { echo "missing $f: build $BUILD first (cmake --build $BUILD)" >&2; exit 1; }
done
command -v cyclictest >/dev/null || { echo "cyclictest missing: apt-get install rt-tests" >&2; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/lh-perf-XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

# Hold /dev/cpu_dma_latency at 0 for the whole run, as cyclictest does for itself.
if [ -w /dev/cpu_dma_latency ]; then exec 9>/dev/cpu_dma_latency; printf '\x00\x00\x00\x00' >&9; fi

start_lockd() {  # $1 = extra flags; sets LOCKD_PID, LOCKD_ADDR
  "$LOCKD" --listen 127.0.0.1:0 --store "$WORK/lockd-$RANDOM.db" --key-file "$WORK/key" $1 \
    > "$WORK/lockd.out" 2> "$WORK/lockd.err" &
  LOCKD_PID=$!; PIDS+=("$LOCKD_PID")
  for _ in $(seq 200); do grep -q listening "$WORK/lockd.out" && break; sleep 0.05; done
  LOCKD_ADDR=$(sed -n 's/^listening //p' "$WORK/lockd.out")
}
start_sup() {  # $1 = extra flags; sets SUP_PID
  rm -f "$WORK/sup.out"
  "$SUP" --lockd "$LOCKD_ADDR" --key-file "$WORK/key" --control-socket "$WORK/sup.sock" --rt-cpu "$CPU" $1 \
    > "$WORK/sup.out" 2> "$WORK/sup.err" &
  SUP_PID=$!; PIDS+=("$SUP_PID")
  for _ in $(seq 200); do grep -q '^ready' "$WORK/sup.out" 2>/dev/null && break; sleep 0.05; done
  grep -q '^ready' "$WORK/sup.out" || { cat "$WORK/sup.err" >&2; exit 1; }
}
ctl() {  # one control request (JSON) -> answer
  python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode()+b"\n")
b=b""
while b"\n" not in b:
    d=s.recv(1<<20)
    if not d: break
    b+=d
print(b.split(b"\n")[0].decode())' "$WORK/sup.sock" "$1"
}
"$LOCKD" --generate-key "$WORK/key" > /dev/null

if [ "${SKIP_RT:-0}" != 1 ]; then
echo "== 1. cyclictest: -p $PRIO -a $CPU -i 1000 -D $SECONDS_RT"
cyclictest -m -q -p "$PRIO" -a "$CPU" -t 1 -i 1000 -D "$SECONDS_RT" -h 20000 > "$OUT/cyclictest.txt" 2>&1
python3 - "$OUT/cyclictest.txt" > "$OUT/cyclictest.json" <<'EOF'
import json, sys
hist = []; mx = None; over = 0
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 2 and p[0].isdigit(): hist.append((int(p[0]), int(p[1])))
    elif line.startswith("# Max Latencies:"): mx = int(p[3])
    elif line.startswith("# Histogram Overflows:"): over = int(p[3])
n = sum(c for _, c in hist) + over
def pct(q):
    acc = 0
    for us, c in hist:
        acc += c
        if acc >= q * n: return us
    return mx
print(json.dumps({"measure": "cyclictest", "samples": n, "p50_us": pct(0.5), "p99_us": pct(0.99), "max_us": mx}))
EOF
cat "$OUT/cyclictest.json"

echo "== 2. supervisor rt thread lateness (same CPU, priority, tick)"
"$TOOL" lateness --seconds "$SECONDS_RT" --cpu "$CPU" --priority "$PRIO" | tee "$OUT/rt_lateness.json"

echo "== 3. kill-switch latency, $KILLS sandboxes"
"$TOOL" kills --count "$KILLS" --batch 50 --cpu "$CPU" --priority "$PRIO" | tee "$OUT/kills.json"

echo "== 3b. the same with isolated sandboxes (the default spawn); start and kill latency, isolated vs"
echo "       unisolated vs bwrap --unshare-all, as ratios (SPAWN_RUNS per mode)"
"$TOOL" kills --isolation --count "$KILLS" --batch 50 --cpu "$CPU" --priority "$PRIO" | tee "$OUT/kills-isolated.json"
"$TOOL" spawn --runs "${SPAWN_RUNS:-50}" | tee "$OUT/spawn.json"


echo "== 4. end to end: 40 named sandboxes, lockd stopped"
start_lockd "--ttl-ms 1000"
start_sup "--ttl-ms 1000 --kill-after-ms 600 --heartbeat-interval-ms 100 --kill-latency-budget-ms 50 --slots 64"
for i in $(seq 40); do ctl "{\"v\":1,\"op\":\"run\",\"name\":\"e2e-$i\",\"argv\":[\"sleep\",\"60\"]}" > /dev/null; done
sleep 0.5
kill -STOP "$LOCKD_PID"
for _ in $(seq 100); do [ "$(grep -c 'event=killed' "$WORK/sup.err" || true)" -ge 40 ] && break; sleep 0.05; done
kill -CONT "$LOCKD_PID"
python3 - "$WORK/sup.err" > "$OUT/e2e.json" <<'EOF'
import json, sys, re
v = []
for line in open(sys.argv[1]):
    if "event=killed" not in line: continue
    kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
    if kv.get("cause") == "deadline" and kv.get("confirmed_ns", "0") != "0":
        v.append((int(kv["confirmed_ns"]) - int(kv["deadline_ns"])) / 1000)
v.sort()
pct = lambda q: v[min(len(v) - 1, int(q * len(v)))] if v else None
print(json.dumps({"measure": "e2e_deadline_to_confirmed", "samples": len(v), "p50_us": pct(0.5),
                  "p99_us": pct(0.99), "max_us": v[-1] if v else None}))
EOF
cat "$OUT/e2e.json"
kill "$SUP_PID" "$LOCKD_PID"; wait "$SUP_PID" "$LOCKD_PID" 2>/dev/null || true
fi

if [ "${SKIP_CPU:-0}" != 1 ]; then
  # The rt thread wakes every wheel tick whatever the load: measured at the default 1 ms tick and
  # at a 10 ms tick (--wheel-granularity-us 10000), which a 10 s TTL easily affords.
  for tick_us in ${CPU_TICKS_US:-1000 10000}; do
  echo "== 5. CPU: $LEASES synthetic named leases, 1 s heartbeat, wheel tick $tick_us us, ${CPU_SECONDS} s"
  start_lockd "--ttl-ms 10000"
  start_sup "--synthetic --slots $((LEASES + 64)) --ttl-ms 10000 --kill-after-ms 7000 --heartbeat-interval-ms 1000 --wheel-granularity-us $tick_us"
  "$TOOL" register --socket "$WORK/sup.sock" --count "$LEASES" --threads 16 | tee "$OUT/register-$tick_us.json"
  sleep 3
  ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
  hz=$(getconf CLK_TCK)
  s0=$(ticks "$SUP_PID"); l0=$(ticks "$LOCKD_PID"); t0=$(date +%s.%N)
  sleep "$CPU_SECONDS"
  s1=$(ticks "$SUP_PID"); l1=$(ticks "$LOCKD_PID"); t1=$(date +%s.%N)
  status=$(ctl '{"v":1,"op":"status"}')
  python3 - "$s0" "$s1" "$l0" "$l1" "$t0" "$t1" "$hz" "$LEASES" "$status" "$tick_us" > "$OUT/cpu-$tick_us.json" <<'EOF'
import json, sys
s0, s1, l0, l1 = map(int, sys.argv[1:5]); t0, t1 = float(sys.argv[5]), float(sys.argv[6]); hz = int(sys.argv[7])
st = json.loads(sys.argv[9]); c = st.get("counters", {})
wall = t1 - t0
print(json.dumps({"measure": "cpu", "leases": int(sys.argv[8]), "wheel_tick_us": int(sys.argv[10]),
                  "named_live": st.get("named"), "wall_s": round(wall, 2),
                  "supervisor_cpu_pct_of_one_core": round(100 * (s1 - s0) / hz / wall, 3),
                  "lockd_cpu_pct_of_one_core": round(100 * (l1 - l0) / hz / wall, 3),
                  "kills_deadline": c.get("kills_deadline"), "heartbeat_failures": c.get("heartbeat_failures"),
                  "heartbeat_datagrams": c.get("heartbeat_datagrams"), "refreshed": c.get("refreshed"),
                  "rt_ticks": st.get("rt", {}).get("ticks")}))
EOF
  cat "$OUT/cpu-$tick_us.json"
  kill "$SUP_PID" "$LOCKD_PID"; wait "$SUP_PID" "$LOCKD_PID" 2>/dev/null || true
  done
fi

python3 - "$OUT" <<'EOF'
import json, sys, os
d = sys.argv[1]
load = lambda f: json.load(open(os.path.join(d, f))) if os.path.exists(os.path.join(d, f)) else None
cy, rt, k = load("cyclictest.json"), load("rt_lateness.json"), load("kills.json")
print("\n== summary (microseconds)")
if cy and rt:
    print(f"cyclictest        p50 {cy['p50_us']:>8} p99 {cy['p99_us']:>8} max {cy['max_us']:>8}")
    L = rt["lateness"]
    print(f"rt lateness       p50 {L['p50_us']:>8.1f} p99 {L['p99_us']:>8.1f} max {L['max_us']:>8.1f}   "
          f"p99 ratio {L['p99_us'] / max(cy['p99_us'], 1):.2f} (target <= 1.2)")
if k:
    for key in ("deadline_to_issued", "deadline_to_confirmed", "deadline_to_exit_seen"):
        x = k[key]
        print(f"kill {key:<22} p50 {x['p50_us']:>8.1f} p99 {x['p99_us']:>8.1f} max {x['max_us']:>8.1f}")
e = load("e2e.json")
if e and e["samples"]:
    print(f"e2e deadline->confirmed p50 {e['p50_us']:>8.1f} p99 {e['p99_us']:>8.1f} max {e['max_us']:>8.1f} ({e['samples']} kills)")
for f in sorted(os.listdir(d)):
    if not f.startswith("cpu-"): continue
    c = load(f)
    print(f"cpu at {c['leases']} leases, tick {c['wheel_tick_us']} us: supervisor {c['supervisor_cpu_pct_of_one_core']} % "
          f"of one core (target < 2 %), lockd {c['lockd_cpu_pct_of_one_core']} %, deadline kills {c['kills_deadline']}")
EOF
