#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (as root in CI), into what
# the README's commands use: the package with its test extras into ./.venv (made here if
# missing; a Debian/Ubuntu system Python is externally managed, so never into it), the
# Debian packages the tests drive, and the real agent CLIs from the npm registry into
# tests/.tools (ignored by git). Idempotent: a pinned version already there is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "tests/install.sh: node (20+) is required on PATH" >&2; exit 1; }
command -v npm >/dev/null || { echo "tests/install.sh: npm is required on PATH" >&2; exit 1; }
VENV=.venv

# Debian packages: headless Chromium and its driver (dashboard browser tests), bubblewrap
# (the sandbox), and python3-venv where python3 cannot make a venv with pip (Debian's
# python3 without it has no ensurepip).
apt_needed=()
command -v chromium >/dev/null || apt_needed+=(chromium)
command -v chromedriver >/dev/null || apt_needed+=(chromium-driver)
command -v bwrap >/dev/null || apt_needed+=(bubblewrap)
if [ ! -x "$VENV/bin/python" ] && ! python3 -c 'import ensurepip' 2>/dev/null; then
  apt_needed+=(python3-venv)
fi
if [ ${#apt_needed[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "tests/install.sh: run as root (or: sudo apt-get install ${apt_needed[*]})" >&2; exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_needed[@]}" >/dev/null
fi

# The package, editable, with the test extras and the ray extra (the Ray placement tests
# start a real two-node cluster, tests/raycluster.py).
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test,ray]'

# The real agent CLIs, pinned, in one npm install (a second --no-save install would prune
# the first). Both ship native binaries as optional platform packages: keep optionals on.
CLAUDE_CODE_VERSION=2.1.328
CODEX_VERSION=0.169.0
tools=tests/.tools
mkdir -p "$tools"
have_claude=$("$tools/node_modules/.bin/claude" --version 2>/dev/null | cut -d' ' -f1 || true)
have_codex=$("$tools/node_modules/.bin/codex" --version 2>/dev/null | cut -d' ' -f2 || true)
if [ "$have_claude" != "$CLAUDE_CODE_VERSION" ] || [ "$have_codex" != "$CODEX_VERSION" ]; then
  (cd "$tools" && npm install --no-audit --no-fund --loglevel=error --no-save \
      "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION")
fi
"$tools/node_modules/.bin/claude" --version
"$tools/node_modules/.bin/codex" --version
