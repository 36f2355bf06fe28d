#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 with trust auth
# for user postgres, as the test suite expects (TIDEMARK_TEST_DATABASE_URL,
# default postgres://postgres@127.0.0.1:5432/postgres). Starts the installed
# cluster when it is down; installs PostgreSQL (Debian packages) when missing.
set -euo pipefail

if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  echo "installing PostgreSQL..." >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi

version=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$version/main/pg_hba.conf
# Tests connect over TCP as postgres without a password.
if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
  $SUDO sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
fi
$SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start || true

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p 5432 && exit 0
  sleep 1
done
echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2
exit 1
