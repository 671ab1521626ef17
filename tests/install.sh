#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (as root in CI):
# the package with its test extras, and the real agent CLIs from the npm registry into
# tests/.tools (ignored by git). Idempotent: a pinned version already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "tests/install.sh: node (20+) is required on PATH" >&2; exit 1; }
command -v npm >/dev/null || { echo "tests/install.sh: npm is required on PATH" >&2; exit 1; }
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

# Headless Chromium and its driver for the dashboard's browser tests (Debian packages).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "tests/install.sh: run as root (or: sudo apt-get install chromium chromium-driver)" >&2; exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi

CLAUDE_CODE_VERSION=2.1.328
tools=tests/.tools
mkdir -p "$tools"
have=$("$tools/node_modules/.bin/claude" --version 2>/dev/null | cut -d' ' -f1 || true)
if [ "$have" != "$CLAUDE_CODE_VERSION" ]; then
  # The CLI ships its native binary as an optional platform dependency: keep optionals on.
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error --no-save \
      "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
fi
"$tools/node_modules/.bin/claude" --version
