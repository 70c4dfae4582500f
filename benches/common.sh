# shellcheck shell=bash
# Sourced by the benchmark scripts: the release build of `hmdp` they all run,
# and the median their rounds are judged on.

# Starts what the benchmarks need where it is missing (scripts/services.sh)
# and builds hmdp in release mode; sets HMDP to the binary.
build_hmdp() {
  scripts/services.sh
  cargo build --release --locked -p hmdp-tools --bin hmdp
  # shellcheck disable=SC2034 # read by the scripts that source this file
  HMDP=target/release/hmdp
}

# The median of the numbers given (the lower middle one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# CPU seconds (user + system, every thread, living or ended) that processes
# have used so far, from /proc: taken before and after a run, the difference
# shows where the CPU of the run went.
HZ=$(getconf CLK_TCK)
cpu_s() { # pids... -> their total
  local pid
  for pid; do
    awk -v hz="$HZ" '{ sub(/^.*\) /, ""); split($0, f, " "); print (f[12] + f[13]) / hz }' "/proc/$pid/stat"
  done | awk '{ s += $1 } END { printf "%.3f", s }'
}
# Nanoseconds on a core of the living threads of the processes given
# (/proc's schedstat: finer than cpu_s's clock ticks of 10 ms).
cpu_ns() { # pids...
  local pid
  for pid; do cat /proc/"$pid"/task/*/schedstat 2>/dev/null; done | awk '{ s += $1 } END { printf "%d", s }'
}
# Waits until the processes given are quiet: under 10 ms of CPU over the
# last 1.2 s, looked at every 100 ms (at most 30 s). After a run that wrote
# much, MariaDB purges and flushes: its page cleaner, once a second, can
# spend 50 ms at a time on what `bench-db` left, well after the last
# transaction. The next run is measured without that; the 1.2 s window
# spans the cleaner's second.
settled() { # pids...
  local looks=() before now sum look
  before=$(cpu_ns "$@")
  for _ in $(seq 1 300); do
    sleep 0.1
    now=$(cpu_ns "$@")
    # A thread that ended takes its time with it: not a quiet look.
    look=$((now - before))
    [ "$look" -ge 0 ] || look=1000000000
    looks+=("$look")
    before=$now
    [ ${#looks[@]} -ge 12 ] || continue
    looks=("${looks[@]: -12}")
    sum=0
    for look in "${looks[@]}"; do sum=$((sum + look)); done
    [ "$sum" -ge 10000000 ] || return 0
  done
}
# The pid of the MariaDB the benchmarks use (127.0.0.1:3306), as it reports
# it: `pidof` picks any mariadbd, a test's private server as well.
mariadb_pid() { cat "$(mariadb -h 127.0.0.1 -u root -N -e 'SELECT @@pid_file')"; }
# The pid of the Redis the benchmarks use (127.0.0.1:6379), as it reports it.
redis_pid() { redis-cli -h 127.0.0.1 -p 6379 info server | awk -F: '/^process_id:/ { print $2 + 0 }'; }
# µs per unit: CPU seconds before, after, units.
per_unit() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.0f", (b - a) * 1e6 / n }'; }
# Runs a command with bash's `time`; its CPU seconds (its own and its
# children's, user + system) go to the file named first.
timed() { # file, command...
  local file=$1 TIMEFORMAT='%3U %3S'
  shift
  { time "$@" 2>&3; } 3>&2 2>"$file.raw"
  awk '{ printf "%.3f", $1 + $2 }' "$file.raw" >"$file"
}

# The `hmdp up`s (two nodes behind nginx) started so far, stopped by
# stop_nodes (set it as the script's EXIT trap).
UPS=()
# Starts `hmdp up` with the flags given, its output in the log file,
# and waits until it has written the env file (HMDP_TARGET=..., ...);
# shows the log and exits should it die first.
start_nodes() { # env file, log file, hmdp up flags...
  local env=$1 log=$2 pid up=up
  shift 2
  rm -f "$env"
  # An older build (benches/sides.sh compares one) calls it `cluster`.
  "$HMDP" help up >/dev/null 2>&1 || up=cluster
  "$HMDP" "$up" --env-file "$env" "$@" >"$log" 2>&1 &
  pid=$!
  UPS+=("$pid")
  for _ in $(seq 1 600); do
    [ -s "$env" ] && return
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  echo "hmdp $up wrote no $env within 60 s" >&2
  exit 1
}
# `hmdp loadtest` with the flags given, pointed at the pair of nodes whose
# env file was read last: its nginx, database, Redis, key prefix and admin
# token.
pair_loadtest() { # hmdp loadtest flags...
  "$HMDP" loadtest --target "$HMDP_TARGET" --database-url "$DATABASE_URL" --redis-url "$REDIS_URL" \
    --redis-prefix "$HMDP_REDIS_PREFIX" --admin-token "$HMDP_ADMIN_TOKEN" "$@"
}
# Logs that pair's first users in (`hmdp tokens`), their tokens in the file.
pair_tokens() { # users, file
  "$HMDP" tokens --target "$HMDP_TARGET" --redis-url "$REDIS_URL" --redis-prefix "$HMDP_REDIS_PREFIX" \
    --users "$1" --out "$2" >/dev/null
}
stop_nodes() {
  local pid
  for pid in "${UPS[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  UPS=()
}
