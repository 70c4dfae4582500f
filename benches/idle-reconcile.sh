#!/usr/bin/env bash
# What reconciliation costs an idle `--seckill stream` node: one node on a
# MariaDB and a Redis of this script's own (so that their counters count
# this node alone), measured over WINDOW seconds once quiet, twice:
#
#   none   the node with no sale at all;
#   ended  the node after SALES sales, ORDERS orders each, have ended and
#          settled (their unpaid orders closed at the short pay timeout,
#          their units given back, every sale let go by the reconciler).
#
# Each prints MariaDB's `Com_select` and the sum of its `Com_*` counters
# (less `Com_show_status`, this script's own reads of them) gained in the
# window, and the Redis commands `INFO commandstats` counted (less `info`,
# this script's own), with the commands that made them.
#
#   benches/idle-reconcile.sh                   # this checkout's release build
#   HMDP=path/to/hmdp benches/idle-reconcile.sh  # another build
#
# Knobs: SALES (default 1000), ORDERS (default 2), WINDOW (default 12),
# END_IN (seconds from the first sale's creation to the sales' end, enough
# to create them and buy; default 60), OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benches/common.sh
. benches/common.sh
SALES=${SALES:-1000} ORDERS=${ORDERS:-2} WINDOW=${WINDOW:-12} END_IN=${END_IN:-60}
OUT=${OUT:-$(mktemp -d -t hmdp-idle-XXXXXX)}
mkdir -p "$OUT"
export RUST_LOG=${RUST_LOG:-warn} LC_ALL=C
[ -n "${HMDP:-}" ] || build_hmdp
ADMIN=idle-reconcile-admin

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PIDS=()
# The last started first: the node before the servers it talks to.
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
}
trap stop_all EXIT
# Waits until `$@` succeeds, at most $1 seconds (looked at every 0.2 s).
wait_for() { # seconds, command...
  local within=$1
  shift
  for _ in $(seq 1 $((within * 5))); do
    "$@" >/dev/null 2>&1 && return
    sleep 0.2
  done
  echo "not within ${within}s: $*" >&2
  exit 1
}

DB_PORT=$(free_port)
mariadb-install-db --no-defaults --user=root --skip-test-db --auth-root-authentication-method=normal \
  --datadir="$OUT/mariadb" >/dev/null
mariadbd --no-defaults --user=root --bind-address=127.0.0.1 --skip-name-resolve \
  --innodb-buffer-pool-size=64M --datadir="$OUT/mariadb" --port="$DB_PORT" \
  --socket="$OUT/mariadb.sock" --pid-file="$OUT/mariadb.pid" >"$OUT/mariadb.log" 2>&1 &
PIDS+=($!)
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT" \
  >"$OUT/redis.log" 2>&1 &
PIDS+=($!)
sql() { mariadb -h 127.0.0.1 -P "$DB_PORT" -u root -N -B -e "$1"; }
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
wait_for 60 sql 'SELECT 1'
wait_for 30 rcli ping

# Com_select, then Com_* summed, without this script's SHOW STATUS.
statements() {
  sql "SHOW GLOBAL STATUS LIKE 'Com\\_%'" |
    awk '$1 == "Com_select" { s = $2 } $1 != "Com_show_status" { t += $2 } END { print s, t }'
}
# Every command INFO commandstats counted, `name calls` a line, without INFO.
commands() {
  rcli info commandstats | tr -d '\r' |
    awk -F'[_:=,]' '/^cmdstat_/ && $2 != "info" { print $2, $4 }' | sort
}

# Starts a stream node on database `$1`, Redis prefix `$1:`; sets NODE.
start_node() { # name
  local port
  port=$(free_port)
  local db=mysql://root@127.0.0.1:$DB_PORT/$1
  "$HMDP" migrate --database-url "$db" >/dev/null
  "$HMDP" serve --seckill stream --database-url "$db" --redis-url "redis://127.0.0.1:$REDIS_PORT" \
    --redis-prefix "$1:" --host 127.0.0.1 --port "$port" --admin-token "$ADMIN" \
    --pay-timeout-secs 3 --limits off >"$OUT/$1.log" 2>&1 &
  NODE_PID=$!
  PIDS+=("$NODE_PID")
  NODE=http://127.0.0.1:$port
  wait_for 60 curl -sf "$NODE/health"
}

