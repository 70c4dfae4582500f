#!/usr/bin/env bash
# Where the CPU goes during the synchronous sale of benches/run.sh's row 4:
# two `--seckill sync` nodes behind nginx (reentrant lock), USERS buyers,
# CONCURRENCY at once, sampled with `perf record` over every process for
# SAMPLE_SECONDS in the middle of the sale, call stacks unwound from the
# binaries' own unwind tables (`--call-graph dwarf`: no rebuild with frame
# pointers).
# Prints the share of the samples of each process and of the cores idle,
# then the frames that hold at least MIN_PERCENT of the nodes' own
# samples, callees included (`perf report --children`).
#
#   benches/node-profile.sh
#
# Knobs: USERS (default 30000: the sale outlasts the sampling), CONCURRENCY
# (64), SAMPLE_SECONDS (2), MIN_PERCENT (5), OUT (the recording and the
# reports, default a temporary directory). Needs `perf` (Debian:
# linux-perf) and the right to sample every process (root, or
# kernel.perf_event_paranoid at -1).
set -euo pipefail
cd "$(dirname "$0")/.."
USERS=${USERS:-30000}
CONCURRENCY=${CONCURRENCY:-64}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-2}
MIN_PERCENT=${MIN_PERCENT:-5}
OUT=${OUT:-$(mktemp -d -t hmdp-profile-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-warn}
export HMDP_DB_POOL=${HMDP_DB_POOL:-4}
# shellcheck source=benches/common.sh
. benches/common.sh
build_hmdp
command -v perf >/dev/null 2>&1 || { echo "benches/node-profile.sh needs perf (Debian: linux-perf)" >&2; exit 1; }
command -v jq >/dev/null 2>&1 || { echo "benches/node-profile.sh needs jq" >&2; exit 1; }

trap stop_nodes EXIT
start_nodes "$OUT/nodes.env" "$OUT/nodes.log" --lock reentrant --seckill sync
# shellcheck disable=SC1091 # HMDP_TARGET=..., DATABASE_URL=..., ...
. "$OUT/nodes.env"
pair_tokens "$USERS" "$OUT/tokens.txt"
sale() { # json
  pair_loadtest --users "$USERS" --tokens "$OUT/tokens.txt" --workload sale --concurrency "$CONCURRENCY" \
    --json "$1" >/dev/null
}
# Warm-up: connections opened, statements prepared.
sale "$OUT/warm-up.json"

# The sampling starts once the sale's opening is behind it.
sale "$OUT/sale.json" &
SALE=$!
sleep 0.5
# The load generator: the sale's subshell and the `hmdp` it runs.
# shellcheck disable=SC2207 # pids split on purpose
LOAD_GENERATOR=("$SALE" $(pgrep -P "$SALE" || true))
perf record --all-cpus --call-graph dwarf,16384 --freq 999 --output "$OUT/perf.data" \
  -- sleep "$SAMPLE_SECONDS" 2>"$OUT/perf-record.log"
wait "$SALE"
elapsed=$(jq -r .elapsed_s "$OUT/sale.json")
if awk -v e="$elapsed" -v s="$SAMPLE_SECONDS" 'BEGIN { exit !(e < s + 0.5) }'; then
  echo "the sale lasted ${elapsed}s, not past the sampling: raise USERS" >&2
  exit 1
fi
printf '== the sale: %s orders/s, %s buyers at once; sampled %s s of it\n' \
  "$(jq -r '.orders_per_s | floor' "$OUT/sale.json")" "$CONCURRENCY" "$SAMPLE_SECONDS"

# The pids given as `perf report --pid` takes them, comma-separated.
pid_list() { # pids...
  local IFS=,
  echo "$*"
}
# The share of the samples of the processes given (pid 0: the cores idle).
share() { # pids...
  perf report --input "$OUT/perf.data" --no-children --pid "$(pid_list "$@")" --sort pid --call-graph none \
    --stdio 2>/dev/null | awk '/^ +[0-9.]+%/ { s += $1 } END { printf "%.1f%%", s }'
}
# shellcheck disable=SC2086,SC2046 # the pid lists split on purpose
printf '\n== the samples by process: nodes %s, MariaDB %s, Redis %s, nginx %s, load generator %s; idle %s\n' \
  "$(share $HMDP_NODE_PIDS)" "$(share "$(mariadb_pid)")" "$(share "$(redis_pid)")" \
  "$(share $HMDP_NGINX_PID $(pgrep -P "$HMDP_NGINX_PID" || true))" "$(share "${LOAD_GENERATOR[@]}")" "$(share 0)"

# Left out: unresolved addresses, and the threads' entry frames, under which
# every sample of a thread lies (some twice over, a frame shown twice in a
# stack).
THREAD_ENTRY='start_thread|clone3|<std::sys::thread::unix::Thread>::new::thread_start|std::sys::backtrace::__rust_begin_short_backtrace|core::ops::function::FnOnce::call_once\{\{vtable\.shim\}\}'
printf '\n== the nodes: frames with at least %s%% of their samples, callees included\n' "$MIN_PERCENT"
# shellcheck disable=SC2086 # the nodes' pid list splits on purpose
perf report --input "$OUT/perf.data" --children --pid "$(pid_list $HMDP_NODE_PIDS)" --percentage relative \
  --sort sym --call-graph none --percent-limit "$MIN_PERCENT" --stdio 2>/dev/null |
  awk '/^ +[0-9.]+%/ && !/\[\.\] 0x[0-9a-f]+$/ && !/\] ('"$THREAD_ENTRY"')$/' | cut -c1-160 | tee "$OUT/nodes.txt"
echo "(perf.data and the reports in $OUT)"
