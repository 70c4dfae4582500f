#!/usr/bin/env bash
# Installs the lock libraries that benches/run.sh measures next to hmdp's
# locks, outside the repository (they are not the project's dependencies):
#
#   python   a venv with redis-py, pinned in requirements.txt
#   node     redlock and ioredis, pinned in package.json and package-lock.json
#            (exact versions and integrity hashes), installed with `npm ci`
#
# into PEERS_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/hmdp-bench-peers),
# once: a stamp of the pin files' checksum skips a second install until they
# change. Usage: benches/peers/setup.sh [python] [node] (both by default).
# Exits non-zero, with the reason on stderr, if any peer asked for could not
# be installed (no interpreter, no network...): benches/run.sh then skips
# that peer and goes on.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEERS_DIR=${PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hmdp-bench-peers}
mkdir -p "$PEERS_DIR"

say() { echo "peers: $*" >&2; }
stamp() { cat "$@" | sha256sum | cut -d' ' -f1; } # pin files -> checksum

setup_python() {
  local venv=$PEERS_DIR/venv want
  want=$(stamp "$HERE/requirements.txt")
  # The stamp alone is not enough: an upgraded python3 breaks an old venv.
  if [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$want" ] &&
    "$venv/bin/python" -c 'import redis' 2>/dev/null; then
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || { say "python3 not found: redis-py skipped"; return 1; }
  say "installing redis-py into $venv"
  rm -rf "$venv"
  # Debian's python3 lacks the venv module until python3-venv is installed.
  python3 -m venv "$venv" >&2 || { say "python3 -m venv failed (python3-venv missing?): redis-py skipped"; return 1; }
  # A network that hangs gives up after a while instead of holding the run.
  "$venv/bin/pip" install --quiet --disable-pip-version-check --timeout 30 --retries 1 \
    -r "$HERE/requirements.txt" >&2 || { say "pip install failed: redis-py skipped"; return 1; }
  echo "$want" >"$venv/.stamp"
}

setup_node() {
  local dir=$PEERS_DIR/node want
  want=$(stamp "$HERE/package.json" "$HERE/package-lock.json")
  if [ "$(cat "$dir/.stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "node or npm not found: node-redlock skipped"
    return 1
  fi
  say "installing redlock and ioredis into $dir"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --omit=dev --no-audit --no-fund --loglevel=error \
    --fetch-timeout=30000 --fetch-retries=1 >&2) \
    || { say "npm ci failed: node-redlock skipped"; return 1; }
  echo "$want" >"$dir/.stamp"
}

[ $# -gt 0 ] || set -- python node
status=0
for peer in "$@"; do
  case $peer in
    python) setup_python || status=1 ;;
    node) setup_node || status=1 ;;
    *) say "unknown peer $peer (python, node)"; exit 2 ;;
  esac
done
exit $status
