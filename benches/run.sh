#!/usr/bin/env bash
# The performance figures of the README, measured side by side in one run and
# compared as ratios (absolute numbers move with the machine and its load):
#
#   redis-benchmark -c 1 / -c 50   EVALSHA of lua/unlock.lua: the Redis ceiling
#   hmdp bench-lock                redis-lua and reentrant: 50 tasks on distinct
#                                  keys, 1 task, 50 tasks on one hot key
#   hmdp bench-db                  the bare purchase transaction, best of a few
#                                  concurrencies: the MySQL ceiling
#   hmdp cluster + wrk             nginx -> /health of two nodes: the HTTP ceiling
#   hmdp loadtest --workload       `sale` and `storm` through nginx, two nodes,
#                                  `reentrant`; then the nodes' peak RSS
#
# and prints the six ratios of the performance targets with PASS/FAIL.
# Installs/starts MariaDB, Redis and nginx (scripts/services.sh) and wrk where
# missing. Knobs (environment): DURATION (s per benchmark, default 5), USERS
# (load-test users, default 4000), PER_USER (storm purchases per user, 5),
# OUT (directory for the JSON results, default a temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
USERS=${USERS:-4000}
PER_USER=${PER_USER:-5}
OUT=${OUT:-$(mktemp -d -t hmdp-bench-XXXXXX)}
mkdir -p "$OUT"
REDIS_HOST=127.0.0.1
REDIS_PORT=6379
export RUST_LOG=${RUST_LOG:-warn}

scripts/services.sh
if ! command -v wrk >/dev/null 2>&1 && ! command -v oha >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq wrk >/dev/null
fi
command -v jq >/dev/null 2>&1 || { echo "benches/run.sh needs jq" >&2; exit 1; }
cargo build --release --locked --bin hmdp
HMDP=target/release/hmdp

say() { printf '\n== %s\n' "$*"; }
num() { jq -r "$1" "$2"; } # jq filter, file

# --- Redis ceiling: redis-benchmark, EVALSHA of the compare-and-delete script.
say "redis-benchmark EVALSHA lua/unlock.lua"
SHA=$(redis-cli -h $REDIS_HOST -p $REDIS_PORT SCRIPT LOAD "$(cat lua/unlock.lua)")
redis_bench() { # clients, requests -> CSV row: "test","rps","avg","min","p50",...
  redis-benchmark -h $REDIS_HOST -p $REDIS_PORT -c "$1" -n "$2" --csv \
    EVALSHA "$SHA" 1 bench:run:key token | tail -1 | tr -d '"'
}
RB1=$(redis_bench 1 $((8000 * DURATION)))
RB50=$(redis_bench 50 $((40000 * DURATION)))
RB1_P50=$(cut -d, -f5 <<<"$RB1")
RB1_RPS=$(cut -d, -f2 <<<"$RB1")
RB50_RPS=$(cut -d, -f2 <<<"$RB50")
echo "-c 1:  $RB1_RPS requests/s, p50 $RB1_P50 ms"
echo "-c 50: $RB50_RPS requests/s"

# --- hmdp's locks alone.
for mode in redis-lua reentrant; do
  say "bench-lock $mode"
  $HMDP bench-lock --lock "$mode" --concurrency 50 --duration "$DURATION" --keys distinct --json "$OUT/lock-$mode-50.json"
  $HMDP bench-lock --lock "$mode" --concurrency 1 --duration "$DURATION" --keys distinct --json "$OUT/lock-$mode-1.json"
  $HMDP bench-lock --lock "$mode" --concurrency 50 --duration "$DURATION" --keys one --lock-wait-ms 2000 --json "$OUT/lock-$mode-hot.json"
done

# --- MySQL ceiling: the bare transaction at a few concurrencies, best kept.
say "bench-db"
DB_BEST=0
for c in 4 8 16 32; do
  $HMDP bench-db --concurrency $c --duration "$DURATION" --json "$OUT/db-$c.json"
  DB_BEST=$(jq -r --argjson best "$DB_BEST" '[.tx_per_s, $best] | max' "$OUT/db-$c.json")
done

# --- Two nodes behind nginx with `reentrant`.
say "two nodes behind nginx (reentrant)"
rm -f "$OUT/cluster.env"
$HMDP cluster --lock reentrant --env-file "$OUT/cluster.env" >"$OUT/cluster.log" 2>&1 &
CLUSTER=$!
trap 'kill $CLUSTER 2>/dev/null || true; wait $CLUSTER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$OUT/cluster.env" ] && break
  kill -0 $CLUSTER 2>/dev/null || { cat "$OUT/cluster.log" >&2; exit 1; }
  sleep 0.1
