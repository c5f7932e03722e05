#!/usr/bin/env bash
# A lockd cluster on this machine, to try failover by hand: a 3-member etcd and 3 leasehold-lockd
# per shard on loopback, sharing one etcd store (--store etcd://...). Per shard one lockd leads;
# the others answer not_leader with its address, and take over within the failover bound when it
# stops. With --shards S (1..50, default 1), 3 x S lockd: replica r of shard K on port 7400+10K+r.
#
# Usage: scripts/cluster.sh [--shards S] [DIR]   (DIR: keys, data and logs; default a new temp dir)
# Runs in the foreground and prints how to point a supervisor and the CLI at the cluster;
# Ctrl-C (or SIGTERM) stops every process it started. Builds the release binaries (incrementally)
# and needs etcd (scripts/setup.sh installs etcd-server).
set -euo pipefail
usage="usage: scripts/cluster.sh [--shards S] [DIR]"
shards=1
dir_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --shards)
      [ $# -ge 2 ] || { echo "cluster: --shards needs a count ($usage)" >&2; exit 2; }
      shards=$2; shift 2 ;;
    --shards=*) shards=${1#--shards=}; shift ;;
    -*) echo "cluster: unknown option $1 ($usage)" >&2; exit 2 ;;
    *)
      [ -z "$dir_arg" ] || { echo "cluster: one DIR at most ($usage)" >&2; exit 2; }
      dir_arg=$1; shift ;;
  esac
done
if ! [[ "$shards" =~ ^[0-9]+$ ]] || [ "$shards" -lt 1 ] || [ "$shards" -gt 50 ]; then
  echo "cluster: --shards $shards is not a count in 1..50 ($usage)" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${dir_arg:-$(mktemp -d /tmp/leasehold-cluster.XXXXXX)}
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

# Loopback ports: etcd client 2379x, peer 2380x (x = 1..3); refuse to start on a taken one.
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
# Replica r (1..3) of shard K (0..S-1) listens on 7400 + 10K + r; its log is lockd-r.log with
# one shard (as before shards), lockd-K-r.log with several.
port_of() { echo $((7400 + 10 * $1 + $2)); }
tag_of() { if [ "$shards" -eq 1 ]; then echo "$2"; else echo "$1-$2"; fi; }
addresses=()
declare -A lockd_pid=()
for k in $(seq 0 $((shards - 1))); do
  for i in 1 2 3; do
    tag=$(tag_of "$k" "$i")
    shard_flags=()
    [ "$shards" -eq 1 ] || shard_flags=(--shards "$shards" --shard "$k")
    "$lockd" --listen "127.0.0.1:$(port_of "$k" "$i")" --store "etcd://$endpoints/leasehold" \
      --key-file "$dir/cluster.key" --signing-key-file "$dir/signing.key" "${shard_flags[@]}" \
      >"$dir/lockd-$tag.out" 2>"$dir/lockd-$tag.log" &
    pids+=($!)
    lockd_pid[$tag]=$!
    addresses+=("127.0.0.1:$(port_of "$k" "$i")")
  done
done
lockd_list=$(IFS=,; echo "${addresses[*]}")

# Wait (at most 30 s) until one lockd of every shard says it leads.
declare -A leader=()
for _ in $(seq 300); do
  for k in $(seq 0 $((shards - 1))); do
    [ -z "${leader[$k]:-}" ] || continue
    for i in 1 2 3; do
      if grep -q "event=leading" "$dir/lockd-$(tag_of "$k" "$i").log" 2>/dev/null; then leader[$k]=$i; break; fi
    done
  done
  [ "${#leader[@]}" -lt "$shards" ] || break
  sleep 0.1
done
if [ "${#leader[@]}" -lt "$shards" ]; then
  echo "cluster: not every shard has a leader after 30 s; logs:" >&2
  tail -n 5 "$dir"/lockd-*.log "$dir"/etcd-m*.log >&2
  exit 1
fi

lockd_pids="${pids[*]:3}"
first=$(tag_of 0 "${leader[0]}")
if [ "$shards" -eq 1 ]; then
  leaders="  leader  127.0.0.1:$(port_of 0 "${leader[0]}") (pid ${lockd_pid[$first]})"
  who="all three (they follow the leader)"
  fail="fail the leader over"
else
  leaders=""
  for k in $(seq 0 $((shards - 1))); do
    [ -z "$leaders" ] || leaders+=$'\n'
    leaders+="  shard $k leader  127.0.0.1:$(port_of "$k" "${leader[$k]}") (pid ${lockd_pid[$(tag_of "$k" "${leader[$k]}")]})"
  done
  who="every lockd (they follow each shard's leader; names hash to shards)"
  fail="fail shard 0's leader over (the other shards' leaders are not disturbed)"
fi

cat <<EOF
cluster: up in $dir
  etcd    $endpoints (pids ${pids[0]} ${pids[1]} ${pids[2]}; logs $dir/etcd-m*.log)
  lockd   $lockd_list (pids $lockd_pids; logs $dir/lockd-*.log)
$leaders

Point a supervisor and the CLI at $who:
  $b/supervisor/leasehold-supervisor --lockd $lockd_list --key-file $dir/worker.key &
  $b/tools/leasehold run --name agent-1 -- /bin/sleep 600
  $b/tools/leasehold names --lockd $lockd_list --key-file $dir/cluster.key
Then $fail, and watch the sandbox keep running:
  kill -9 ${lockd_pid[$first]}      # or kill -STOP it for longer than its leadership lease
  grep event= $dir/lockd-*.log          # event=leading on the new leader, event=leader on the others
Ctrl-C stops the cluster.
EOF
wait
