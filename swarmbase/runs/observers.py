"""Who watches runs from outside them (Prometheus metrics, OpenTelemetry traces): one
`RunObserver` protocol naming every event, a no-op base (`NoObserver`) an observer builds
on and overrides what it watches, and the one fan-out (`Observers`) that every reporter
calls: the supervisor (runs started and ended), a live run (agents, phases, workflows) and
a host's delivery loop (notices).

Observers are called synchronously on the event loop, so they only record (a counter, a
span object) and never block; one that raises is logged and skipped, never allowed to
affect a run or a delivery. Before this module the fan-out was written twice (the
supervisor's and delivery's) and found each method with `getattr`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

if TYPE_CHECKING:
    from .model import Run
    from .records import AgentRecord

log = logging.getLogger("swarmbase.supervisor")


class RunObserver(Protocol):
    def run_started(self, run: Run) -> None: ...
    def run_ending(self, run: Run) -> None: ...
    def run_ended(self, run: Run) -> None: ...
    def agent_started(self, run: Run, rec: AgentRecord) -> None: ...
    def agent_ended(self, run: Run, rec: AgentRecord) -> None: ...
    def phase(self, run: Run, title: str, workflow: str = "") -> None: ...
    def workflow_started(self, run: Run, path: str, label: str | None = None) -> None: ...
    def workflow_ended(self, run: Run, path: str, ok: bool) -> None: ...
    def notice_delivered(self, caller: str, event_id: str) -> None: ...
    def notice_failed(self, caller: str, event_id: str, reason: str) -> None: ...


class NoObserver:
    """Every RunObserver event, doing nothing: subclass it and override what you watch."""

    def run_started(self, run: Run) -> None:
        pass

    def run_ending(self, run: Run) -> None:
        """Its status is final, its end notice not queued yet."""

    def run_ended(self, run: Run) -> None:
        pass

    def agent_started(self, run: Run, rec: AgentRecord) -> None:
        pass

    def agent_ended(self, run: Run, rec: AgentRecord) -> None:
        pass

    def phase(self, run: Run, title: str, workflow: str = "") -> None:
        pass

    def workflow_started(self, run: Run, path: str, label: str | None = None) -> None:
        pass

    def workflow_ended(self, run: Run, path: str, ok: bool) -> None:
        pass

    def notice_delivered(self, caller: str, event_id: str) -> None:
        pass

    def notice_failed(self, caller: str, event_id: str, reason: str) -> None:
        pass


class Observers:
    """The daemon's observers, told of every event in the order they were added."""

    def __init__(self, *observers: RunObserver) -> None:
        self._all: list[RunObserver] = list(observers)

    def add(self, observer: RunObserver) -> None:
        self._all.append(observer)

    def __iter__(self) -> Iterator[RunObserver]:
        return iter(list(self._all))

    def __len__(self) -> int:
        return len(self._all)

    def _each(self, event: str, tell: Callable[[RunObserver], None]) -> None:
        for observer in list(self._all):
            try:
                tell(observer)
            except Exception:  # observers (telemetry) never affect runs or deliveries
                log.exception("observer %r failed in %s", observer, event)

    def run_started(self, run: Run) -> None:
        self._each("run_started", lambda o: o.run_started(run))

    def run_ending(self, run: Run) -> None:
        self._each("run_ending", lambda o: o.run_ending(run))

    def run_ended(self, run: Run) -> None:
        self._each("run_ended", lambda o: o.run_ended(run))

    def agent_started(self, run: Run, rec: AgentRecord) -> None:
        self._each("agent_started", lambda o: o.agent_started(run, rec))

    def agent_ended(self, run: Run, rec: AgentRecord) -> None:
        self._each("agent_ended", lambda o: o.agent_ended(run, rec))

    def phase(self, run: Run, title: str, workflow: str = "") -> None:
        self._each("phase", lambda o: o.phase(run, title, workflow))

    def workflow_started(self, run: Run, path: str, label: str | None = None) -> None:
        self._each("workflow_started", lambda o: o.workflow_started(run, path, label))

    def workflow_ended(self, run: Run, path: str, ok: bool) -> None:
        self._each("workflow_ended", lambda o: o.workflow_ended(run, path, ok))

    def notice_delivered(self, caller: str, event_id: str) -> None:
        self._each("notice_delivered", lambda o: o.notice_delivered(caller, event_id))

    def notice_failed(self, caller: str, event_id: str, reason: str) -> None:
        self._each("notice_failed", lambda o: o.notice_failed(caller, event_id, reason))
