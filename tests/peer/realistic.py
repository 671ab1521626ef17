"""Realistic scripts (tests/peer/scripts/*.js) of the size residents write, each run in the
project (tests/peer/project.py) on both runtimes with the same call: `{script, args}`.

Besides the ending and the return value, these compare what the agents were asked: the
agent count, the multiset of labels and the multiset of prompts, compared as the peer
keeps them (its record's promptPreview: the first 400 characters and "…").

A script whose text says "needs issue 28 item 2" names project agent types
(`.claude/agents/*.md`), which SwarmBase does not resolve yet: it is expected to differ
(SwarmBase refuses the agentType) until the lead flips NEEDS_PROJECT_AGENT_TYPES.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .cases import NO_ARGS, Case

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PREVIEW = 400
AGENT_TYPES_MARK = "needs issue 28 item 2"
# Flipped True by the lead once issue 28 item 2 (project agent types) is merged.
NEEDS_PROJECT_AGENT_TYPES_MERGED = False

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


def _agent_types_refused(cc: Any, sb: Any) -> None:
    assert cc.status == "completed", cc.error
    assert sb.status == "failed" or "agentType" in str(sb.result) or any("agentType" in line for line in sb.logs), \
        (sb.status, sb.error, sb.result)


def realistic_cases() -> list[Case]:
    out = []
    for path in sorted(SCRIPTS.glob("*.js")):
        text = path.read_text()
        pending = AGENT_TYPES_MARK in text and not NEEDS_PROJECT_AGENT_TYPES_MERGED
        out.append(Case(path.stem, text, args=ARGS.get(path.stem, NO_ARGS), needs=("project",),
                        differs="project agent types: SwarmBase resolves only its built-in types until issue 28 "
                                "item 2" if pending else None,
                        check=_agent_types_refused if pending else None))
    return out


REALISTIC = realistic_cases()
