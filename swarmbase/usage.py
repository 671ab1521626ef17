"""Spend reports, computed from the agent records themselves (agents/<n>/agent.json), not
from a second ledger that could drift from them.

A row is one (UTC day, caller, engine, model): the cost, tokens and number of the agents
that *ended* that day. Replayed agents are left out: a replay spends nothing, and its cost
was counted on the day the agent first ran.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, TextIO

import attrs

from . import money
from .audit.rundirs import agent_records, read_json
from .audit.tree import token_detail
from .runs import archive

if TYPE_CHECKING:
    from .config import Caller
    from .runs.env import RunEnv
    from .runs.model import Run


class QuotaView(Protocol):
    def view(self, caller: Caller) -> list[dict[str, Any]]: ...


class DaemonSpend(Protocol):
    """What the daemon's usage view reads (the Supervisor has it): its runs, where their
    records are, and the callers' spend quotas (runs/quota.py, which reads this module)."""
    @property
    def runs(self) -> Mapping[str, Run]: ...

    @property
    def env(self) -> RunEnv: ...

    @property
    def quota(self) -> QuotaView: ...


DEFAULT_DAYS = 30
MAX_DAYS = 366
DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# A run is skipped when it ended this long before the window opened (agents end before
# their run does; the slack absorbs a clock step).
SLACK_S = 3600.0

DATE_SCHEMA = {"type": "string", "pattern": DATE_RE.pattern, "description": "A UTC date, YYYY-MM-DD"}
TOOL = {
    "name": "usage",
    "description": ("Your spend per UTC day, engine and model, computed from your runs' agent records: "
                    "{rows: [{date, caller, engine, model, costUsd, tokens, agents}], totals, quota}. "
                    "Default: the last 30 days (from and to are inclusive). quota lists your spend quotas "
                    "(usdPerDay, usdPerMonth; [] without any) as they stand now: [{window: day|month, limitUsd, "
                    "spentUsd, reservedUsd (the unspent budgets of your running runs), leftUsd, from, resetsAt}]; "
                    "a run whose budgetUsd is above leftUsd is refused."),
    "inputSchema": {"type": "object", "properties": {"from": DATE_SCHEMA, "to": DATE_SCHEMA},
                    "additionalProperties": False},
}


class UsageError(ValueError):
    """A bad date range; str() says which bound and why."""


def parse_day(value: str, what: str) -> dt.date:
    if not DATE_RE.fullmatch(value):
        raise UsageError(f"{what}: {value!r} is not a date (YYYY-MM-DD)")
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise UsageError(f"{what}: {value!r} is not a calendar date") from None


def date_range(start: str | None, end: str | None, today: dt.date | None = None,
               max_days: int | None = MAX_DAYS) -> tuple[dt.date, dt.date]:
    """(first, last) day, inclusive. Default: the DEFAULT_DAYS days ending today (UTC)."""
    today = today or dt.datetime.now(dt.timezone.utc).date()
    last = parse_day(end, "to") if end else today
    first = parse_day(start, "from") if start else last - dt.timedelta(days=DEFAULT_DAYS - 1)
    if first > last:
        raise UsageError(f"from {first} is after to {last}")
    if max_days is not None and (last - first).days + 1 > max_days:
        raise UsageError(f"the range {first}..{last} is longer than {max_days} days")
    return first, last


def epoch(day: dt.date) -> float:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp()


def utc_day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).date().isoformat()


def run_in_window(created_at: Any, ended_at: Any, lo: float, hi: float) -> bool:
    if isinstance(created_at, (int, float)) and created_at >= hi:
        return False
    if isinstance(ended_at, (int, float)) and ended_at < lo - SLACK_S:
        return False
    return True


@attrs.frozen
class Spent:
    """What one ended, non-replayed agent record says about spend."""
    ended_at: float
    engine: str
    model: str | None
    cost: float
    tokens: int
    estimated: bool
    unpriced: bool


