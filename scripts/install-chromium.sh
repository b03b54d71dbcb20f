#!/usr/bin/env bash
# Install Chromium (Debian's package) for the audit page's browser tests (tests/ui/), which drive it
# with Playwright for Python. Playwright's own browser download needs the network; the tests launch
# /usr/bin/chromium instead (RESPONSES_LEDGER_CHROMIUM names another).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then echo "chromium is installed: $(/usr/bin/chromium --version 2>/dev/null)"; exit 0; fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }
echo "installed $(/usr/bin/chromium --version 2>/dev/null)"
