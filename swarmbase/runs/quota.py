"""Spend quotas over time: a caller's `usdPerDay` and `usdPerMonth`, over UTC windows (the
day from 00:00Z, the month from the 1st 00:00Z), counted from the same agent records the
`usage` tool reads (an agent counts on the UTC day it ended; replayed agents spend nothing).

The rule, and the bound it gives. A run *reserves its whole USD budget* from each of its
caller's windows when it starts, and is refused when that does not fit:

    spent in the window + reserved by the caller's active runs + the new run's budget <= limit

where an active run's reservation is its budget minus what its ended agents cost (so the
running agents' reservations, which come out of the run's budget, are inside it). Start is
synchronous on the event loop, so runs started at the same instant are admitted one after
the other and each sees the others' reservations: together they cannot reserve more than
the window has left. Spend then only moves from reserved to spent, and a run spends at
most its budget plus the per-run overshoot (one model turn per running agent: an agent is
stopped at its cap, and the turn it was in is paid). So for every window:

    spent in the window <= limit + the overshoot of the runs active in it

and with no overshoot (agents that stay inside their caps) never more than the limit.
A per-agent window gate would let a run start with less than its budget left, but agents
would then wait on other runs' agents, and it would put the window into every agent start;
whole-budget reservations keep it to one check per run start.

Cost, and the cache (the rule for invalidating it). Re-reading every record per run start
would cost O(runs in the month). Instead the book keeps, per caller, the USD per UTC day
of runs that have *ended*: an ended run's agent records never change (they are sealed in
its end record), so each ended run is folded in exactly once, from the in-memory records
its agent.json files are written from, at the first check after it ended; runs that ended
before this daemon started are read from disk once per caller (`prime`, at boot in a
worker thread, or at that caller's first check). Nothing else invalidates it. A check then
costs O(the caller's active runs and their agents) plus a sum over at most 31 days.
bench/quota_check.py measures it with many records.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs

from .. import money, usage
from ..config import Caller
from ..jsonvalue import JsonObject
from .model import Run
from .records import AgentRecord

WINDOWS = ("day", "month")
LIMIT_KEY = {"day": "usdPerDay", "month": "usdPerMonth"}
KEEP_DAYS = 62          # folded days older than this can no longer be in any window


def bounds(kind: str, t: float) -> tuple[float, float]:
    """[start, end) of the UTC day or month holding t, as epoch seconds."""
    d = dt.datetime.fromtimestamp(t, dt.timezone.utc).date()
    if kind == "day":
        first, nxt = d, d + dt.timedelta(days=1)
    else:
        first = d.replace(day=1)
        nxt = (first + dt.timedelta(days=32)).replace(day=1)
    return usage.epoch(first), usage.epoch(nxt)


def iso_z(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def limit_of(caller: Caller, kind: str) -> float | None:
    return caller.usdPerDay if kind == "day" else caller.usdPerMonth


PENDING = ("this caller's spend quota is still being counted from its agent records (the daemon has just "
           "started); retry in a few seconds")


class QuotaPending(Exception):
    """The caller's history is still being read: nothing can be admitted on a partial count."""


@attrs.frozen
class Window:
    kind: str
    limit: float
    spent: float
    reserved: float
    start: float
    end: float

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.spent - self.reserved)

    def view(self) -> JsonObject:
        return {"window": self.kind, "limitUsd": self.limit, "spentUsd": round(self.spent, 6),
                "reservedUsd": round(self.reserved, 6), "leftUsd": round(self.left, 6),
                "from": iso_z(self.start), "resetsAt": iso_z(self.end)}

    def refusal(self, budget: float) -> str:
        what = "daily" if self.kind == "day" else "monthly"
        return (f"this caller's {what} spend quota cannot fit the run: its budget is {money.usd(budget)} and "
                f"{money.usd(self.left)} is left of {LIMIT_KEY[self.kind]} {money.usd(self.limit)} "
                f"({money.usd(self.spent)} spent, {money.usd(self.reserved)} reserved by running runs); "
                f"the window resets at {iso_z(self.end)} (UTC). Pass a budgetUsd that fits, or wait")


@attrs.define(eq=False)
class _Active:
    run: Run
    agents: Mapping[int, AgentRecord]         # the LiveRun's own dict


# (caller, window start, window end) -> (run id, run dir) of the caller's ended runs that may hold
# agents ending in the window; the book skips those it counted from memory.
History = Callable[[str, float, float], Iterable[tuple[str, Path]]]