done
set -a
# shellcheck disable=SC1091
. "$OUT/cluster.env"
set +a
echo "nginx at $HMDP_TARGET, node pids $HMDP_NODE_PIDS"

if command -v wrk >/dev/null 2>&1; then
  wrk -t 2 -c 64 -d "${DURATION}s" "$HMDP_TARGET/health" | tee "$OUT/wrk-health.txt"
  HEALTH_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$OUT/wrk-health.txt")
else
  oha --no-tui -c 64 -z "${DURATION}s" --json "$HMDP_TARGET/health" >"$OUT/oha-health.json"
  HEALTH_RPS=$(jq -r '.summary.requestsPerSec' "$OUT/oha-health.json")
fi

$HMDP tokens --target "$HMDP_TARGET" --users "$USERS" --out "$OUT/tokens.txt"
say "loadtest sale: $USERS users, one purchase each, stock $USERS"
$HMDP loadtest --target "$HMDP_TARGET" --workload sale --users "$USERS" \
  --tokens "$OUT/tokens.txt" --concurrency 64 --verify --json "$OUT/sale.json"
say "loadtest storm: $USERS users x $PER_USER purchases at once, stock $(( (USERS + 9) / 10 ))"
$HMDP loadtest --target "$HMDP_TARGET" --workload storm --users "$USERS" --per-user "$PER_USER" \
  --tokens "$OUT/tokens.txt" --concurrency 200 --verify --json "$OUT/storm.json"

RSS_KB=0
for pid in $HMDP_NODE_PIDS; do
  kb=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status")
  echo "node pid $pid peak RSS $((kb / 1024)) MiB"
  [ "$kb" -gt "$RSS_KB" ] && RSS_KB=$kb
done
kill $CLUSTER
wait $CLUSTER 2>/dev/null || true
trap - EXIT

# --- The six ratios.
L=$OUT/lock
verdict() { # value, op, target
  if awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN { exit !((op == ">=") ? v >= t : v <= t) }'; then
    echo PASS
  else
    echo FAIL
  fi
}
row() { # label, value, op, target, detail
  printf '%-58s %7.2f %s %-5s %s   %s\n' "$1" "$2" "$3" "$4" "$(verdict "$2" "$3" "$4")" "$5"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }

LUA50=$(num .pairs_per_s "$L-redis-lua-50.json")
RE50=$(num .pairs_per_s "$L-reentrant-50.json")
LUA1=$(num .p50_ms "$L-redis-lua-1.json")
RE1=$(num .p50_ms "$L-reentrant-1.json")
HANDOFF=$(num .handoff_round_trips "$L-reentrant-hot.json")
SALE=$(num .orders_per_s "$OUT/sale.json")
STORM=$(num .rps "$OUT/storm.json")
RSS_MIB=$(awk -v kb="$RSS_KB" 'BEGIN { printf "%.1f", kb / 1024 }')

say "ratios (targets of the performance issue; results in $OUT)"
row "1a redis-lua pairs/s (50 tasks) / redis-benchmark -c 50" "$(ratio "$LUA50" "$RB50_RPS")" ">=" 1 \
  "$(printf '%.0f / %.0f' "$LUA50" "$RB50_RPS")"
row "1b reentrant pairs/s (50 tasks) / redis-benchmark -c 50" "$(ratio "$RE50" "$RB50_RPS")" ">=" 1 \
  "$(printf '%.0f / %.0f' "$RE50" "$RB50_RPS")"
row "2a redis-lua pair p50 (1 task) / redis-benchmark -c 1 p50" "$(ratio "$LUA1" "$RB1_P50")" "<=" 2.5 \
  "$LUA1 ms / $RB1_P50 ms"
row "2b reentrant pair p50 (1 task) / redis-benchmark -c 1 p50" "$(ratio "$RE1" "$RB1_P50")" "<=" 2.5 \
  "$RE1 ms / $RB1_P50 ms"
row "3  reentrant hot-key hand-off p50, in Redis round trips" "$HANDOFF" "<=" 2 \
  "$(num .handoff_p50_ms "$L-reentrant-hot.json") ms / free-key acquisition p50 $(num .acquire_p50_ms "$L-reentrant-hot.json") ms"
row "4  sale orders/s (nginx, 2 nodes) / bench-db best tx/s" "$(ratio "$SALE" "$DB_BEST")" ">=" 0.6 \
  "$(printf '%.0f / %.0f' "$SALE" "$DB_BEST")"
row "5  storm requests/s / nginx -> /health requests/s" "$(ratio "$STORM" "$HEALTH_RPS")" ">=" 0.5 \
  "$(printf '%.0f / %.0f' "$STORM" "$HEALTH_RPS")"
row "6  peak RSS of a node, MiB" "$RSS_MIB" "<=" 64 "VmHWM after sale and storm"
