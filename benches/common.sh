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
