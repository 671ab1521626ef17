"""Which ended runs retention prunes (archives or deletes), and the `retention` config key.
Pure logic: no I/O, no clock (the caller passes `now` and what it knows from disk).

The rule (README "Retention"):

* Only ended runs are candidates: never a queued or running one, never one whose final
  records still wait in memory for disk space, never one already archived.
* `days`: an ended run whose end is more than `days` ago is pruned.
* `maxRuns`: each caller keeps the directories of its newest `maxRuns` ended runs (by end
  time); older ones are pruned. Counted per caller, so one caller's burst of runs never
  pushes another caller's runs out; the disk used is still bounded (callers x maxRuns).
* A resumable run is never pruned by `maxRuns` while it is younger than `days` (or at all
  when `days` is not set), unless `keepResumable` is false. Resumable means what `resume`
  can save money on: a run that ended failed or interrupted, has journal lines (finished
  agents whose results would replay for free), and has not been resumed already (a resume
  carries those lines into the new run's journal). A completed run replays too, but there
  is nothing left to finish; a cancelled one was stopped on purpose.

Per caller settings were weighed and left out: the disk is the operator's, and one
daemon-wide policy (counted per caller) is what an operator can reason about.
"""

from __future__ import annotations

from typing import Callable, Iterable, Literal, Optional

import attrs

from ..config_schema import ConfigError
from ..config_schema import field as _f
from .model import Run

RESUMABLE_STATUSES = ("failed", "interrupted")
ENDED = ("completed", "failed", "cancelled", "interrupted")
DAY_S = 86_400.0


@attrs.frozen
class Retention:
    """`retention` in the config: when ended runs are archived or deleted."""
    days: Optional[float] = _f("days", None, lo=0.001, hi=36_500)
    maxRuns: Optional[int] = _f("maxRuns", None, lo=1, hi=100_000_000)
    action: Literal["archive", "delete"] = _f("action", "archive")
    keepResumable: bool = _f("keepResumable", True)
    # How often the pass runs after the one at boot.
    intervalMinutes: float = _f("intervalMinutes", 60, lo=0.05, hi=7 * 24 * 60)


def check(r: Optional[Retention]) -> None:
    """What the schema cannot say: a policy that prunes nothing is a mistake."""
    if r is not None and r.days is None and r.maxRuns is None:
        raise ConfigError("retention: set days, maxRuns or both (with neither, nothing would ever be pruned; "
                          "leave retention out to keep every run)")


def maybe_resumable(run: Run) -> bool:
    """The part of 'resumable' the record says; the journal's lines are the caller's to check."""
    return run.status in RESUMABLE_STATUSES and not run.resumed_as


def select(runs: Iterable[Run], policy: Retention, now: float, busy: Callable[[Run], bool],
           has_journal: Callable[[Run], bool]) -> list[Run]:
    """The runs to prune now, oldest end first. `busy(run)`: held in memory (live, or final
    records not yet on disk); `has_journal(run)`: its journal holds a line (asked only of
    failed and interrupted runs the count would prune)."""
    ended = [r for r in runs if r.status in ENDED and r.ended_at is not None
             and r.archived_at is None and not busy(r)]
    window = None if policy.days is None else now - policy.days * DAY_S
    out = []
    by_caller: dict[str, list[Run]] = {}
    for r in ended:
        if window is not None and r.ended_at is not None and r.ended_at < window:
            out.append(r)                   # past the window: pruned, resumable or not
        else:
            by_caller.setdefault(r.caller, []).append(r)
    if policy.maxRuns is not None:
        for rs in by_caller.values():
            rs.sort(key=lambda r: (r.ended_at or 0.0, r.created_at), reverse=True)
            for r in rs[policy.maxRuns:]:
                if policy.keepResumable and maybe_resumable(r) and has_journal(r):
                    continue                # still resumable within the window
                out.append(r)
    out.sort(key=lambda r: (r.ended_at, r.created_at))
    return out
