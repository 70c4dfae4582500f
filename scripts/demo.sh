#!/usr/bin/env bash
# The main job: installs/starts MariaDB, Redis and nginx where they are
# missing, builds in release mode, then runs `hmdp demo` (two nodes behind
# nginx, the same load test once per lock mode, one table). Extra arguments go
# to `hmdp demo`, e.g. `scripts/demo.sh --modes local,reentrant --chaos-hold-ms 100`
# or `scripts/demo.sh --seckill sync,stream` (every lock mode on both paths).
# The run's picture goes to $HMDP_DEMO_REPORT (default target/demo-report.html)
# unless the arguments name another with --report; its path is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --release --locked -p hmdp-tools --bin hmdp

report=${HMDP_DEMO_REPORT:-target/demo-report.html}
args=("$@")
given=""
for i in "${!args[@]}"; do
  case ${args[$i]} in
    --report) given=${args[$((i + 1))]:-} ;;
    --report=*) given=${args[$i]#--report=} ;;
  esac
done
if [ -n "$given" ]; then
  report=$given
else
  args+=(--report "$report")
fi

# A picture left from an earlier run must not pass for this one's.
rm -f "$report"
status=0
target/release/hmdp demo "${args[@]}" || status=$?
# Written even when a mode did not behave as expected: that run is the one
# worth looking at.
if [ -f "$report" ]; then
  echo
  echo "picture of this run: $(realpath "$report") (open it in a browser)"
fi
exit "$status"
