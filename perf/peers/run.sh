#!/usr/bin/env bash
# The lease-refresh comparison of lockd with Redis and etcd on this machine (perf/peers/README.md).
#
# Installs redis-server and etcd-server from Debian when missing (apt-get, as root; the tests
# never need them), builds leasehold-lockd-load and leasehold-peers-load (release preset), then
# for --rounds rounds runs back to back, each server on --server-cpu and each load generator on
# --load-cpu (taskset), servers on loopback on free ports in a temporary directory:
#   lockd        leasehold-lockd-load: W x S names acquired, then heartbeats of 29 entries, every
#                datagram HMAC-SHA256-tagged, every answer's tag checked
#   redis-pexpire  W x S keys pre-created, PEXPIRE pipelined 64 deep on 16 connections (1,024
#                in flight, as lockd-load's window of 1,024 datagrams)
#   redis-script   the same keys, EVALSHA of a script that PEXPIREs 25 keys, pipelined 64
#   redis-hot      PEXPIRE of one key, pipelined 64 (a reference: Redis's best case)
#   etcd         one lease per worker over its S keys, LeaseKeepAlive streams, pipelined
# and prints one table: per system min/median/max over the rounds of refreshes/s and of the
# server's CPU-seconds per million refreshes, and the same-round ratios lockd/peer.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/peers/run.sh [--seconds N] [--rounds N] [--workers N] [--sandboxes N] [--json]
                         [--server-cpu C] [--load-cpu C] [--build-dir DIR] [--no-build] [--no-install]
                         [--only SYSTEMS] [--redis-password]

Refreshes/s and server CPU-s per million refreshes of lockd, Redis and etcd, run back to back
for each round with the same pinning (server on --server-cpu, load generator on --load-cpu).

  --seconds N     refresh phase of every run, seconds (default 5)
  --rounds N      rounds (default 3)
  --workers N     workers (default 1000); --sandboxes N names per worker (default 100)
  --json          print one JSON object (every run and the summary) instead of the table
  --server-cpu C  CPU of the servers (default 0); --load-cpu C of the generators (default 1)
  --build-dir DIR release build directory (default build/release)
  --no-build      use the binaries already in --build-dir
  --no-install    do not apt-get install missing servers (fail instead)
  --only SYSTEMS  comma-separated subset of lockd,redis-pexpire,redis-script,redis-hot,etcd
  --redis-password  start Redis with a random requirepass and AUTH on every connection
                  (default: no auth on loopback)
EOF
}

root=$(cd "$(dirname "$0")/../.." && pwd)
secs=5 rounds=3 workers=1000 sandboxes=100 json=0 server_cpu=0 load_cpu=1
build_dir=$root/build/release build=1 install=1 redis_password=
only=lockd,redis-pexpire,redis-script,redis-hot,etcd
while [ $# -gt 0 ]; do
  case $1 in
    --seconds|--rounds|--workers|--sandboxes|--server-cpu|--load-cpu|--build-dir|--only)
      [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --seconds) secs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --sandboxes) sandboxes=$2; shift 2 ;;
    --json) json=1; shift ;;
    --server-cpu) server_cpu=$2; shift 2 ;;
    --load-cpu) load_cpu=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-install) install=0; shift ;;
    --only) only=$2; shift 2 ;;
    --redis-password) redis_password=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n'); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
wants() { [[ ",$only," == *",$1,"* ]]; }
say() { echo "$@" >&2; }
bad() { echo "run.sh: $*" >&2; exit 2; }
for v in rounds workers sandboxes server_cpu load_cpu; do
  [[ ${!v} =~ ^[0-9]+$ ]] || bad "--${v//_/-} ${!v}: not a whole number"
done
[[ $secs =~ ^[0-9]+([.][0-9]+)?$ ]] || bad "--seconds $secs: not a number of seconds"
[ "$rounds" -ge 1 ] || bad "--rounds must be at least 1"
[ "$workers" -ge 1 ] && [ "$sandboxes" -ge 1 ] || bad "--workers and --sandboxes must be at least 1"
IFS=, read -ra only_list <<<"$only"
[ ${#only_list[@]} -gt 0 ] || bad "--only: no system named"
for x in "${only_list[@]}"; do
  case $x in lockd|redis-pexpire|redis-script|redis-hot|etcd) ;;
    *) bad "--only: unknown system '$x' (lockd, redis-pexpire, redis-script, redis-hot, etcd)" ;; esac
done

# --- servers from Debian ---------------------------------------------------------------------
need_pkgs=()
if wants redis-pexpire || wants redis-script || wants redis-hot; then
  command -v redis-server >/dev/null || need_pkgs+=(redis-server)
