#!/usr/bin/env bash
# The lock crate's own cost against the client library it is built on:
# `hmdp bench-lock` for redis-lua and reentrant, each right after the same
# 50-task loop as bare redis-rs commands (`--baseline`: SET NX PX, then EVALSHA
# of a compare-and-delete) on the same kind of connection, ROUNDS times, and
# each round's ratio (lock pairs/s / bare pairs/s) with the median.
#
# Both kinds of connection are measured, each side of a ratio on the same
# one: `multiplexed` (a plain MultiplexedConnection: the lock's code against
# redis-rs's, the target's ratio) and `reconnecting` (the ConnectionManager the
# nodes run, which reconnects by itself at a little work per command).
# Knobs: ROUNDS (default 5), DURATION (s per run, default 3), OUT (JSON dir).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-3}
OUT=${OUT:-$(mktemp -d -t hmdp-lockbench-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-warn}
# shellcheck source=benches/common.sh
. benches/common.sh
build_hmdp
CONNECTIONS=(multiplexed reconnecting)
declare -A RATIOS
for round in $(seq 1 "$ROUNDS"); do
  for connection in "${CONNECTIONS[@]}"; do
    for mode in redis-lua reentrant; do
      run="$mode-$connection-$round"
      $HMDP bench-lock --lock "$mode" --connection "$connection" --baseline --concurrency 50 --duration "$DURATION" --json "$OUT/bare-$run.json" >/dev/null
      $HMDP bench-lock --lock "$mode" --connection "$connection" --concurrency 50 --duration "$DURATION" --json "$OUT/lock-$run.json" >/dev/null
      line=$(jq -rn --slurpfile b "$OUT/bare-$run.json" --slurpfile l "$OUT/lock-$run.json" \
        '"\($l[0].pairs_per_s / $b[0].pairs_per_s) \($l[0].pairs_per_s) \($l[0].p50_ms) \($b[0].pairs_per_s) \($b[0].p50_ms)"')
      read -r ratio lock lock_p50 bare bare_p50 <<<"$line"
      printf 'round %d %-12s %-9s lock %7.0f pairs/s (p50 %.3f ms)  bare redis-rs %7.0f pairs/s (p50 %.3f ms)  ratio %.3f\n' \
        "$round" "$connection" "$mode" "$lock" "$lock_p50" "$bare" "$bare_p50" "$ratio"
      RATIOS[$mode-$connection]="${RATIOS[$mode-$connection]:-} $ratio"
    done
  done
done
for connection in "${CONNECTIONS[@]}"; do
  for mode in redis-lua reentrant; do
    # shellcheck disable=SC2086 # one word per round
    printf '%-9s lock / bare redis-rs loop, %-12s connection, median of %d rounds: %.3f%s\n' "$mode" "$connection" "$ROUNDS" \
      "$(median ${RATIOS[$mode-$connection]})" \
      "$([ "$connection" = multiplexed ] && echo ' (target >= 0.9)')"
  done
done
