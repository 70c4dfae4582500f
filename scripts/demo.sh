#!/usr/bin/env bash
# The main job: installs/starts MariaDB, Redis and nginx where they are
# missing, builds in release mode, then runs `hmdp demo` (two nodes behind
# nginx, the same load test once per lock mode, one table). Extra arguments go
# to `hmdp demo`, e.g. `scripts/demo.sh --modes local,reentrant --chaos-hold-ms 100`
# or `scripts/demo.sh --seckill sync,stream` (every lock mode on both paths).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --release --locked -p hmdp-tools --bin hmdp
exec target/release/hmdp demo "$@"