def spent_in(run_dir: Path) -> list[Spent]:
    """`run_dir`: a run dir, or an archived run's zip (runs/archive.py)."""
    out = []
    for _, rec in agent_records(run_dir) if run_dir.suffix != ".zip" else archive.agent_records(run_dir):
        ended = rec.get("endedAt")
        if rec.get("replayed") or not isinstance(ended, (int, float)) or isinstance(ended, bool):
            continue
        cost = rec.get("costUsd")
        out.append(Spent(float(ended), str(rec.get("engine") or "?"),
                         rec.get("model") if isinstance(rec.get("model"), str) else None,
                         float(cost) if isinstance(cost, (int, float)) else 0.0, token_detail(rec)["total"],
                         bool(rec.get("estimated")), rec.get("priced", True) is False))
    return out


class SpentCache:
    """The spend facts of *ended* runs, kept after their records were read once: an ended
    run's agent records are final (sealed in its end record), so a daemon answering
    `usage` again reads only the runs still in flight. Bounded; safe across threads (the
    dashboard reads in a worker thread). A record edited after its run ended keeps its
    sealed values here; `audit` shows the edit."""

    def __init__(self, max_runs: int = 4096) -> None:
        self.max_runs = max_runs
        self._runs: OrderedDict[Path, list[Spent]] = OrderedDict()
        self._lock = threading.Lock()

    def spent(self, run_dir: Path, ended: bool) -> list[Spent]:
        if not ended:
            return spent_in(run_dir)
        with self._lock:
            hit = self._runs.get(run_dir)
            if hit is not None:
                self._runs.move_to_end(run_dir)
                return hit
        facts = spent_in(run_dir)
        with self._lock:
            self._runs[run_dir] = facts
            while len(self._runs) > self.max_runs:
                self._runs.popitem(last=False)
        return facts


CACHE = SpentCache()       # the daemon's (tool and dashboard); the CLI reads afresh


def report(runs: Iterable[tuple[str, Path, bool]], first: dt.date, last: dt.date,
           cache: SpentCache | None = None) -> dict[str, Any]:
    """`runs`: (caller, run dir, ended) of the runs to count (already pruned to the window)."""
    lo, hi = epoch(first), epoch(last + dt.timedelta(days=1))
    groups: dict[tuple[str, str, str, str | None], dict[str, Any]] = {}
    for caller, d, run_ended in runs:
        for s in cache.spent(d, run_ended) if cache else spent_in(d):
            if not lo <= s.ended_at < hi:
                continue
            key = (utc_day(s.ended_at), caller, s.engine, s.model)
            g = groups.setdefault(key, {"date": key[0], "caller": caller, "engine": s.engine, "model": s.model,
                                        "costUsd": 0.0, "tokens": 0, "agents": 0, "estimated": False, "unpriced": 0})
            g["costUsd"] += s.cost
            g["tokens"] += s.tokens
            g["agents"] += 1
            g["estimated"] = g["estimated"] or s.estimated
            g["unpriced"] += s.unpriced
    rows = [groups[k] for k in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] or ""))]
    for r in rows:
        r["costUsd"] = round(r["costUsd"], 6)
    totals = {"costUsd": round(sum(r["costUsd"] for r in rows), 6), "tokens": sum(r["tokens"] for r in rows),
              "agents": sum(r["agents"] for r in rows)}
    return {"from": first.isoformat(), "to": last.isoformat(), "rows": rows, "totals": totals}


def runs_on_disk(state_dir: Path, first: dt.date, last: dt.date, caller: str | None) -> list[tuple[str, Path, bool]]:
    lo, hi = epoch(first), epoch(last + dt.timedelta(days=1))
    root = state_dir / "runs"
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        run = read_json(d / "run.json")
        if not isinstance(run, dict) or not isinstance(run.get("caller"), str):
            continue
        if caller is not None and run["caller"] != caller:
            continue
        if run_in_window(run.get("createdAt"), run.get("endedAt"), lo, hi):
            out.append((run["caller"], d, run.get("endedAt") is not None))
    for line in archive.index_lines(state_dir):          # archived runs, read from their zips
        run = line["run"]
        if isinstance(run.get("caller"), str) and (caller is None or run["caller"] == caller) \
                and isinstance(line.get("dirName"), str) and run_in_window(run.get("createdAt"), run.get("endedAt"), lo, hi):
            out.append((run["caller"], archive.zip_path(state_dir, line["dirName"]), True))
    return out


