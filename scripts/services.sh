#!/usr/bin/env bash
# Makes sure MariaDB (or MySQL), Redis, nginx, Chromium and Prometheus are
# installed and MariaDB and Redis are running on their default local ports.
# Idempotent: does nothing where they already run. Debian/Ubuntu only
# (apt-get).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "services: $name did not come up" >&2
  return 1
}

# MySQL-compatible server on 127.0.0.1:3306, root without a password.
if ! mysqladmin --protocol=tcp -h127.0.0.1 -uroot ping >/dev/null 2>&1; then
  command -v mariadbd >/dev/null 2>&1 || command -v mysqld >/dev/null 2>&1 \
    || apt_install mariadb-server mariadb-client
  $SUDO mkdir -p /run/mysqld && $SUDO chown mysql:mysql /run/mysqld 2>/dev/null || true
  $SUDO start-stop-daemon --start --oknodo --background --exec "$(command -v mariadbd || command -v mysqld)" -- --user=mysql
  wait_for MariaDB mysqladmin --protocol=tcp -h127.0.0.1 -uroot ping
  echo "services: MariaDB started"
fi

# The test suite runs several nodes at once, each with its own pool; the
# default of 151 connections is too tight for that.
mysql --protocol=tcp -h127.0.0.1 -uroot -e \
  "SET GLOBAL max_connections = GREATEST(@@GLOBAL.max_connections, 1000)"

# Redis on 127.0.0.1:6379, nothing kept on disk.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server redis-tools
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
  wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping
  echo "services: Redis started"
fi

# nginx binary, in front of the two nodes (each run uses a private prefix and
# config; the system-wide nginx service is left alone).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt_install nginx
  echo "services: nginx installed"
fi

# Headless Chromium for the test that opens `hmdp demo --report`'s page the
# way a reader does and checks it loads without a console error.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
  echo "services: chromium installed"
fi

# Debian's prometheus package: promtool for the tests that check the alert
# rules in deploy/prometheus/ and the Grafana dashboard's queries, and the
# server that `hmdp up --prometheus` and `hmdp demo --prometheus` start
# (each run on a config and storage of its own; the package's own service is
# left alone).
if ! command -v promtool >/dev/null 2>&1 || [ ! -x /usr/bin/prometheus ]; then
  apt_install --no-install-recommends prometheus
  echo "services: prometheus and promtool installed"
fi

# kubernetes-validate (PyPI) for the test that validates deploy/kubernetes
# against the Kubernetes API's schemas, offline.
if ! command -v kubernetes-validate >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate
  echo "services: kubernetes-validate installed"
fi

# schemathesis and openapi-spec-validator (PyPI) for the contract tests: the
# served OpenAPI document validates, and the API holds it under fuzzing.
if ! command -v schemathesis >/dev/null 2>&1 || ! command -v openapi-spec-validator >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check "schemathesis>=4.32,<5" "openapi-spec-validator>=0.7"
  echo "services: schemathesis and openapi-spec-validator installed"
fi
