#!/usr/bin/env bash
# Two builds of hmdp compared on one purchase path's own sides of
# benches/run.sh's rows, ROUNDS times, on two
# nodes behind nginx:
#
#   SECKILL=stream (default)  the stream sale's admissions/s (row 9's
#                             numerator) and the consumers' orders/s on a
#                             backlog (bench-drain, row 10's numerator)
#   SECKILL=sync              the synchronous sale's orders/s (row 4's
#                             numerator, row 9's denominator) and its CPU
#                             per order: the nodes', and all processes'
#                             but the load generator's (row 11's numerator)
#
# The ceilings (bench-db, nginx -> /health) are left out: compare them with
# run.sh when a change touches them.
#
#   OLD=path/to/old/hmdp NEW=target/release/hmdp SECKILL=sync benches/sides.sh
#
# Knobs: ROUNDS (default 2), USERS (default 4000; bench-drain writes five
# times as many orders), DRIVER (the hmdp that logs in, loads and drains on
# both sides; default: each side's own), ADDRESSES (how many loopback source
# addresses the buyers are spread over, with a DRIVER that has
# `loadtest --addresses`; default 1). With the nodes' limits on
# (HMDP_LIMITS=on, which an old build ignores), per-address limits would
# refuse one address's thousands of buyers; 1024 addresses keep each under
# its default rate:
#
#   HMDP_LIMITS=on DRIVER=target/release/hmdp ADDRESSES=1024 OLD=… NEW=… benches/sides.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/common.sh
. benches/common.sh
OLD=${OLD:?the old hmdp binary} NEW=${NEW:?the new hmdp binary}
ROUNDS=${ROUNDS:-2} USERS=${USERS:-4000} SECKILL=${SECKILL:-stream}
DRIVER=${DRIVER:-} ADDRESSES=${ADDRESSES:-1}
OUT=$(mktemp -d)
MARIADB_PID=$(mariadb_pid)
REDIS_PID=$(redis_pid)
export HMDP_DB_POOL=4
export RUST_LOG=${RUST_LOG:-warn}
trap stop_nodes EXIT
# The sale's answers that were not success, when there were any: a limit or
# a shed purchase makes a side's rate another measurement.
refused() { # loadtest JSON
  jq -r '[.outcomes | to_entries[] | select(.key != "OK") | "\(.key) \(.value)"] | join(", ")
    | if . == "" then "" else " (" + . + ")" end' "$1"
}
side() { # label, binary, round
  local label=$1 round=$3 env=$OUT/$1.env
  HMDP=$2
  local driver=${DRIVER:-$2} spread=()
  [ "$ADDRESSES" -gt 1 ] && spread=(--addresses "$ADDRESSES")
  start_nodes "$env" "$OUT/$label-$round.log" --lock reentrant --seckill "$SECKILL"
  # shellcheck disable=SC1090 # HMDP_TARGET=..., DATABASE_URL=..., ...
  . "$env"
  local backend=(--database-url "$DATABASE_URL" --redis-url "$REDIS_URL" --redis-prefix "$HMDP_REDIS_PREFIX")
  "$driver" tokens --target "$HMDP_TARGET" "${backend[@]:2}" --users "$USERS" --out "$OUT/tokens-$label.txt" >/dev/null
  local nodes=() before after all_before all_after
  read -r -a nodes <<<"$HMDP_NODE_PIDS"
  for run in warm-up sale; do
    before=$(cpu_s "${nodes[@]}") all_before=$(cpu_s "$MARIADB_PID" "${nodes[@]}" "$REDIS_PID" "$HMDP_NGINX_PID")
    "$driver" loadtest --target "$HMDP_TARGET" "${backend[@]}" --admin-token "$HMDP_ADMIN_TOKEN" --workload sale \
      --users "$USERS" --tokens "$OUT/tokens-$label.txt" --concurrency 64 "${spread[@]}" --verify \
      --json "$OUT/$run-$label-$round.json" >/dev/null
    after=$(cpu_s "${nodes[@]}") all_after=$(cpu_s "$MARIADB_PID" "${nodes[@]}" "$REDIS_PID" "$HMDP_NGINX_PID")
  done
  if [ "$SECKILL" = sync ]; then
    local orders
    orders=$(jq -r '.outcomes.OK // 0' "$OUT/sale-$label-$round.json")
    printf '%s round %s: sync sale orders/s %.0f, CPU per order: nodes %s µs, with MariaDB, Redis and nginx %s µs%s\n' \
      "$label" "$round" "$(jq -r .rps "$OUT/sale-$label-$round.json")" "$(per_unit "$before" "$after" "$orders")" \
      "$(per_unit "$all_before" "$all_after" "$orders")" "$(refused "$OUT/sale-$label-$round.json")"
  else
    "$driver" bench-drain "${backend[@]}" --orders $((USERS * 5)) --json "$OUT/drain-$label-$round.json" >/dev/null
    printf '%s round %s: stream sale admissions/s %.0f, bench-drain orders/s %.0f%s\n' "$label" "$round" \
      "$(jq -r .rps "$OUT/sale-$label-$round.json")" "$(jq -r .written_per_s "$OUT/drain-$label-$round.json")" \
      "$(refused "$OUT/sale-$label-$round.json")"
  fi
  stop_nodes
  UPS=()
}
# Which build goes first alternates round by round: whatever a run leaves
# behind on the shared servers weighs on both sides alike.
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then
    side old "$OLD" "$round"
    side new "$NEW" "$round"
  else
    side new "$NEW" "$round"
    side old "$OLD" "$round"
  fi
done