def report_for_state(state_dir: Path, start: str | None = None, end: str | None = None,
                     caller: str | None = None, today: dt.date | None = None,
                     max_days: int | None = MAX_DAYS) -> dict[str, Any]:
    first, last = date_range(start, end, today, max_days)
    return report(runs_on_disk(state_dir, first, last, caller), first, last)


def spend_path(run: Run, run_dir: Callable[[Run], Path], state_dir: Path) -> Path:
    """Where a run's agent records are read: its run dir, or its zip once retention has
    archived it (runs/archive.py). The one answer for `usage` and the quota history, so an
    archived run's spend counts in both (issue 32 #1)."""
    return run_dir(run) if run.archived_at is None else archive.zip_path(state_dir, run.dir_name)


def runs_in(runs: Iterable[Run], caller: str | None, lo: float, hi: float, run_dir: Callable[[Run], Path],
            state_dir: Path) -> list[tuple[Run, Path]]:
    """The runs (of `caller`, or everyone's) that may hold agents ending in [lo, hi), each
    with where its records are read. Pruned on the run table alone: no file is read."""
    return [(r, spend_path(r, run_dir, state_dir)) for r in runs
            if (caller is None or r.caller == caller) and run_in_window(r.created_at, r.ended_at, lo, hi)]


def supervisor_runs(sup: DaemonSpend, caller: str | None, first: dt.date, last: dt.date) -> list[tuple[str, Path, bool]]:
    """(caller, dir) of the daemon's runs that may hold agents ending in the window, pruned
    on the runs it holds in memory. Cheap; call it on the event loop, then `report` (which
    reads files) may run in a thread."""
    lo, hi = epoch(first), epoch(last + dt.timedelta(days=1))
    return [(r.caller, d, not r.active)
            for r, d in runs_in(list(sup.runs.values()), caller, lo, hi, sup.env.store.dir, sup.env.cfg.state_dir)]


def report_for_supervisor(sup: DaemonSpend, caller: str | None, start: str | None = None, end: str | None = None,
                          today: dt.date | None = None) -> dict[str, Any]:
    """The daemon's view: reads only the agent records of runs in the window."""
    first, last = date_range(start, end, today)
    return report(supervisor_runs(sup, caller, first, last), first, last, CACHE)


def tool_handler(sup: DaemonSpend, caller: Caller, a: dict[str, Any]) -> dict[str, Any]:
    """The `usage` tool: the calling caller's spend. Raises UsageError for a bad range
    (tools.py turns it into a ToolError)."""
    return {**report_for_supervisor(sup, caller.name, a.get("from"), a.get("to")), "quota": sup.quota.view(caller)}


def render_table(rep: dict[str, Any]) -> str:
    head = ("date", "caller", "engine", "model", "agents", "tokens", "cost")
    body = [(r["date"], r["caller"], r["engine"], r["model"] or "-", str(r["agents"]), f"{r['tokens']:,}",
             money.usd(r["costUsd"]) + ("~" if r["estimated"] else "")
             + (f" ({r['unpriced']} no price)" if r["unpriced"] else ""))
            for r in rep["rows"]]
    t = rep["totals"]
    foot = ("total", "", "", "", str(t["agents"]), f"{t['tokens']:,}", money.total(r["costUsd"] for r in rep["rows"]))
    widths = [max(len(row[i]) for row in [head, *body, foot]) for i in range(len(head))]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i >= 4 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=False))).rstrip()

    lines = [f"spend {rep['from']} .. {rep['to']} (UTC, by agent end time; ~ = includes estimates)", fmt(head)]
    lines += [fmt(r) for r in body] or ["(no agents ended in this range)"]
    lines.append(fmt(foot))
    return "\n".join(lines) + "\n"


def usage_command(state_dir: Path, start: str | None, end: str | None, caller: str | None, as_json: bool,
                  out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        rep = report_for_state(state_dir, start, end, caller, max_days=None)
    except UsageError as e:
        print(f"swarmbase usage: {e}", file=err)
        return 2
    out.write(json.dumps(rep, ensure_ascii=False, indent=1) + "\n" if as_json else render_table(rep))
    return 0
