#!/usr/bin/env bash
# Everything the test suite needs on this machine, started or installed
# when missing (idempotent; a fresh Debian machine needs network access to
# its package mirror once):
#   - PostgreSQL on 127.0.0.1:5432, trust auth for user postgres
#     (scripts/start-postgres.sh);
#   - faketime, which runs a worker with a clock two hours behind the
#     database's (tests/hardening_queue.rs).
set -euo pipefail
cd "$(dirname "$0")"

./start-postgres.sh

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}..." >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
