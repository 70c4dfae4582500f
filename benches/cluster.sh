#!/usr/bin/env bash
# The reentrant lock on a Redis Cluster against one Redis server, and the
# cost of waiting for a replica (`--lock-sync-replicas 1`): `hmdp
# bench-lock --lock reentrant`, 50 tasks on distinct keys, on
#   single   one private redis-server,
#   cluster  a private cluster of three masters and three replicas,
#   cluster+WAIT  the same cluster, each lock handed out once a replica
#            acknowledged it,
# alternated ROUNDS times, with each round's cluster/single ratio and the
# median. All servers run on the local machine, on free loopback ports, and are
# removed afterwards; on a machine with fewer cores than servers plus client,
# they share the cores, so the ratio says where the CPU went, not what three
# machines would do.
# Knobs: ROUNDS (default 3), DURATION (s per run, default 3), OUT (JSON dir).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
OUT=${OUT:-$(mktemp -d -t hmdp-clusterbench-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-error}
# shellcheck source=benches/common.sh
. benches/common.sh
build_hmdp

DIR=$(mktemp -d -t hmdp-cluster-XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_server() { # port, extra args...
  local port=$1; shift
  mkdir -p "$DIR/$port"
  (cd "$DIR/$port" && redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/$port/pid" "$@" >/dev/null)
}
cleanup() {
  for pid in "$DIR"/*/pid; do [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

SINGLE=$(free_port)
start_server "$SINGLE"
PORTS=()
for _ in 1 2 3 4 5 6; do
  port=$(free_port)
  # The cluster bus would be port + 10000, past 65535 for a high free port.
  start_server "$port" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --cluster-port "$(free_port)"
  PORTS+=("$port")
done
sleep 0.5
NODES=()
for port in "${PORTS[@]}"; do NODES+=("127.0.0.1:$port"); done
redis-cli --cluster create "${NODES[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
for _ in $(seq 1 100); do
  replicas=$(redis-cli -p "${PORTS[0]}" cluster nodes | awk '$3 ~ /slave/' | wc -l)
  state=$(redis-cli -p "${PORTS[0]}" cluster info | tr -d '\r' | awk -F: '$1=="cluster_state"{print $2}')
  [ "$state" = ok ] && [ "$replicas" -eq 3 ] && break
  sleep 0.2
done
CLUSTER_URL="redis+cluster://$(IFS=,; echo "${NODES[*]}")"

bench() { # name, url, extra flags...
  local name=$1 url=$2; shift 2
  $HMDP bench-lock --lock reentrant --redis-url "$url" --concurrency 50 --duration "$DURATION" \
    --json "$OUT/$name.json" "$@" >/dev/null
  jq -r '"\(.pairs_per_s) \(.p50_ms)"' "$OUT/$name.json"
}
declare -a RATIOS WAIT_RATIOS
for round in $(seq 1 "$ROUNDS"); do
  read -r single single_p50 <<<"$(bench "single-$round" "redis://127.0.0.1:$SINGLE/0")"
  read -r cluster cluster_p50 <<<"$(bench "cluster-$round" "$CLUSTER_URL")"
  read -r waited waited_p50 <<<"$(bench "wait-$round" "$CLUSTER_URL" --lock-sync-replicas 1)"
  ratio=$(jq -n "$cluster / $single")
  wait_ratio=$(jq -n "$waited / $cluster")
  printf 'round %d  single %7.0f pairs/s (p50 %.3f ms)  cluster %7.0f (p50 %.3f ms)  cluster+WAIT %7.0f (p50 %.3f ms)  cluster/single %.2f  WAIT/no WAIT %.2f\n' \
    "$round" "$single" "$single_p50" "$cluster" "$cluster_p50" "$waited" "$waited_p50" "$ratio" "$wait_ratio"
  RATIOS+=("$ratio")
  WAIT_RATIOS+=("$wait_ratio")
done
printf 'reentrant, 50 tasks, distinct keys: cluster (3 masters) / one server, median of %d rounds: %.2f (target >= 2 on a machine with a core per master)\n' \
  "$ROUNDS" "$(median "${RATIOS[@]}")"
printf 'reentrant on the cluster: with --lock-sync-replicas 1 / without, median of %d rounds: %.2f\n' \
  "$ROUNDS" "$(median "${WAIT_RATIOS[@]}")"
echo "JSON in $OUT; cores: $(nproc)"
