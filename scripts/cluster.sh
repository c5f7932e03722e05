#!/usr/bin/env bash
# A lockd cluster on this machine, to try failover by hand: a 3-member etcd and 3 leasehold-lockd
# on loopback, sharing one etcd store (--store etcd://...). One lockd leads; the others answer
# not_leader with its address, and take over within the failover bound when it stops.
#
# Usage: scripts/cluster.sh [DIR]   (DIR: where keys, data and logs go; default a new temp dir)
# Runs in the foreground and prints how to point a supervisor and the CLI at the cluster;
# Ctrl-C (or SIGTERM) stops every process it started. Builds the release binaries (incrementally)
# and needs etcd (scripts/setup.sh installs etcd-server).
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "cluster: unknown option $1 (usage: scripts/cluster.sh [DIR])" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${1:-$(mktemp -d /tmp/leasehold-cluster.XXXXXX)}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

scripts/setup.sh >/dev/null
b=$root/build/release
# Always brought up to date (a no-op when it is): binaries older than the tree would not take
# the flags printed below.
echo "cluster: building the release binaries (cmake --preset release)..."
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)" --target leasehold-lockd leasehold-supervisor leasehold >/dev/null
etcd_bin=$(command -v etcd || true)
[ -n "$etcd_bin" ] || { echo "cluster: etcd is not installed (apt-get install etcd-server)" >&2; exit 1; }

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "cluster: stopped; keys, data and logs stay in $dir"
}
trap cleanup EXIT INT TERM

# Loopback ports: etcd client 2379x, peer 2380x; lockd 740x (x = 1..3). Refuse to start on a taken one.
for port in 23791 23792 23793 23801 23802 23803; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
    echo "cluster: TCP port $port on 127.0.0.1 is taken (another cluster.sh running?)" >&2
    exit 1
  fi
done
initial=m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802,m3=http://127.0.0.1:23803
for i in 1 2 3; do
  "$etcd_bin" --name "m$i" --data-dir "$dir/etcd-m$i" \
    --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
    --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
    --initial-cluster "$initial" --initial-cluster-token "leasehold-$$" --initial-cluster-state new \
    --log-level error >"$dir/etcd-m$i.log" 2>&1 &
  pids+=($!)
done
endpoints=127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793

lockd=$b/lockd/leasehold-lockd
[ -f "$dir/cluster.key" ] || "$lockd" --generate-key "$dir/cluster.key" >/dev/null
[ -f "$dir/signing.key" ] || "$lockd" --generate-signing-key --out "$dir/signing.key" >/dev/null
worker=$(cat /proc/sys/kernel/random/uuid)
[ -f "$dir/worker.key" ] || "$lockd" --derive-worker-key --worker-id "$worker" --key-file "$dir/cluster.key" \
  --out "$dir/worker.key" >/dev/null
addresses=()
for i in 1 2 3; do
  "$lockd" --listen "127.0.0.1:740$i" --store "etcd://$endpoints/leasehold" --key-file "$dir/cluster.key" \
    --signing-key-file "$dir/signing.key" >"$dir/lockd-$i.out" 2>"$dir/lockd-$i.log" &
  pids+=($!)
  addresses+=("127.0.0.1:740$i")
done
lockd_list=$(IFS=,; echo "${addresses[*]}")

# Wait (at most 30 s) until one lockd says it leads.
leader=""
for _ in $(seq 300); do
  for i in 1 2 3; do
    if grep -q "event=leading" "$dir/lockd-$i.log" 2>/dev/null; then leader=$i; break 2; fi
  done
  sleep 0.1
done
if [ -z "$leader" ]; then
  echo "cluster: no lockd leads after 30 s; logs:" >&2
  tail -n 5 "$dir"/lockd-*.log "$dir"/etcd-m*.log >&2
  exit 1
fi

cat <<EOF
cluster: up in $dir
  etcd    $endpoints (pids ${pids[0]} ${pids[1]} ${pids[2]}; logs $dir/etcd-m*.log)
  lockd   $lockd_list (pids ${pids[3]} ${pids[4]} ${pids[5]}; logs $dir/lockd-*.log)
  leader  127.0.0.1:740$leader (pid ${pids[$((leader + 2))]})

Point a supervisor and the CLI at all three (they follow the leader):
  $b/supervisor/leasehold-supervisor --lockd $lockd_list --key-file $dir/worker.key &
  $b/tools/leasehold run --name agent-1 -- /bin/sleep 600
  $b/tools/leasehold names --lockd $lockd_list --key-file $dir/cluster.key
Then fail the leader over, and watch the sandbox keep running:
  kill -9 ${pids[$((leader + 2))]}      # or kill -STOP it for longer than its leadership lease
  grep event= $dir/lockd-*.log          # event=leading on the new leader, event=leader on the others
Ctrl-C stops the cluster.
EOF
wait
