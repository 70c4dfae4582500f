#!/usr/bin/env bash
# The test command: starts what the tests need where it is missing, then runs
# the whole test suite against the machine's real MariaDB, Redis and nginx.
#
# With cargo-nextest (on the project's CI machines; `cargo install
# cargo-nextest` elsewhere) every test runs in a process of its own, tests of
# every binary side by side as .config/nextest.toml says; without it, cargo
# test runs the same tests, one binary after another. Arguments are passed
# on (a test name filter, say).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --locked --workspace "$@"
  # nextest runs no doctests: the lock crate's README examples run here.
  cargo test --locked --workspace --doc
else
  echo "test.sh: cargo-nextest not found; running cargo test" >&2
  cargo test --locked --workspace "$@"
fi
