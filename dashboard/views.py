"""What the run and agent pages show, computed from runs and agent rows. Pure, no I/O.

Money has one rounding rule, the daemon's (swarmbase/money.py) and common.js alike: an
amount is shown to 1/10,000 of a dollar, rounded half up (`usd_units`), and a total is the
exact sum rounded once, so the per-phase and per-engine tables' foot is the figure the
run's header shows.
"""

from __future__ import annotations

import calendar
import math
import time
from typing import Any, Iterable

from swarmbase import money

AGENT_DEFAULTS: dict[str, Any] = {
    "label": "", "engine": "claude", "model": None, "profile": None, "state": "queued", "costUsd": 0.0,
    "estimated": False, "priced": True, "tokens": 0, "durationS": None, "replayed": False,
    "queuedAt": None, "startedAt": None, "endedAt": None, "error": None, "phase": None, "workflow": "",
    "originalDurationS": None, "node": None, "branch": None,
}
ENDED_STATES = ("done", "failed", "skipped", "cancelled", "interrupted")
WHY_STATES = ("failed", "cancelled", "skipped", "interrupted")
UNIT = money.UNIT
STATE_MARK = {"running": "●", "queued": "●", "completed": "✓", "failed": "✗", "cancelled": "⊘",
              "interrupted": "⊘"}


# One money rule for the daemon and the pages (swarmbase/money.py; common.js mirrors it).
usd_units = money.units
fmt_units = money.fmt_units
usd = money.usd


def dur(seconds: Any) -> str:
    """A duration as the pages show it (common.js `SB.dur` is the same): 4.2s, 3m07s, 2h05m."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return ""
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def utc(epoch: Any) -> str:
    """A time for a page that runs no script (the script shows "3 min ago" instead)."""
    if not isinstance(epoch, (int, float)):
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def agent_cost(row: dict[str, Any]) -> str:
    """An agent's cost cell: "no price", "$0.0123", or "~$0.0123" while estimated."""
    if row.get("priced") is False:
        return "no price"
    return ("~" if row.get("estimated") else "") + usd(row.get("costUsd"))


def normalize(row: dict[str, Any], phase: str | None = None) -> dict[str, Any]:
    """An agent row with every field of the contract present (older rows lack some)."""
    out = {**AGENT_DEFAULTS, **{k: v for k, v in row.items() if v is not None or k in ("model", "error")}}
    if isinstance(out.get("tokens"), dict):                # agent.json keeps the breakdown
        out["tokens"] = int(out["tokens"].get("total") or 0)
    if phase is not None and not out.get("phase"):
        out["phase"] = phase
    out["workflow"] = str(out.get("workflow") or "")
    return out


def totals(rows: Iterable[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Cost and tokens per `by` (phase or engine), in first-seen order, plus a total row.
    Sums are exact, rounded once into `units`, and say whether any part is estimated."""
    groups: dict[str, dict[str, Any]] = {}
    total: dict[str, Any] = {"name": "total", "agents": 0, "usd": 0.0, "tokens": 0, "estimated": False, "unpriced": 0}
    for r in rows:
        name = str(r.get(by) or ("main" if by == "phase" else "?"))
        g = groups.setdefault(name, {"name": name, "agents": 0, "usd": 0.0, "tokens": 0, "estimated": False,
                                     "unpriced": 0})
        for t in (g, total):
            t["agents"] += 1
            t["tokens"] += int(r.get("tokens") or 0)
            if r.get("priced") is False:
                t["unpriced"] += 1
            else:
                t["usd"] += money.exact(r.get("costUsd"))
                t["estimated"] = t["estimated"] or bool(r.get("estimated"))
    out = [*groups.values(), total]
    for t in out:
        t["units"] = usd_units(t["usd"])
    return out


def parse_iso(at: Any) -> float | None:
    """Epoch seconds from the records' ISO times ("2026-01-02T03:04:05.678Z")."""
    if not isinstance(at, str) or len(at) < 19:
        return None
    try:
        base = calendar.timegm(time.strptime(at[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    frac = at[19:].rstrip("Z")
    try:
        return base + (float(frac) if frac.startswith(".") else 0.0)
    except ValueError:
        return float(base)


def segments(history: Iterable[dict[str, Any]]) -> list[list[Any]]:
    """[[state, epoch], ...]: when the agent entered each state (for the timeline)."""
    out: list[list[Any]] = []
    for h in history:
        t = parse_iso(h.get("at"))
        if t is not None and h.get("state"):
            out.append([h["state"], round(t, 3)])
    return out


def run_title(status: str, label: str, done: int, total: int, running: int | None) -> str:
    """The page title: "● 3/8 running — label" while live; a mark and the label after."""
    mark = STATE_MARK.get(status, "·")
    if status in ("queued", "running"):
        return f"{mark} {done}/{total} {status} — {label}"
    return f"{mark} {label} — {status}"


def budget_bar(spent: float, reserved: float, budget: float) -> dict[str, Any]:
    """Widths (percent of the bar) for spent and reserved, and whether spend passed the budget."""
    spent, reserved, budget = (max(0.0, float(x or 0)) for x in (spent, reserved, budget))
    scale = max(budget, spent + reserved, 1e-9)
    return {"spentPct": round(100 * spent / scale, 2), "reservedPct": round(100 * reserved / scale, 2),
            "over": spent > budget + 1e-9}
