"""Realistic scripts (tests/peer/scripts/*.js) of the size residents write, each run in the
project (tests/peer/project.py) on both runtimes with the same call: `{script, args}`.

Besides the ending and the return value, these compare what the agents were asked: the
agent count, the multiset of labels and the multiset of prompts, compared as the peer
keeps them (its record's promptPreview: the first 400 characters and "…").

Two of them (executor-plan, reviewer-pass) name the project's agent types
(`.claude/agents/*.md`), which both runtimes resolve.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .cases import NO_ARGS, Case

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PREVIEW = 400

ARGS: dict[str, Any] = {
    "review-diff": {"files": ["src/calc.py", "src/parse.py"]},
    "triage-tests": NO_ARGS,
    "fix-stub-worktrees": {"approaches": ["minimal", "defensive"]},
    "executor-plan": "add a zero check to div()",
    "release-notes": "0.3.2",
    "test-gaps": {"modules": ["calc", "parse"]},
    "bug-hunt": "division by zero crashes",
}


def preview(prompt: str) -> str:
    return prompt if len(prompt) <= PREVIEW else prompt[:PREVIEW] + "\u2026"


def realistic_cases() -> list[Case]:
    out = []
    for path in sorted(SCRIPTS.glob("*.js")):
        out.append(Case(path.stem, path.read_text(), args=ARGS.get(path.stem, NO_ARGS), needs=("project",)))
    return out


REALISTIC = realistic_cases()
