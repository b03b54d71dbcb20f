#!/usr/bin/env bash
# Make sure PostgreSQL answers on 127.0.0.1:5432 (the test suite's PostgreSQL backend).
# Starts the machine's cluster when it is down; says so and fails when it cannot.
set -euo pipefail
ready() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if ready; then echo "postgresql is up"; exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
fi
for _ in $(seq 1 30); do ready && { echo "postgresql started"; exit 0; }; sleep 1; done
echo "PostgreSQL is not reachable on 127.0.0.1:5432 and could not be started" >&2
exit 1
