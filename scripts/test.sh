#!/usr/bin/env bash
# The test command: starts what the tests need where it is missing, then runs
# the whole test suite against the machine's real MariaDB, Redis and nginx.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo test --locked --workspace "$@"
