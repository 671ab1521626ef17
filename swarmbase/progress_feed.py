"""The progress feed: turns a run's changes into progress notices in the caller's outbox,
coalesced by the rule in progress_notice.py.

It is one of the supervisor's observers (run_started, agent_started, phase, agent_ended,
run_ended), so the run code knows nothing of it, and it is handed only what it uses: the
outbox, the run-link function and the redactor. Progress notices go through the same
durable outbox as the end notice, so they survive a restart the same way, reach an
offline host in the order they were queued, and a run's are always queued before its end
notice: events still waiting are written when the run is ending (run_ending, before the
end notice is queued), and an event after that is dropped. One task (serve) queues
the deferred ones when their window opens; its clock is trio's (MockClock in tests).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

import trio

from . import progress_notice as pn
from .runs.model import Run
from .runs.observers import NoObserver
from .runs.records import AgentRecord

log = logging.getLogger("swarmbase.progress")


class NoticeQueue(Protocol):
    """What the feed uses of the outbox (swarmbase.outbox.Outbox)."""

    def add(self, caller: str, notice: dict[str, Any], hold: bool = False) -> tuple[str, int] | None: ...

    def amend(self, event_id: str, notice: dict[str, Any]) -> bool: ...

    def notice(self, event_id: str) -> dict[str, Any] | None: ...


class ProgressFeed(NoObserver):
    def __init__(self, outbox: NoticeQueue, run_url: Callable[[str], str], redact: Callable[[str], str]) -> None:
        self.outbox = outbox
        self.run_url = run_url
        self.redact = redact
        self.runs: dict[str, tuple[Run, pn.RunProgress]] = {}
        self._wake = trio.Event()

    # -- the observer interface ----------------------------------------------------------
    def run_started(self, run: Run) -> None:
        kinds = pn.wanted(run.notify)
        if kinds:
            self.runs[run.id] = (run, pn.RunProgress(kinds))

    def agent_started(self, run: Run, rec: AgentRecord) -> None:
        state = self._state(run)
        if state is not None and not rec.workflow and state.phase is None:
            state.agents_seen = True

    def phase(self, run: Run, title: str, workflow: str = "") -> None:
        state = self._state(run)
        if state is None or workflow:          # a nested workflow's phases are steps of the root's
            return
        line = pn.on_phase(state, title)
        if line is not None:
            self._event(run, state, line, "phase")

    def agent_ended(self, run: Run, rec: AgentRecord) -> None:
        state = self._state(run)
        if state is None:
            return
        if not rec.workflow and state.phase is None:
            state.agents_seen = True
        line = pn.on_agent_end(state, rec.n, rec.label, rec.state, rec.phase, rec.workflow, rec.error)
        if line is not None:
            self._event(run, state, line, "failures")

    def run_ending(self, run: Run) -> None:
        """Its end notice is about to be queued: waiting events go out first, into the run's
        undelivered progress notice (in place) or one last one, ahead of the end notice."""
        entry = self.runs.pop(run.id, None)
        if entry is not None:
            self._write(run, entry[1], final=True)

    def run_ended(self, run: Run) -> None:
        self.runs.pop(run.id, None)         # a run that ended without run_ending (never here)

    # -- coalescing ----------------------------------------------------------------------
    def _state(self, run: Run) -> pn.RunProgress | None:
        entry = self.runs.get(run.id)
        return entry[1] if entry is not None else None

    def _still_pending(self, state: pn.RunProgress) -> bool:
        return state.pending is not None and self.outbox.notice(state.pending) is not None

    def _event(self, run: Run, state: pn.RunProgress, line: str, kind: str) -> None:
        if not run.active:                 # its end notice is (being) queued: never after it
            return
        pn.add_line(state, line, kind)
        self._write(run, state)

    def _write(self, run: Run, state: pn.RunProgress, final: bool = False) -> None:
        """Queue a new notice, update the undelivered one, or wait for the window."""
        now = trio.current_time()
        still = self._still_pending(state)
        action = pn.decide(state, now, still, final)
        if action == "wait":
            self._wake.set()
            return
        if action == "drop":
            return
        pn.written(state, now, still)
        url = self.run_url(run.id)
        if action == "amend" and state.pending is not None:
            self.outbox.amend(state.pending, pn.build(run, state, url, self.redact, event=state.pending))
            return
        notice = pn.build(run, state, url, self.redact)
        self.outbox.add(run.caller, notice)
        state.pending = notice["eventId"]

    async def serve(self) -> None:
        """Queue each deferred notice when its window opens."""
        while True:
            due = min((s.due for _, s in self.runs.values() if s.due is not None), default=None)
            self._wake = trio.Event()
            if due is None:
                await self._wake.wait()
            else:
                with trio.move_on_at(due):
                    await self._wake.wait()
            now = trio.current_time()
            for run, state in list(self.runs.values()):
                if state.due is None or state.due > now:
                    continue
                state.due = None
                if not run.active:         # run_ended settles it
                    continue
                try:
                    self._write(run, state)
                except Exception:          # never let one run's notice stop the feed
                    log.exception("run %s: its progress notice could not be queued", run.id)
