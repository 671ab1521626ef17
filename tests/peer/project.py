"""The resident's project both runtimes run in: a small git repository with source files
the scripts' agents read (tests/peer/seeing.py answers from what they read), two project
agent types (`.claude/agents/executor.md`, `reviewer.md`) and the project's saved
workflows. The peer runs with it as its session directory; SwarmBase gets the same call
with the project configured as a resident would: a clone owned by the sandbox user (a
root daemon's worktree git writes it as that user, and the peer, root here, refuses a
checkout it does not own), named by the caller's config or, until that exists, by the run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

FILES: dict[str, str] = {
    "README.md": "# calc\nA tiny calculator library and its tests.\n",
    "pyproject.toml": "[project]\nname = \"calc\"\nversion = \"0.3.1\"\n",
    "src/calc.py": ("def add(a, b):\n    return a + b\n\n\ndef div(a, b):\n    return a / b   # no zero check\n\n\n"
                    "def mean(xs):\n    return sum(xs) / len(xs)\n"),
    "src/parse.py": ("import re\n\nNUM = re.compile(r\"-?\\d+\")\n\n\ndef numbers(text):\n"
                     "    return [int(m) for m in NUM.findall(text)]\n"),
    "src/stub.py": "def todo():\n    raise NotImplementedError\n",
    "tests/test_calc.py": ("from calc import add, div\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                           "def test_div_zero():\n    div(1, 0)\n"),
    "tests/test_parse.py": "from parse import numbers\n\n\ndef test_numbers():\n    assert numbers('a 1 b -2') == [1, -2]\n",
    "docs/CHANGES.md": "## 0.3.1\n- mean() added\n## 0.3.0\n- div() added\n",
    "notes/triage.txt": "flaky: tests/test_calc.py::test_div_zero\nslow: none\n",
    ".claude/agents/executor.md": ("---\nname: executor\ndescription: Makes one focused change and reports it\n"
                                  "tools: Read, Edit, Write, Bash\nmodel: sonnet\n---\n"
                                  "You are the project's executor. Make the smallest change that does the task.\n"),
    ".claude/agents/reviewer.md": ("---\nname: reviewer\ndescription: Reviews a change without editing\n"
                                   "tools: Read, Grep, Glob\n---\nYou review code. Never edit files.\n"),
}


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def make_project(root: Path, extra: dict[str, str] | None = None, base: dict[str, str] = FILES) -> Path:
    """The project at `root` (created): `base` and `extra` files committed on `main`."""
    for rel, text in {**base, **(extra or {})}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "start")
    return root
