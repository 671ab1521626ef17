"""Pushing a caller's notices to its connected host.

One push in flight per session, oldest notice first. What the host answers decides what
happens to the notice:

- accepted, or `{accepted:false, reason:"duplicate"}`: acknowledged, never sent again;
- `{accepted:false, reason:…}` for any other reason, or -32001/-32003 (the set is off for
  this host): not transient. The reason is logged once and that notice is held until the
  host sends a new grant or reconnects; the caller's other notices keep going out;
- -32002 (pushEvents not granted): nothing can go out; wait for the next grant;
- no answer within PUSH_TIMEOUT_S, or any other error: a transient fault of the host;
  back off (1 s doubling to 300 s, jittered) and resend with the same eventId under a new
  request id (see docs/decisions.md).

On shutdown the daemon drains every session before it closes the outbox: what is pending
is pushed, and the answer to a push in flight is read and acknowledged, so a notice the
host accepted is never delivered again after the restart (issue 25 #2: the outbox used to
close, and the sessions be cancelled, with answers on the wire). Nothing that would wait
(a grant, a backoff) is started while draining.

The loop is given a narrow PushPeer (the session: its caller, its grant, a request), the
outbox, its caller's Routes (which of the caller's open sessions pushes which notice, and
one push of a notice at a time across them: routing.py), the observers and the daemon's
log-once; it keeps its own holds and releases them when it sees a new grant, so the
session never calls into it.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from typing import Any, Awaitable, Callable, Hashable, Protocol

import trio

from ..mcpl.jsonrpc import Response
from ..runs.observers import Observers
from .outbox import Outbox
from .routing import Route, Routes

log = logging.getLogger("swarmbase.mcpl")

PUSH_TIMEOUT_S = 30.0
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with ±25 % jitter: 1 s, 2 s, 4 s … capped at 300 s."""
    rng = rng or random.Random()
    base = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** max(0, attempt)))
    return base * rng.uniform(0.75, 1.25)


def classify_answer(result: Any = None, error: dict[str, Any] | None = None) -> tuple[str, str]:
    """(verdict, reason) for a host's answer to push/event. Verdicts: 'done' (acknowledged),
    'refused' (hold it: not transient), 'wait-grant' (nothing goes out until the next
    grant), 'retry' (transient: back off and resend)."""
    if error is not None:
        code = error.get("code")
        message = str(error.get("message") or "")
        if code == -32002:
            return "wait-grant", f"{code}: {message}"
        if code in (-32001, -32003):
            return "refused", f"{code}: {message}"
        return "retry", f"{code}: {message}"
    if isinstance(result, dict) and "accepted" in result:
        if result["accepted"] is True or result.get("reason") == "duplicate":
            return "done", "accepted" if result["accepted"] is True else "duplicate"
        if result["accepted"] is False:
            return "refused", str(result.get("reason") or "refused without a reason")
    return "retry", "the answer is not a push/event result"


async def first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Return when the first of these returns."""
    async with trio.open_nursery() as n:
        async def one(fn: Callable[[], Awaitable[None]]) -> None:
            await fn()
            n.cancel_scope.cancel()
        for fn in waits:
            n.start_soon(one, fn)


class PushPeer(Route, Protocol):
    """What the push loop needs of its session (and routing reads of it)."""

    @property
    def caller_name(self) -> str: ...

    @property
    def can_push(self) -> bool:
        """Whether the host's grant lets notices out now."""

    @property
    def grant_changed(self) -> trio.Event:
        """Set at the host's next grant (a new event after each)."""

    async def request(self, method: str, params: Any) -> Response:
        """Send a request and wait for its answer (the caller bounds the wait)."""


class Delivery:
    """The push loop of one session."""

    def __init__(self, peer: PushPeer, outbox: Outbox, routes: Routes, observers: Observers,
                 first_report: Callable[[Hashable], bool], rng: random.Random) -> None:
        self.peer = peer
        self.outbox = outbox
        self.routes = routes
        self.observers = observers
        self.first_report = first_report      # log-once, across reconnects (the hub's)
        self.rng = rng
        # eventId -> (the host's reason, the grant it was refused under): held until a new
        # grant or a reconnect (a new session, a new Delivery).
        self.held: dict[str, tuple[str, trio.Event]] = {}
        self.draining = False
        self.running = False
        self.drained = trio.Event()        # set when run() has returned (drained, or the session ended)
        self._drain_wake = trio.Event()

    def drain(self) -> None:
        """Shutdown: push what is pending and finish the push in flight, then stop."""
        self.draining = True
        self._drain_wake.set()

    def _holding(self, grant: trio.Event) -> set[str]:
        """The notices still held: those refused under the current grant (a new grant
        releases the others, to be tried again)."""
        stale = [eid for eid, (_, under) in self.held.items() if under is not grant]
        if stale:
            log.info("caller %s: new grant, retrying %d held notice(s)", self.peer.caller_name, len(stale))
            for eid in stale:
                del self.held[eid]
        return set(self.held)

    async def run(self) -> None:
        self.running = True
        try:
            await self._loop()
        finally:
            self.drained.set()

    async def _loop(self) -> None:
        outbox, caller = self.outbox, self.peer.caller_name
        attempt = 0
        drain = self._drain_wake.wait
        while True:
            granted = self.peer.grant_changed
            if not self.peer.can_push:
                if self.draining:
                    return
                await first_of(granted.wait, drain)
                continue
            added = outbox.changed_event(caller)
            routed = self.routes.changed_event()
            notice = outbox.next_pending(caller, skip=self._holding(granted),
                                         allow=partial(self.routes.allows, self.peer))
            if notice is None:
                outbox.flush()
                if self.draining:
                    return
                await first_of(added.wait, granted.wait, routed.wait, drain)
                continue
            eid = notice["eventId"]
            self.routes.claim(self.peer, eid)
            try:
                verdict, reason = await self._push(notice)
            finally:
                self.routes.release(eid)
            if verdict == "done":
                outbox.ack(eid)
                attempt = 0
                self.observers.notice_delivered(caller, eid)
            elif verdict == "refused":
                self.held[eid] = (reason, self.peer.grant_changed)
                if self.first_report((caller, eid, reason)):
                    log.warning("caller %s: the host refused notice %s (%s); it is held until the host "
                                "grants again or reconnects", caller, eid, reason)
                    self.observers.notice_failed(caller, eid, reason)
            elif verdict == "wait-grant":
                if self.first_report((caller, "wait-grant", reason)):
                    log.warning("caller %s: the host has not granted pushEvents (%s); notices wait for "
                                "its next grant", caller, reason)
                if self.draining:
                    return
                await first_of(granted.wait, drain)
            else:
                if self.draining:       # transient: the next daemon resends it
                    return
                delay = backoff_delay(attempt, self.rng)
                await first_of(partial(trio.sleep, delay), drain)
                attempt += 1

    async def _push(self, notice: dict[str, Any]) -> tuple[str, str]:
        with trio.move_on_after(PUSH_TIMEOUT_S):
            resp = await self.peer.request("push/event", notice)
            return classify_answer(resp.result, resp.error)
        return "retry", "no answer"
