#!/usr/bin/env bash
# A hot sale on a Redis Cluster in one shard against SHARDS shards: `hmdp
# demo --redis-cluster --seckill stream --modes none`, its own cluster of
# three masters and three replicas each round, the two shard counts in one
# demo, their order alternated between rounds. For each count it reports
# admissions per Redis-CPU-second (the masters' user + system CPU over the
# admission scripts the nodes ran, the consumers' reads and acks included)
# and each master's share of the sale's scripts. On a machine with fewer
# cores than masters, throughput cannot grow with the shards; the spread and
# the CPU per admission are what travel between machines.
# Knobs: ROUNDS (default 3), SHARDS (default 6), USERS (default 4000), STOCK
# (default 2000), OUT (JSON dir).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SHARDS=${SHARDS:-6}
USERS=${USERS:-4000}
STOCK=${STOCK:-2000}
OUT=${OUT:-$(mktemp -d -t hmdp-shardbench-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-error}
# shellcheck source=benches/common.sh
. benches/common.sh
build_hmdp

declare -a ONE MANY
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order="1,$SHARDS"; else order="$SHARDS,1"; fi
  json="$OUT/round-$round.json"
  $HMDP demo --redis-cluster --seckill stream --modes none --seckill-shards "$order" \
    --users "$USERS" --stock "$STOCK" --chaos-hold-ms 0 --json "$json" >"$OUT/round-$round.txt" 2>&1
  for shards in 1 "$SHARDS"; do
    row=$(jq -r --argjson n "$shards" '.modes[] | select(.shards == $n) | .masters
      | "\(1e6 / .cpu_us_per_admission) \(.cpu_us_per_admission) \(.admissions) \([.masters[].share * 100 | floor] | join("/"))"' "$json")
    read -r per_cpu_s us admissions shares <<<"$row"
    printf 'round %d  %2d shard(s)  %8.0f admissions per Redis-CPU-second  (%.1f µs each, %d admissions)  masters %s %%\n' \
      "$round" "$shards" "$per_cpu_s" "$us" "$admissions" "$shares"
    if [ "$shards" = 1 ]; then ONE+=("$per_cpu_s"); else MANY+=("$per_cpu_s"); fi
  done
done
one=$(median "${ONE[@]}")
many=$(median "${MANY[@]}")
printf 'admissions per Redis-CPU-second, median of %d rounds: 1 shard %.0f, %d shards %.0f (ratio %.2f)\n' \
  "$ROUNDS" "$one" "$SHARDS" "$many" "$(jq -n "$many / $one")"
echo "JSON and tables in $OUT; cores: $(nproc)"
