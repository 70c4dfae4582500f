#!/usr/bin/env bash
# Where a request's CPU goes, by process, on two `--seckill stream` nodes
# behind nginx (reentrant lock): wrk -> nginx -> /health, the storm
# (USERS x 5 purchases at once, stock USERS / 10) and the sale (USERS
# users, one purchase each, every request an order), each followed by the
# CPU that the nodes, nginx, Redis, MariaDB and the load generator used in
# it, from /proc, in µs per request. Then the answers that must stay cheap
# in a crowd: a purchase refused by the user's limit (429), and a purchase
# of a sold-out voucher asked of each node on its own (the one that saw it
# sell out, and the one that heard it).
#
#   benches/cpu-per-request.sh                  # this checkout's release build
#   benches/cpu-per-request.sh OLD_BIN NEW_BIN  # two builds of `hmdp`, alternated
#
# With several binaries each runs RUNS times (default 2), in turn, on a
# pair of nodes of its own, so that the machine's drift hits them alike; compare
# only figures of one invocation. Knobs: RUNS, USERS (default 4000), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
USERS=${USERS:-4000}
OUT=${OUT:-$(mktemp -d -t hmdp-cpu-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-warn}
export HMDP_DB_POOL=${HMDP_DB_POOL:-4}
# The limits on at their defaults, but for those this machine's one address
# would trip as if it were one client: per address, and the logins of the
# load's users.
export HMDP_LIMITS=on HMDP_LIMIT_PURCHASE_IP=off HMDP_LIMIT_CODE_IP=off HMDP_LIMIT_CODE_ALL=off \
  HMDP_LIMIT_LOGIN_IP=off HMDP_LIMIT_LOGIN_ALL=off
# shellcheck source=benches/common.sh
. benches/common.sh
if [ $# -eq 0 ]; then
  build_hmdp
  set -- "$HMDP"
else
  scripts/services.sh
fi
command -v wrk >/dev/null 2>&1 || { echo "benches/cpu-per-request.sh needs wrk" >&2; exit 1; }
command -v jq >/dev/null 2>&1 || { echo "benches/cpu-per-request.sh needs jq" >&2; exit 1; }
MARIADB_PID=$(mariadb_pid)
REDIS_PID=$(redis_pid)
POST=$OUT/post.lua
echo 'wrk.method = "POST"' >"$POST"

trap stop_nodes EXIT

# CPU seconds so far of the nodes, nginx, Redis and MariaDB.
snapshot() {
  # shellcheck disable=SC2086,SC2046 # the pid lists split on purpose
  echo "$(cpu_s $HMDP_NODE_PIDS) $(cpu_s $HMDP_NGINX_PID $(pgrep -P "$HMDP_NGINX_PID" || true)) $(cpu_s "$REDIS_PID") $(cpu_s "$MARIADB_PID")"
}
report() { # label, snapshot before, after, requests, client CPU seconds
  local b a
  read -r -a b <<<"$2"
  read -r -a a <<<"$3"
  printf '%-40s µs/request: nodes %s nginx %s Redis %s MariaDB %s load generator %s, all %s\n' "$1" \
    "$(per_unit "${b[0]}" "${a[0]}" "$4")" "$(per_unit "${b[1]}" "${a[1]}" "$4")" \
    "$(per_unit "${b[2]}" "${a[2]}" "$4")" "$(per_unit "${b[3]}" "${a[3]}" "$4")" "$(per_unit 0 "$5" "$4")" \
    "$(per_unit "$(echo "${b[@]}" | awk '{ print $1 + $2 + $3 + $4 }')" \
      "$(echo "${a[@]}" "$5" | awk '{ print $1 + $2 + $3 + $4 + $5 }')" "$4")"
}
loadtest() { # label, json, workload flags...
  local label=$1 json=$2
  shift 2
  local before after
  before=$(snapshot)
  timed "$json.cpu" pair_loadtest --users "$USERS" --tokens "$OUT/tokens.txt" --json "$json" "$@" >/dev/null
  after=$(snapshot)
  report "$label ($(jq -r '.rps | floor' "$json")/s)" "$before" "$after" \
    "$(jq -r .requests "$json")" "$(cat "$json.cpu")"
}
wrk_run() { # label, wrk arguments...
  local label=$1
  shift
  local before after
  before=$(snapshot)
  timed "$OUT/wrk.cpu" wrk -t 2 -c 64 -d 3s "$@" >"$OUT/wrk.txt"
  after=$(snapshot)
  report "$label ($(awk '/^Requests\/sec:/ { printf "%d", $2 }' "$OUT/wrk.txt")/s)" "$before" "$after" \
    "$(awk '/requests in/ { print $1 }' "$OUT/wrk.txt")" "$(cat "$OUT/wrk.cpu")"
}

for run in $(seq 1 "$RUNS"); do
  for HMDP; do
    printf '\n== run %s: %s\n' "$run" "$HMDP"
    start_nodes "$OUT/nodes.env" "$OUT/nodes.log" --lock reentrant --seckill stream
    # shellcheck disable=SC1091 # HMDP_TARGET=..., DATABASE_URL=..., ...
    . "$OUT/nodes.env"
    pair_tokens "$USERS" "$OUT/tokens.txt"
    # Warm-up: connections opened, statements prepared, sessions read.
    loadtest warm-up "$OUT/warm-up.json" --workload sale --concurrency 64 >/dev/null
    wrk_run "wrk /health" "$HMDP_TARGET/health"
    loadtest "storm, $USERS users x 5" "$OUT/storm.json" --workload storm --per-user 5 --concurrency 200
    # The storm's voucher is sold out now: one user asking again and again
    # is the cheapest purchase answer there is (session and sale in memory).
    wrk_run "wrk POST of a sold-out voucher" -s "$POST" -H "authorization: $(head -1 "$OUT/tokens.txt")" \
      "$HMDP_TARGET/voucher-order/seckill/$(jq -r .voucher "$OUT/storm.json")"
    # Every node knows it sold out, the one that saw it and the one that
    # heard: each asked on its own.
    node=0
    for url in $HMDP_NODE_URLS; do
      node=$((node + 1))
      wrk_run "wrk POST of a sold-out voucher, node $node" -s "$POST" \
        -H "authorization: $(head -1 "$OUT/tokens.txt")" \
        "$url/voucher-order/seckill/$(jq -r .voucher "$OUT/storm.json")"
    done
    loadtest "sale, $USERS users" "$OUT/sale.json" --workload sale --concurrency 64
    # One user past their purchase limit (5 in 10 s): every answer a 429.
    wrk_run "wrk POST over the user's limit (429)" -s "$POST" \
      -H "authorization: $(sed -n 2p "$OUT/tokens.txt")" \
      "$HMDP_TARGET/voucher-order/seckill/$(jq -r .voucher "$OUT/sale.json")"
    stop_nodes
  done
done
