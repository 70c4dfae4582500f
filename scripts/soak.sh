#!/usr/bin/env bash
# The soak: two nodes behind nginx under load for 10 minutes (by default),
# a fault every minute (a node SIGKILLed and restarted, Redis restarted empty
# or from its AOF, the current voucher's stock row held by another MySQL
# session, MySQL read-only, MySQL SIGKILLed and restarted), then every sale
# judged by what its buyers were told. Not part of
# CI: it takes the full ten minutes. Extra arguments go to `hmdp soak` (see
# --help), e.g. `--seckill stream --redis-appendfsync always`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo build --release --locked -p hmdp-tools --bin hmdp
RUST_LOG="${RUST_LOG:-warn}" target/release/hmdp soak "$@"
