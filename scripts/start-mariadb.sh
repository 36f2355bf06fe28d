#!/usr/bin/env bash
# Makes sure a MariaDB server answers on 127.0.0.1:3306 for user root
# without a password, as the SQL-source tests expect (tests/sql_source.rs:
# mysql://root@127.0.0.1:3306). Starts the installed server when it is
# down; installs Debian's mariadb-server when missing.
set -euo pipefail

ping() { mariadb-admin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; }

if command -v mariadb-admin >/dev/null 2>&1 && ping; then
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if [ ! -x /usr/sbin/mariadbd ]; then
  echo "installing MariaDB..." >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    mariadb-server mariadb-client >/dev/null
fi

# Debian's init script (no systemd in containers); it binds 127.0.0.1.
$SUDO /etc/init.d/mariadb start >/dev/null 2>&1 || $SUDO service mariadb start >/dev/null 2>&1 || true

for _ in $(seq 1 60); do
  if $SUDO mariadb-admin ping >/dev/null 2>&1; then
    break
  fi
  sleep 1
done

# Debian's root logs in through the Unix socket only: let the tests in
# over TCP from loopback without a password too (a test server that
# listens on loopback only). A TCP login from 127.0.0.1 may match
# 'root'@'localhost' or 'root'@'127.0.0.1', so both accept it.
if ! ping; then
  $SUDO mariadb -u root <<'SQL'
ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
fi

for _ in $(seq 1 30); do
  ping && exit 0
  sleep 1
done
echo "MariaDB did not come up on 127.0.0.1:3306" >&2
exit 1
