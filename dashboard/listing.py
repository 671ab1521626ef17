"""The run list's query: newest first, cursor pages, search and filters. No I/O.

A page is found by walking the runs in (createdAt, runId) order from the cursor, so a
page costs the rows it looks at, not a sort of every run: the order is cached and only
rebuilt when the set of runs changes size. A cursor names the last row of the previous
page ("<createdAt>~<runId>"), so rows arriving meanwhile never shift a page.
"""

from __future__ import annotations

import bisect
import calendar
import time
from typing import Any, Callable, Mapping

import attrs

PAGE = 150
PAGE_MIN, PAGE_MAX = 20, 200
STATUSES = ("queued", "running", "completed", "failed", "cancelled", "interrupted")
ARCHIVED = "archived"         # ?status=archived: the runs retention archived (any status)
FILTERS = STATUSES + (ARCHIVED,)


class QueryError(ValueError):
    """A bad query parameter; the message says which and why."""


@attrs.frozen
class Query:
    q: str = ""
    status: str = ""
    caller: str = ""
    start: float | None = None        # ?from=, inclusive
    end: float | None = None          # ?to=, exclusive
    before: tuple[float, str] | None = None
    limit: int = PAGE

    def params(self, **change: Any) -> dict[str, str]:
        """The query string of this query (with changes), for links."""
        raw = {"q": self.q, "status": self.status, "caller": self.caller, **change}
        return {k: str(v) for k, v in raw.items() if v not in ("", None)}


def parse_day(value: str, name: str, end: bool) -> float:
    """YYYY-MM-DD (UTC; `to` means through that day) or YYYY-MM-DDTHH:MM[:SS] (UTC)."""
    value = value.strip().rstrip("Z")
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"):
        try:
            t = calendar.timegm(time.strptime(value, fmt))
        except ValueError:
            continue
        return t + 86_400 if (end and fmt == "%Y-%m-%d") else t
    raise QueryError(f"?{name}= must be a date like 2026-03-01 or 2026-03-01T14:30 (UTC), got {value!r}")


def parse_cursor(value: str) -> tuple[float, str]:
    at, sep, run_id = value.partition("~")
    try:
        if not sep or not run_id:
            raise ValueError
        return float(at), run_id
    except ValueError:
        raise QueryError(f"?before= is not a cursor from this page's next link: {value[:80]!r}") from None


def cursor(created_at: float, run_id: str) -> str:
    return f"{created_at!r}~{run_id}"


def parse(args: Mapping[str, str]) -> Query:
    status = (args.get("status") or "").strip()
    if status and status not in FILTERS:
        raise QueryError(f"?status= must be one of {', '.join(FILTERS)}, got {status[:40]!r}")
    try:
        limit = int(args.get("n") or PAGE)
    except ValueError:
        raise QueryError("?n= must be a whole number") from None
    return Query(q=(args.get("q") or "").strip()[:200], status=status, caller=(args.get("caller") or "").strip()[:64],
                 start=parse_day(args["from"], "from", False) if args.get("from") else None,
                 end=parse_day(args["to"], "to", True) if args.get("to") else None,
                 before=parse_cursor(args["before"]) if args.get("before") else None,
                 limit=min(PAGE_MAX, max(PAGE_MIN, limit)))


class RunIndex:
    """Runs in newest-first order, rebuilt only when the set of runs changes."""

    def __init__(self) -> None:
        self._n: tuple[int, Any] = (-1, None)
        self._keys: list[tuple[float, str]] = []      # ascending (-createdAt, negated id order)
        self._runs: list[Any] = []
        self.callers: list[str] = []

    def refresh(self, runs: Mapping[str, Any]) -> None:
        # Runs are added (and, rarely, dropped); the size and the newest key say whether.
        mark = (len(runs), next(reversed(runs.keys()), None)) if isinstance(runs, dict) else (len(runs), None)
        if mark == self._n:
            return
        ordered = sorted(runs.values(), key=lambda r: (r.created_at, r.id), reverse=True)
        self._runs = ordered
        self._keys = [(-r.created_at, _desc(r.id)) for r in ordered]
        self.callers = sorted({r.caller for r in ordered})
        self._n = mark

    def page(self, query: Query, label_of: Callable[[Any], str]) -> tuple[list[Any], str | None]:
        """One page of matching runs and the cursor of the next page (None: last page)."""
        i = 0
        if query.before is not None:
            at, run_id = query.before
            i = bisect.bisect_right(self._keys, (-at, _desc(run_id)))
        q = query.q.lower()
        out: list[Any] = []
        for run in self._runs[i:]:
            if query.end is not None and run.created_at >= query.end:
                continue
            if query.start is not None and run.created_at < query.start:
                break                                   # newest first: the rest are older
            if not matches(run, query, q, label_of):
                continue
            if len(out) == query.limit:
                last = out[-1]
                return out, cursor(last.created_at, last.id)
            out.append(run)
        return out, None


def matches(run: Any, query: Query, q: str, label_of: Callable[[Any], str]) -> bool:
    if query.status == ARCHIVED:
        if run.archived_at is None:
            return False
    elif query.status and run.status != query.status:
        return False
    if query.caller and run.caller != query.caller:
        return False
    if q:
        return q in run.id.lower() or q in run.caller.lower() or q in label_of(run).lower()
    return True


def _desc(run_id: str) -> str:
    """A key that sorts run ids in reverse (ids are lower-case hex after 'run_')."""
    return run_id.translate(_REVERSE)


_REVERSE = str.maketrans("0123456789abcdef", "fedcba9876543210")