fi
if wants etcd; then command -v etcd >/dev/null || need_pkgs+=(etcd-server); fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$install" = 0 ] || [ "$(id -u)" != 0 ]; then
    say "run.sh: ${need_pkgs[*]} missing: apt-get install -y ${need_pkgs[*]} (as root), or --only lockd"
    exit 1
  fi
  say "run.sh: installing ${need_pkgs[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${need_pkgs[@]}" >&2
fi

# --- build -----------------------------------------------------------------------------------
if [ "$build" = 1 ]; then
  (cd "$root" && { [ -f "$build_dir/CMakeCache.txt" ] || cmake --preset release >&2; } &&
   nice -n 10 cmake --build "$build_dir" --target leasehold-lockd-load leasehold-peers-load -j2 >&2)
fi
lockd_load=$build_dir/perf/lockd/leasehold-lockd-load
peers_load=$build_dir/perf/peers/leasehold-peers-load
for b in "$lockd_load" "$peers_load"; do [ -x "$b" ] || { say "run.sh: no $b (build it, or drop --no-build)"; exit 1; }; done

# --- a temporary directory, servers stopped on exit --------------------------------------------
tmp=$(mktemp -d /tmp/leasehold-peers-XXXXXX)
server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# Waits until a TCP port on loopback accepts (at most 20 s).
wait_port() {
  for _ in $(seq 200); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
fail_run() {
  say "run.sh: $1 failed; its log:"
  tail -n 20 "$2" >&2 || true
  exit 1
}

start_redis() {
  local port; port=$(free_port)
  mkdir -p "$tmp/redis"
  # In memory, as lockd's refreshes are (lockd's acquires are durable; these keys are not).
  local auth=()
  [ -z "$redis_password" ] || auth=(--requirepass "$redis_password")
  taskset -c "$server_cpu" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
    --dir "$tmp/redis" --daemonize no --logfile "$tmp/redis.log" "${auth[@]}" &
  server_pid=$!
  wait_port "$port" || fail_run "redis-server" "$tmp/redis.log"
  redis_port=$port
}
start_etcd() {
  local port peer; port=$(free_port); peer=$(free_port)
  taskset -c "$server_cpu" etcd --name peers --data-dir "$tmp/etcd-$1" \
    --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "peers=http://127.0.0.1:$peer" --log-level error >"$tmp/etcd.log" 2>&1 &
  server_pid=$!
  wait_port "$port" || fail_run "etcd" "$tmp/etcd.log"
  for _ in $(seq 100); do  # serving once it has elected itself
    curl -fs "http://127.0.0.1:$port/health" 2>/dev/null | grep -q '"health":"true"' && break
    sleep 0.2
  done
  etcd_port=$port
}

say "run.sh: $rounds round(s) of ${secs}s, $workers workers x $sandboxes names; servers on CPU $server_cpu," \
    "generators on CPU $load_cpu; load average $(cut -d' ' -f1-3 /proc/loadavg)"
common=(--workers "$workers" --sandboxes "$sandboxes" --seconds "$secs" --json)
for r in $(seq "$rounds"); do
  if wants lockd; then
    say "round $r: lockd"
    taskset -c "$load_cpu" "$lockd_load" --key-rounds 0 --no-baseline --lockd-cpus "$server_cpu" \
      --lockd-binary "$build_dir/lockd/leasehold-lockd" \
      --store-dir "$tmp" "${common[@]}" >"$tmp/r$r-lockd.json" 2>"$tmp/r$r-lockd.log" ||
      fail_run "leasehold-lockd-load" "$tmp/r$r-lockd.log"
  fi
  for mode in pexpire script hot; do
    wants "redis-$mode" || continue
    say "round $r: redis $mode"
    start_redis
    auth=()
    [ -z "$redis_password" ] || auth=(--password "$redis_password")
    taskset -c "$load_cpu" "$peers_load" redis --port "$redis_port" --mode "$mode" --server-pid "$server_pid" \
      "${auth[@]}" "${common[@]}" >"$tmp/r$r-redis-$mode.json" 2>"$tmp/r$r-redis-$mode.log" ||
      fail_run "leasehold-peers-load redis --mode $mode" "$tmp/r$r-redis-$mode.log"
    stop_server
  done
  if wants etcd; then
    say "round $r: etcd"
    start_etcd "$r"
    taskset -c "$load_cpu" "$peers_load" etcd --endpoint "127.0.0.1:$etcd_port" --server-pid "$server_pid" \
      "${common[@]}" >"$tmp/r$r-etcd.json" 2>"$tmp/r$r-etcd.log" ||
      fail_run "leasehold-peers-load etcd" "$tmp/r$r-etcd.log"
    stop_server
  fi
done

# --- the table ---------------------------------------------------------------------------------
model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
python3 - "$tmp" "$rounds" "$json" "$model" "$(nproc)" "$secs" "$workers" "$sandboxes" <<'PY'
import json, statistics, sys, os, datetime
tmp, rounds, as_json, model, cores, secs, workers, sandboxes = sys.argv[1:]
rounds = int(rounds)
systems = [  # (file key, label, rate field, cpu field)
    ("lockd", "lockd: heartbeats of 29, HMAC-SHA256 each way", "refreshes_per_s", "cpu_s_per_million"),
    ("redis-pexpire", "Redis PEXPIRE, 16 x 64 pipelined, %s", "refreshes_per_s", "cpu_s_per_million"),
    ("redis-script", "Redis script of 25 PEXPIREs, 16 x 64, %s", "refreshes_per_s", "cpu_s_per_million"),
    ("redis-hot", "Redis PEXPIRE of 1 hot key (reference)", "refreshes_per_s", "cpu_s_per_million"),
    ("etcd", "etcd keep-alives, 16 x 64 (1 lease per worker)", "keepalives_per_s", "cpu_s_per_million"),
    ("etcd-names", "etcd names kept alive (keep-alive x %s)" % sandboxes, "names_per_s", "cpu_s_per_million_names"),
]
runs = {}
for key, *_ in systems:
    src = "etcd" if key == "etcd-names" else key
    per = []
    for r in range(1, rounds + 1):
        p = os.path.join(tmp, "r%d-%s.json" % (r, src))
        if os.path.exists(p):
            with open(p) as f:
                per.append(json.loads(f.read().strip().splitlines()[-1]))
    if per:
        runs[key] = per
def busy(x):
    """The share of one CPU the server used while measured."""
    if "runs" in x:  # leasehold-lockd-load: its per-worker-key runs
        r = [y for y in x["runs"] if y["keys"] == "per-worker"]
        return sum(y["lockd_cpu_s"] for y in r) / max(1e-9, sum(y["seconds"] for y in r))
    return x["server_cpu_s"] / max(1e-9, x["seconds"])
def mmm(v):
    return {"min": min(v), "median": statistics.median(v), "max": max(v)} if v else None
summary = []
lockd = runs.get("lockd")
for key, label, rate, cpu in systems:
    if key not in runs:
        continue
    if "%s" in label:
        label = label % ("AUTH" if runs[key][0].get("auth", "").startswith("AUTH") else "no auth")
    rates = [x[rate] for x in runs[key]]
    cpus = [x[cpu] for x in runs[key]]
    row = {"system": key, "label": label, "rate": mmm(rates), "cpu_s_per_million": mmm(cpus),
           "server_cpu_busy": mmm([busy(x) for x in runs[key]])}
    if lockd and key != "lockd" and len(lockd) == len(runs[key]):
        row["lockd_over_peer_rate"] = mmm([l["refreshes_per_s"] / x for l, x in zip(lockd, rates) if x > 0])
        row["peer_over_lockd_cpu"] = mmm([x / l["cpu_s_per_million"] for l, x in zip(lockd, cpus)
                                          if l["cpu_s_per_million"] > 0])
    summary.append(row)
machine = {"cpu": model, "cores": int(cores), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "rounds": rounds, "seconds": float(secs), "workers": int(workers), "sandboxes": int(sandboxes)}
if as_json == "1":
    print(json.dumps({"machine": machine, "summary": summary, "runs": runs}))
    sys.exit(0)
def f3(m, fmt):
    return "%s / %s / %s" % (fmt(m["min"]), fmt(m["median"]), fmt(m["max"])) if m else "-"
def rate_fmt(x):
    return "%.2f M" % (x / 1e6) if x >= 1e6 else "%.0f k" % (x / 1e3) if x >= 1e4 else "%.1f k" % (x / 1e3)
def cpu_fmt(x):
    return "%.2f" % x if x < 10 else "%.0f" % x
def ratio_fmt(x):
    return "%.2fx" % x if x < 10 else "%.0fx" % x
print("%s, %s cores; %s; %d round(s) of %s s; %s workers x %s names"
      % (model, cores, machine["date"], rounds, secs, workers, sandboxes))
print("min / median / max over the rounds; ratios are per round (the same round's lockd run); server busy:"
      " the share of one CPU the server used while measured")
hdr = ("system", "refreshes/s", "server CPU-s per 1M", "server busy", "lockd/peer rate", "peer/lockd CPU")
print("| %s | %s | %s | %s | %s | %s |" % hdr)
print("|---|---|---|---|---|---|")
for row in summary:
    print("| %s | %s | %s | %s | %s | %s |" % (
        row["label"], f3(row["rate"], rate_fmt), f3(row["cpu_s_per_million"], cpu_fmt),
        f3(row["server_cpu_busy"], lambda x: "%.0f%%" % (100 * x)),
        f3(row.get("lockd_over_peer_rate"), ratio_fmt), f3(row.get("peer_over_lockd_cpu"), ratio_fmt)))
PY
