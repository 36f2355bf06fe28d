#!/usr/bin/env bash
# Everything the test suite needs on this machine, started or installed
# when missing (idempotent; a fresh Debian machine needs network access to
# its package mirror once):
#   - PostgreSQL on 127.0.0.1:5432, trust auth for user postgres
#     (scripts/start-postgres.sh);
#   - MariaDB on 127.0.0.1:3306, user root without a password, the
#     source database of the SQL-source tests (scripts/start-mariadb.sh);
#   - faketime, which runs a worker with a clock two hours behind the
#     database's (tests/hardening_queue.rs);
#   - promtool, from Debian's `prometheus` package, which checks and
#     unit-tests the shipped alert rules deploy/alerts.yml (tests/tools.rs);
#   - chromium and chromedriver (Debian's `chromium`, `chromium-driver`),
#     which drive the status page in a real headless browser;
#   - pgbouncer, which the tests start in transaction mode in front of the
#     test server (tests/pooling.rs); Debian installs it in /usr/sbin;
#   - openlineage-python (PyPI), the OpenLineage reference client that
#     checks the lineage events (tests/lineage/validate.py, tests/notices.rs).
# Nothing here starts Prometheus: only its promtool is used.
set -euo pipefail
cd "$(dirname "$0")"

./start-postgres.sh
./start-mariadb.sh

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# command -> the Debian package that provides it.
missing=()
need() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || missing+=("$2"); }
need faketime faketime
need promtool prometheus
need chromium chromium
need chromedriver chromium-driver
need pgbouncer pgbouncer

if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}..." >&2
  $SUDO apt-get update -qq
  # No recommends: the prometheus package would bring node-exporter.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The OpenLineage reference client, for the lineage events' check.
if ! python3 -c "import openlineage.client" >/dev/null 2>&1; then
  echo "installing openlineage-python..." >&2
  # A Debian python (PEP 668) refuses a plain install; this is a test machine.
  python3 -m pip install --quiet --root-user-action=ignore openlineage-python ||
    python3 -m pip install --quiet --root-user-action=ignore --break-system-packages openlineage-python
fi
