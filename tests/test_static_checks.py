"""The type checker and the linter run inside the one test command, over swarmbase/ and
dashboard/, as subprocesses with their caches under the repository (.mypy_cache,
.ruff_cache: ignored by git), so a rerun costs little: mypy as pyproject.toml [tool.mypy]
sets it (check_untyped_defs, warn_unused_ignores; no explicit Any in swarmbase.runs), and
ruff (pyflakes, pycodestyle errors, bugbear, and the async rules, so no blocking file,
path or process call lands on the event loop)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_passes() -> None:
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-fix", "swarmbase", "dashboard"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_passes() -> None:
    p = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
