"""The retention pass: ended runs past `retention` archived or deleted, at boot and then
every `intervalMinutes` (a trio task in the supervisor's nursery).

The policy is read from the running Config at each pass, so a reload changes it (it is a
policy, not something bound at start): the reload wakes the task, which passes at once
with the new policy and then keeps the new interval; with `retention` removed it only
waits for the next reload. A pass under way when the reload comes finishes with the
policy it started with (cancelling it mid-run could part a zip from its run's record).

What is picked is decided on the event loop from the runs held in memory (retention_rules,
no reads but a stat of a failed run's journal); the zipping and removing happen in a
worker thread, one run at a time, so a pass over thousands of runs never stalls the loop
and a run is in memory either as it was or as archived, never in between. Each run is
checked again just before its turn (a resume may have picked it up meanwhile).

Boot's part (`recover`): finish or undo what a killed pass left (archive.settle) before the
runs are loaded, and afterwards add the archived runs from the archive index.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Callable, MutableMapping

import attrs
import trio

from ..thread_runner import ThreadRunner
from . import archive
from .model import Run
from .retention_rules import Retention, select

log = logging.getLogger("swarmbase.retention")


def settle(state_dir: Path) -> None:
    """Before boot loads the runs: a pass a kill -9 cut short is finished or undone."""
    done = archive.settle(state_dir)
    for line in done[:20]:
        log.warning("retention: %s (a pass was cut short)", line)
    if len(done) > 20:
        log.warning("retention: … and %d more", len(done) - 20)


def load_archived(state_dir: Path, runs: MutableMapping[str, Run]) -> int:
    """The archived runs, from the archive index, added to `runs` (a run also on disk as a
    dir is left as loaded from it). Returns how many."""
    n = 0
    for run, at in archive.load_index(state_dir):
        if run.id not in runs:
            run.archived_at = at
            runs[run.id] = run
            n += 1
    return n


@attrs.define
class PassReport:
    archived: int = 0
    deleted: int = 0
    failed: int = 0
    raw_bytes: int = 0
    zip_bytes: int = 0
    seconds: float = 0.0


@attrs.define
class RetentionPass:
    policy: Callable[[], Retention | None]    # read at each pass: the running Config's
    state_dir: Path
    runs: MutableMapping[str, Run]            # every run the daemon holds (the supervisor's)
    run_dir: Callable[[Run], Path]
    busy: Callable[[Run], bool]               # live, or final records still held in memory
    changed: Callable[[Run], None]            # tell the dashboard and watchers
    now: Callable[[], float] = time.time      # wall clock: runs' end times are wall times
    in_thread: ThreadRunner = trio.to_thread.run_sync
    passes: int = 0
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def serve(self) -> None:
        while True:
            # Made before the pass: a reload during the pass makes the next one start at once.
            self._wake = trio.Event()
            policy = self.policy()
            if policy is not None:
                await self.run_once(policy)
            with trio.move_on_after(policy.intervalMinutes * 60 if policy is not None else math.inf):
                await self._wake.wait()

    def wake(self) -> None:
        """The policy changed (a reload): pass now with the new one, then on its interval."""
        self._wake.set()

    def _has_journal(self, run: Run) -> bool:
        try:
            return (self.run_dir(run) / "journal.jsonl").stat().st_size > 0
        except OSError:
            return False

    async def run_once(self, policy: Retention) -> PassReport:
        started = time.monotonic()
        report = PassReport()
        picked: list[Run] = select(list(self.runs.values()), policy, self.now(), self.busy, self._has_journal)
        for run in picked:
            held = self.runs.get(run.id)
            # Checked again at its turn: a resume of it (or a run resumed from it) may be running.
            if held is not run or run.archived_at is not None or run.active or self.busy(run) \
                    or (run.resumed_as is not None and self.busy_id(run.resumed_as)):
                continue
            d = self.run_dir(run)
            try:
                if policy.action == "archive":
                    line, raw, packed = await self.in_thread(archive.archive_run, self.state_dir, d,
                                                                      self.now())
                    run.archived_at = line["archivedAt"]
                    report.archived += 1
                    report.raw_bytes += raw
                    report.zip_bytes += packed
                    self.changed(run)
                else:
                    await self.in_thread(archive.remove_dir, d)
                    self.runs.pop(run.id, None)
                    report.deleted += 1
            except (OSError, ValueError) as e:
                report.failed += 1
                log.error("retention: run %s was not %s: %s", run.id,
                          "archived" if policy.action == "archive" else "deleted", e)
                continue
        self.passes += 1
        report.seconds = time.monotonic() - started
        if picked:
            log.info("retention: %d archived (%.1f MB of files in %.1f MB), %d deleted, %d failed, in %.1f s",
                     report.archived, report.raw_bytes / 1e6, report.zip_bytes / 1e6, report.deleted,
                     report.failed, report.seconds)
        return report

    def busy_id(self, run_id: str) -> bool:
        other = self.runs.get(run_id)
        return other is not None and self.busy(other)
