#!/usr/bin/env bash
# Install the Codex CLI pinned in package.json / package-lock.json (node_modules/.bin/codex), which
# the client tests in tests/clients drive (they skip without it).
#
# `npm ci` installs exactly the lockfile: @openai/codex and, through its optional dependencies, the
# native binary for this platform only. Idempotent: does nothing when the installed CLI already
# has the pinned version. Usage:
#   scripts/install-codex.sh
# Needs node >= 16 and npm, and the npm registry (or a cache that has the packages).
set -euo pipefail

cd "$(dirname "$0")/.."
PINNED="$(node -p 'require("./package-lock.json").packages["node_modules/@openai/codex"].version')"

if [ -x node_modules/.bin/codex ] && [ "$(node_modules/.bin/codex --version 2>/dev/null)" = "codex-cli ${PINNED}" ]; then
    echo "codex-cli ${PINNED} is already installed"
    exit 0
fi

npm ci --no-audit --no-fund --loglevel=error >/dev/null

installed="$(node_modules/.bin/codex --version)"
if [ "$installed" != "codex-cli ${PINNED}" ]; then
    echo "npm ci finished but node_modules/.bin/codex --version says '${installed}', expected codex-cli ${PINNED}" >&2
    exit 1
fi
echo "installed ${installed}"
