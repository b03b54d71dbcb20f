#!/usr/bin/env bash
# Install the client packages pinned in package.json / package-lock.json that the client tests in
# tests/clients drive (they skip without them): the Codex CLI (node_modules/.bin/codex) and the
# Vercel AI SDK (`ai`, `@ai-sdk/openai`).
#
# `npm ci` installs exactly the lockfile: @openai/codex and, through its optional dependencies, the
# native binary for this platform only, and the AI SDK. Idempotent: does nothing when the installed
# CLI and SDK packages already have the pinned versions. Usage:
#   scripts/install-codex.sh
# Needs node >= 16 and npm, and the npm registry (or a cache that has the packages).
set -euo pipefail

cd "$(dirname "$0")/.."
PINNED="$(node -p 'require("./package-lock.json").packages["node_modules/@openai/codex"].version')"

# the pinned packages of the lockfile that are not installed at their version ("" when all are)
missing_sdk() {
    node -e '
        const lock = require("./package-lock.json").packages;
        for (const name of ["ai", "@ai-sdk/openai"]) {
            let installed = null;
            try { installed = require("./node_modules/" + name + "/package.json").version; } catch {}
            if (installed !== lock["node_modules/" + name].version) console.log(name);
        }'
}

if [ -x node_modules/.bin/codex ] && [ "$(node_modules/.bin/codex --version 2>/dev/null)" = "codex-cli ${PINNED}" ] \
    && [ -z "$(missing_sdk)" ]; then
    echo "codex-cli ${PINNED} and the AI SDK are already installed"
    exit 0
fi

npm ci --no-audit --no-fund --loglevel=error >/dev/null

installed="$(node_modules/.bin/codex --version)"
if [ "$installed" != "codex-cli ${PINNED}" ]; then
    echo "npm ci finished but node_modules/.bin/codex --version says '${installed}', expected codex-cli ${PINNED}" >&2
    exit 1
fi
if [ -n "$(missing_sdk)" ]; then
    echo "npm ci finished but these are not at their pinned versions: $(missing_sdk | tr '\n' ' ')" >&2
    exit 1
fi
echo "installed ${installed}, ai $(node -p 'require("./node_modules/ai/package.json").version'), @ai-sdk/openai $(node -p 'require("./node_modules/@ai-sdk/openai/package.json").version')"