# Measures the node `$1` names over WINDOW seconds once it is quiet.
measure() { # label
  settled "$NODE_PID" "$(cat "$OUT/mariadb.pid")" "$(rcli info server | tr -d '\r' | awk -F: '/^process_id:/ { print $2 }')"
  local s0 s1 c0 c1
  read -r -a s0 <<<"$(statements)"
  commands >"$OUT/$1.commands.0"
  sleep "$WINDOW"
  read -r -a s1 <<<"$(statements)"
  commands >"$OUT/$1.commands.1"
  c1=$(join -a 1 "$OUT/$1.commands.1" "$OUT/$1.commands.0" |
    awk '{ d = $2 - ($3 == "" ? 0 : $3); if (d > 0) printf "%s %d, ", $1, d }')
  c0=$(join -a 1 "$OUT/$1.commands.1" "$OUT/$1.commands.0" |
    awk '{ t += $2 - ($3 == "" ? 0 : $3) } END { print t + 0 }')
  printf '%-6s %ss: Com_select +%d, Com_* +%d; Redis commands +%d (%s)\n' "$1" "$WINDOW" \
    $((s1[0] - s0[0])) $((s1[1] - s0[1])) "$c0" "${c1%, }"
}

start_node none
measure none | tee "$OUT/none.txt"
kill "$NODE_PID"
wait "$NODE_PID" 2>/dev/null || true

start_node ended
"$HMDP" tokens --target "$NODE" --redis-url "redis://127.0.0.1:$REDIS_PORT" --redis-prefix "ended:" \
  --users "$ORDERS" --out "$OUT/tokens.txt" >/dev/null
end=$(date -d "+$END_IN seconds" '+%Y-%m-%dT%H:%M:%S')
body=$(jq -nc --arg until "$end" --argjson stock $((ORDERS + 1)) '{shopId: 1, title: "idle",
  payValue: 8000, actualValue: 10000, type: 1, stock: $stock,
  beginTime: "2020-01-01T00:00:00", endTime: $until}')
seq 1 "$SALES" | xargs -P 4 -I{} curl -sf -H "x-admin-token: $ADMIN" -H 'content-type: application/json' \
  -d "$body" "$NODE/voucher/seckill" | jq -r '.data' >"$OUT/vouchers.txt"
[ "$(wc -l <"$OUT/vouchers.txt")" -eq "$SALES" ] || { echo "not every sale created" >&2; exit 1; }
while read -r token; do
  xargs -P 4 -I{} curl -sf -X POST -H "authorization: $token" "$NODE/voucher-order/seckill/{}" \
    <"$OUT/vouchers.txt" | jq -r '.success' >>"$OUT/answers.txt"
done <"$OUT/tokens.txt"
bought=$(grep -c true "$OUT/answers.txt" || true)
[ "$(date '+%Y-%m-%dT%H:%M:%S')" \< "$end" ] || echo "the sales ended while buying: raise END_IN" >&2
echo "$SALES sales, $bought orders; the sales end at $end" | tee "$OUT/ended.txt"
# Ended, every unpaid order closed at the pay timeout and its unit given
# back: settled in MySQL.
settled_in_mysql() {
  [ "$(sql "SELECT COUNT(*) FROM ended.tb_seckill_voucher WHERE end_time > NOW()")" = 0 ] &&
    [ "$(sql "SELECT COUNT(*) FROM ended.tb_voucher_order WHERE status = 1")" = 0 ] &&
    [ "$(sql "SELECT COUNT(*) FROM ended.tb_order_giveback")" = 0 ]
}
wait_for $((END_IN + 180)) settled_in_mysql
# Then let go by the reconciler, within a few of its rounds (a build
# without the let-go keeps every sale: measured all the same).
let_go() { [ "$(sql "SELECT COUNT(*) FROM ended.tb_seckill_voucher WHERE sale_loaded")" = 0 ]; }
for _ in $(seq 1 100); do let_go && break; sleep 0.2; done
echo "settled; closed orders: $(sql "SELECT COUNT(*) FROM ended.tb_voucher_order WHERE status = 4"), \
sales Redis is meant to hold: $(sql "SELECT COUNT(*) FROM ended.tb_seckill_voucher WHERE sale_loaded")" |
  tee -a "$OUT/ended.txt"
measure ended | tee -a "$OUT/ended.txt"
echo "logs and counters in $OUT"