class QuotaBook:
    def __init__(self, history: History, clock: Callable[[], float] = time.time,
                 read: Callable[[Path], list[usage.Spent]] | None = None) -> None:
        self.history = history
        self.clock = clock
        self.read = read or (lambda d: usage.CACHE.spent(d, True))
        self._days: dict[str, dict[str, float]] = {}      # caller -> UTC day -> USD of ended runs
        self._active: dict[str, _Active] = {}             # run id -> active run
        self._known: set[str] = set()                     # run ids admitted here (never read from disk)
        self._primed: set[str] = set()
        self._priming: set[str] = set()                   # being read (boot, in a worker thread)
        self._lock = threading.RLock()                    # `usage` reads from a worker thread

    # -- what the supervisor tells it ------------------------------------------
    def admit(self, run: Run, agents: Mapping[int, AgentRecord]) -> None:
        with self._lock:
            self._fold_ended()          # also here: callers without a quota never ask for windows
            self._active[run.id] = _Active(run, agents)
            self._known.add(run.id)

    def begin_priming(self, callers: Iterable[Caller]) -> list[str]:
        """Boot (and a reload giving callers a quota), on the event loop: mark the callers
        with a quota whose history is still to be read. Until prime() has read it, their
        runs are refused as pending (QuotaPending), never admitted on a partial count."""
        names = []
        with self._lock:
            for c in callers:
                if (c.usdPerDay is not None or c.usdPerMonth is not None) \
                        and c.name not in self._primed and c.name not in self._priming:
                    self._priming.add(c.name)
                    names.append(c.name)
        return names

    def prime_all(self, names: Iterable[str]) -> None:
        """In a worker thread: prime the callers begin_priming returned."""
        for name in names:
            self.prime(name)

    def prime(self, caller: str) -> None:
        """Fold the runs that ended before this book knew them (this month), once per caller."""
        with self._lock:
            if caller in self._primed:
                return
            self._priming.add(caller)
            lo, hi = bounds("month", self.clock())
            runs = [(rid, d) for rid, d in self.history(caller, lo, hi) if rid not in self._known]
            self._known.update(rid for rid, _ in runs)
        days: dict[str, float] = {}
        try:
            for _, d in runs:
                for s in self.read(d):
                    day = usage.utc_day(s.ended_at)
                    days[day] = days.get(day, 0.0) + s.cost
        finally:
            with self._lock:
                mine = self._days.setdefault(caller, {})
                for day, usd in days.items():
                    mine[day] = mine.get(day, 0.0) + usd
                self._priming.discard(caller)
                self._primed.add(caller)

    # -- the windows ------------------------------------------------------------
    def _fold_ended(self) -> None:
        for rid, a in list(self._active.items()):
            if a.run.active:
                continue
            mine = self._days.setdefault(a.run.caller, {})
            for rec in list(a.agents.values()):
                if rec.ended_at is not None and not rec.replayed:
                    day = usage.utc_day(rec.ended_at)
                    mine[day] = mine.get(day, 0.0) + rec.cost_usd
            del self._active[rid]
        oldest = usage.utc_day(self.clock() - KEEP_DAYS * 86400)
        for mine in self._days.values():
            for day in [d for d in mine if d < oldest]:
                del mine[day]

    def windows(self, caller: Caller) -> list[Window]:
        """The caller's configured windows, now."""
        kinds = [k for k in WINDOWS if limit_of(caller, k) is not None]
        if not kinds:
            return []
        with self._lock:
            pending = caller.name in self._priming
        if pending:
            raise QuotaPending(PENDING)
        self.prime(caller.name)     # a caller that got a quota without begin_priming: read now, once
        now = self.clock()
        with self._lock:
            self._fold_ended()
            days = dict(self._days.get(caller.name, {}))
            active = [a for a in self._active.values() if a.run.caller == caller.name]
        live_spent: list[tuple[float, float]] = []     # (ended at, USD) of active runs' ended agents
        reserved = 0.0
        for a in active:
            ended = [(rec.ended_at, rec.cost_usd) for rec in list(a.agents.values())
                     if rec.ended_at is not None and not rec.replayed]
            live_spent += ended
            reserved += max(0.0, a.run.budget_usd - sum(c for _, c in ended))
        out = []
        for kind in kinds:
            lo, hi = bounds(kind, now)
            first, last = usage.utc_day(lo), usage.utc_day(hi - 1)
            spent = sum(v for d, v in days.items() if first <= d <= last)
            spent += sum(c for t, c in live_spent if lo <= t < hi)
            out.append(Window(kind, float(limit_of(caller, kind)), spent, reserved, lo, hi))  # type: ignore[arg-type]
        return out

    def refusal(self, caller: Caller, budget_usd: float) -> str | None:
        """Why a run of this budget cannot start now (None: it fits every window)."""
        try:
            windows = self.windows(caller)
        except QuotaPending as e:
            return str(e)
        for w in windows:
            if budget_usd > w.left + 1e-9:
                return w.refusal(budget_usd)
        return None

    def view(self, caller: Caller) -> list[JsonObject]:
        try:
            return [w.view() for w in self.windows(caller)]
        except QuotaPending as e:
            return [{"window": k, "limitUsd": limit_of(caller, k), "pending": str(e)} for k in WINDOWS
                    if limit_of(caller, k) is not None]


def history_of(runs: Mapping[str, Run], run_dir: Callable[[Run], Path], state_dir: Path) -> History:
    """History from the supervisor's run table: a caller's ended runs that may hold agents
    ending in [lo, hi), read where `usage` reads them (archived ones from their zips).
    Called on whichever thread primes; the table is copied first."""
    def history(caller: str, lo: float, hi: float) -> list[tuple[str, Path]]:
        return [(r.id, d) for r, d in usage.runs_in(list(runs.values()), caller, lo, hi, run_dir, state_dir)
                if not r.active]
    return history
