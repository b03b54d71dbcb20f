#!/usr/bin/env bash
# Install HAProxy (Debian's package) for the replica tests and benchmark (tests/e2e/test_replicas.py,
# bench/replicas.py), which start their own haproxy process in front of three servers.
# The package may also start a system haproxy service; the tests never use it.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
if command -v haproxy >/dev/null 2>&1; then echo "haproxy is installed: $(haproxy -v | head -n 1)"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q haproxy || { apt-get update -q && apt-get install -y -q haproxy; }
echo "installed $(haproxy -v | head -n 1)"
