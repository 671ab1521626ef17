#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine (as root in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null || { echo "tests/install.sh: node (20+) is required on PATH" >&2; exit 1; }
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
