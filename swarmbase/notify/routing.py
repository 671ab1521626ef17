"""Which of a caller's open sessions pushes which notice (issue 32.15).

Several sessions of one caller coexist (a resident host, and the operator's
`python -m swarmbase.client` from a shell). The outbox stays one per caller, exactly once
per eventId: an ack from any session acks it for all. What this decides:

- a notice of a run goes to the session that started (or resumed) that run while that
  session is open and may push: a `--wait` client gets its own run's end notice, and the
  resident does not take it from under it;
- every other notice goes to any session that may push and did not ask for its own
  runs' notices only (`capabilities.experimental.swarmbase.notices: "ownRuns"`, what the
  client sends): the resident gets everything else, and the client nothing else;
- one push of a notice at a time: while one session's push of it waits for its answer,
  no other session sends it (two hosts would both be woken by one event).

A run's owner is known only while its session is open (a run started from a connection
that closed is anybody's), which is what "notices go to whoever can take them" needs: a
notice never waits for a session that is gone.

Pure state and an event: the sessions tell it when they open, close, change their grant
or start a run; each push loop takes `changed_event()` before looking and waits on it.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio


class Route(Protocol):
    """What routing reads of a session."""

    @property
    def can_push(self) -> bool: ...

    @property
    def own_runs_only(self) -> bool:
        """The session asked for the notices of the runs it started, nothing else."""

    def owns(self, run_id: str) -> bool:
        """The session started (or resumed into) this run."""


def run_of(notice: dict[str, Any]) -> str | None:
    origin = notice.get("origin")
    run_id = origin.get("runId") if isinstance(origin, dict) else None
    return run_id if isinstance(run_id, str) else None


class Routes:
    """One caller's open sessions, as its notices see them."""

    def __init__(self) -> None:
        self.sessions: list[Route] = []
        self._in_flight: dict[str, Route] = {}      # eventId -> the session whose push waits
        self._changed = trio.Event()

    def changed_event(self) -> trio.Event:
        """Set at the next change. Take it *before* looking, so a change in between wakes you."""
        return self._changed

    def changed(self) -> None:
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def open(self, session: Route) -> None:
        self.sessions.append(session)
        self.changed()

    def close(self, session: Route) -> None:
        if session in self.sessions:
            self.sessions.remove(session)
        for eid in [e for e, s in self._in_flight.items() if s is session]:
            del self._in_flight[eid]
        self.changed()

    def allows(self, session: Route, notice: dict[str, Any]) -> bool:
        """Whether `session` may push `notice` now."""
        eid = notice.get("eventId")
        if isinstance(eid, str) and self._in_flight.get(eid, session) is not session:
            return False
        run_id = run_of(notice)
        owners = [s for s in self.sessions if s.can_push and run_id is not None and s.owns(run_id)]
        if owners:
            return session in owners
        return not session.own_runs_only

    def claim(self, session: Route, event_id: str) -> None:
        self._in_flight[event_id] = session

    def release(self, event_id: str) -> None:
        """The push's answer came (or never will): another session may look at it again."""
        if self._in_flight.pop(event_id, None) is not None:
            self.changed()
