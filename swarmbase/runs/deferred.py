"""What a full disk kept in memory, and writing it once space returns (issue 25 #6).

Two kinds: journal lines (paid agent results: `Journal.pending`) of runs live or ended,
and ended runs whose final write failed (`unsaved`: the supervisor's, each with every
record still to write, given here only to be written). Journals go first on every pass: a
run is sealed only over its whole journal, and a resume reads the journal, so it waits
for (or forces) the write rather than re-run paid agents.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

import trio

from .. import fsutil
from ..jsonvalue import JsonObject
from . import stop_note
from .journal import Journal

log = logging.getLogger("swarmbase.supervisor")

RETRY_S = 5.0

Unsaved = TypeVar("Unsaved")      # an ended run whose final records wait (the supervisor's LiveRun)


class Deferred:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.journals: dict[str, Journal] = {}      # run id -> its journal with pending lines

    def journal_refused(self, run_id: str, journal: Journal, fault: OSError) -> None:
        if run_id not in self.journals:
            log.error("run %s: %s; its finished agents' results are kept in memory and journaled when space "
                      "returns", run_id, fsutil.describe_disk_fault(fault, self.state_dir))
        self.journals[run_id] = journal

    async def write_journal(self, run_id: str) -> bool:
        """True when the run has no journal line waiting (any more)."""
        journal = self.journals.get(run_id)
        if journal is None:
            return True
        n = len(journal.pending)
        try:
            await trio.to_thread.run_sync(journal.flush)
        except OSError:
            return False
        del self.journals[run_id]
        log.info("run %s: %d agent result(s) journaled after a disk fault", run_id, n)
        return True

    def journal_now(self, run_id: str) -> str | None:
        """For resume (on the loop, the run has ended): write its waiting lines at once;
        why not, if they still cannot be written."""
        journal = self.journals.get(run_id)
        if journal is None:
            return None
        try:
            journal.flush()
        except OSError as e:
            return (f"{len(journal.pending)} of its agent results are not journaled yet "
                    f"({fsutil.describe_disk_fault(e, self.state_dir)})")
        del self.journals[run_id]
        return None

    async def retry(self, journal_lock: Callable[[str], trio.Lock | None], unsaved: dict[str, Unsaved],
                    final_write: Callable[[Unsaved], Awaitable[None]]) -> None:
        """One pass: every waiting journal (under its live run's journal lock), then the
        final write of every ended run whose journal is whole (removed from `unsaved` once
        written)."""
        for run_id in list(self.journals):
            lock = journal_lock(run_id)
            if lock is None:
                await self.write_journal(run_id)
            else:
                async with lock:
                    await self.write_journal(run_id)
        for run_id, live in list(unsaved.items()):
            if run_id in self.journals:
                continue
            try:
                await final_write(live)
            except OSError:
                continue
            del unsaved[run_id]
            log.info("run %s: its record was saved after an earlier disk fault", run_id)

    async def last_chance(self, unsaved: dict[str, Unsaved], final_write: Callable[[Unsaved], Awaitable[None]],
                          ended_as: Callable[[Unsaved], str] = lambda live: "") -> None:
        """Shutdown (no run is live): one more pass, and if the disk still refuses, one after
        the reserve is given back (stop_note.py). What still cannot be written is lost with
        this daemon: the log says so, and so does the stop note the next boot reads."""
        await self.retry(lambda run_id: None, unsaved, final_write)
        if (self.journals or unsaved) and stop_note.release(self.state_dir):
            log.warning("the disk still refuses writes at the stop: gave back the %d KiB kept in reserve",
                        stop_note.RESERVE_BYTES // 1024)
            await self.retry(lambda run_id: None, unsaved, final_write)
        lost: dict[str, list[str]] = {}
        ended: dict[str, str] = {}
        for run_id, journal in self.journals.items():
            log.error("run %s: %d paid agent result(s) could not be journaled (the disk still refuses) and "
                      "are lost with this daemon; a resume runs them again", run_id, len(journal.pending))
            lost[run_id] = [f"{len(journal.pending)} paid agent result(s) (its journal lines)"]
        for run_id, live in unsaved.items():
            log.error("run %s: its final records could not be written (the disk still refuses); the next "
                      "start finds it as the disk has it", run_id)
            ended[run_id] = ended_as(live)
            lost.setdefault(run_id, []).append(
                "its final record" + (f" (it had ended {ended[run_id]})" if ended[run_id] else ""))
        if lost:
            note: dict[str, JsonObject] = {run_id: {"unwritten": list(what), **(
                {"endedAs": ended[run_id]} if ended.get(run_id) else {})} for run_id, what in lost.items()}
            stop_note.write(self.state_dir, note)
