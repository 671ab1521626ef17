"""What an agent() call answers and what it is charged: pure functions of an agent's
record, verdict and streamed usage (agents.py does the waiting, launching and I/O)."""

from __future__ import annotations

import json
from typing import Callable, Mapping

from ..engines.base import LiveUsage
from ..engines.verdict import Verdict
from ..jsonvalue import Json
from ..prices import Tokens
from .records import AgentRecord


def killed_cost(usage: LiveUsage) -> float:
    """A killed agent is charged what it streamed; with no response begun, nothing."""
    return usage.cost_usd if usage.responses else 0.0


def charge(verdict: Verdict | None, usage: LiveUsage) -> tuple[Tokens, float, bool]:
    """(tokens, USD, estimated) for an agent that started: the CLI's own figures when it
    reported them, else what it was seen to stream."""
    if verdict is not None:
        tokens, cost = verdict.tokens, verdict.cost_usd
        estimated = cost is None or not verdict.tokens_exact
        if cost is None:
            cost = killed_cost(usage) if tokens.total == 0 else usage.cost_usd
    else:
        tokens, cost = usage.tokens, killed_cost(usage)
        estimated = usage.responses > 0 and not usage.exact
    if not usage.responses and not tokens.total:
        estimated = False
    return tokens, cost, estimated


def workflow_stop(cancelled: Mapping[str, str], path: str) -> tuple[str, str] | None:
    """An agent inside a workflow the script gave up (a race or waitN loser)."""
    for p, reason in cancelled.items():
        if path == p or path.startswith(p + "/"):
            return "cancelled", f"cancelled: {reason} (workflow {p})"
    return None


def answer(detail: bool, rec: AgentRecord, redact: Callable[[str], str], value: Json,
           verdict: Verdict | None) -> Json:
    """The value agent() resolves to: the value, or with `detail` the whole outcome."""
    if not detail:
        return value
    text = verdict.text if verdict is not None else None
    return {"ok": rec.state == "done", "value": value,
            "text": redact(text) if isinstance(text, str) else None,
            "error": rec.error, "schemaError": verdict.schema_error if verdict is not None else None,
            "costUsd": round(rec.cost_usd, 6), "estimated": rec.cost_estimated, "tokens": rec.tokens.total,
            "n": rec.n, "replayed": False, **({"worktree": rec.branch} if rec.branch else {})}


def replayed(detail: bool, n: int, value: Json, worktree: str | None) -> Json:
    """A journaled success answered again on resume: free, marked replayed."""
    if not detail:
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {"ok": True, "value": value, "text": text, "error": None, "schemaError": None,
            "costUsd": 0.0, "estimated": False, "tokens": 0, "n": n, "replayed": True,
            **({"worktree": worktree} if worktree else {})}
