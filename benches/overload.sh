#!/usr/bin/env bash
# Load shedding under twice the load and more: two `--seckill sync` nodes
# (reentrant lock) behind nginx, each shedding past its latency target
# (--shed-latency-ms), and for each side the same nodes with shedding off.
# For each, a sale at LOW buyers at once (the unloaded latency), then at
# HIGH buyers at once, while a probe asks nginx -> /health every 20 ms: the
# p99 of the purchases answered with an order, what was shed (503), and
# the probe's p99 and worst.
#
#   benches/overload.sh      # knobs: USERS (12000), LOW (32), HIGH (1024), TARGET_MS (100)
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-12000}
LOW=${LOW:-32}
HIGH=${HIGH:-1024}
TARGET_MS=${TARGET_MS:-100}
OUT=${OUT:-$(mktemp -d -t hmdp-overload-XXXXXX)}
export RUST_LOG=${RUST_LOG:-warn}
# shellcheck source=benches/common.sh
. benches/common.sh
build_hmdp
command -v jq >/dev/null 2>&1 || { echo "benches/overload.sh needs jq" >&2; exit 1; }
trap stop_nodes EXIT

# Asks nginx -> /health every 20 ms until the file named second appears;
# the seconds each took, one per line, into the first.
probe() { # out file, stop file
  while [ ! -e "$2" ]; do
    curl -s -o /dev/null -w '%{time_total}\n' "$HMDP_TARGET/health" >>"$1"
    sleep 0.02
  done
}
percentile() { # file, fraction -> ms
  sort -n "$1" | awk -v q="$2" '{ v[NR] = $1 } END { i = int(NR * q); if (i < 1) i = 1; printf "%.1f", v[i] * 1000 }'
}
sale() { # label, concurrency
  local json=$OUT/$1.json
  rm -f "$OUT/probe.txt" "$OUT/stop"
  probe "$OUT/probe.txt" "$OUT/stop" &
  local prober=$!
  pair_loadtest --workload sale --users "$USERS" --tokens "$OUT/tokens.txt" --concurrency "$2" \
    --json "$json" >/dev/null
  touch "$OUT/stop"
  wait "$prober"
  printf '%-28s %5s buyers at once: %6.0f orders/s, ordered p99 %7.1f ms, shed %6s, /health p99 %6s ms, worst %6s ms\n' \
    "$1" "$2" "$(jq .orders_per_s "$json")" "$(jq .ordered_latency_ms.p99 "$json")" \
    "$(jq '.outcomes.OVERLOADED // 0' "$json")" "$(percentile "$OUT/probe.txt" 0.99)" \
    "$(percentile "$OUT/probe.txt" 1)"
}

for shed in "$TARGET_MS" 0; do
  HMDP_SHED_LATENCY_MS=$shed start_nodes "$OUT/nodes.env" "$OUT/nodes.log" --lock reentrant --seckill sync
  # shellcheck disable=SC1091 # HMDP_TARGET=..., DATABASE_URL=..., ...
  . "$OUT/nodes.env"
  pair_tokens "$USERS" "$OUT/tokens.txt"
  sale "warm-up, shed ${shed} ms" 64 >/dev/null
  sale "shed past ${shed} ms" "$LOW"
  sale "shed past ${shed} ms" "$HIGH"
  stop_nodes
done
