"""One MCPL connection: handshake, grant, tools; notices go out through notify/delivery.py.

The read loop never blocks on our own requests: push/event answers come back through
it and are matched to waiting senders by id. Notices are pushed only after a 0.5 host's
featureSets/update Request was answered (older hosts, and a 0.5 host that only ever
notifies: after their Notification, or a grace period; selection.py), and leave the outbox
only when accepted or duplicate.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import secrets
from typing import Any, Hashable, Protocol

import trio

from ..jsonvalue import object_at
from .. import __version__, reload
from ..config import Caller, Config
from ..notify.delivery import Delivery
from ..notify.outbox import Outbox
from ..notify.routing import Routes
from ..runs.observers import Observers
from ..runs.supervisor import Supervisor
from . import features, jsonrpc, selection, tool_docs, tools
from .refusals import Refusals
from .jsonrpc import Invalid, Notification, Request, Response, RpcError

log = logging.getLogger("swarmbase.mcpl")

PROTOCOL_VERSION = "2024-11-05"
UNAUTH_CLOSE_AFTER_S = 10.0
CLOSE_UNAUTHORIZED = 4001
CLOSE_REPLACED = 4000
CLOSE_GOING_AWAY = 1001


class Transport(Protocol):
    async def send(self, text: str) -> None: ...
    async def receive(self) -> str | bytes: ...
    async def close(self, code: int, reason: str) -> None: ...


def caller_for_token(cfg: Config, token: str | None) -> Caller | None:
    """Constant-time match of sha256(token) against every caller's tokenSha256."""
    if not token:
        return None
    digest = hashlib.sha256(token.encode()).hexdigest()
    found = None
    for c in cfg.callers:
        if hmac.compare_digest(digest, c.tokenSha256):
            found = c
    return found


MAX_SESSIONS_PER_CALLER = 8
OWN_RUNS_KEPT = 10_000


class Hub:
    """The open sessions of each caller (several coexist: a resident host and the
    operator's client; beyond MAX_SESSIONS_PER_CALLER the oldest is closed), the routes
    their notices take (notify/routing.py), the daemon's log-once for what hosts answer,
    and who watches deliveries."""

    def __init__(self, observers: Observers | None = None) -> None:
        self.sessions: dict[str, list["Session"]] = {}
        self.routes: dict[str, Routes] = {}
        self.observers = observers if observers is not None else Observers()
        self.refusals = Refusals()
        self._reported: set[Hashable] = set()

    def first_report(self, key: Hashable) -> bool:
        """True the first time `key` is reported in this daemon's life (log-once across
        reconnects; bounded so a long life cannot grow it without end)."""
        if key in self._reported:
            return False
        if len(self._reported) >= 10_000:
            self._reported.clear()
        self._reported.add(key)
        return True

    def routes_of(self, caller_name: str) -> Routes:
        """One per caller name (names come from the config only, so this stays small)."""
        return self.routes.setdefault(caller_name, Routes())

    def attach(self, session: "Session") -> "Session | None":
        """Register `session`; the caller's oldest session when this one makes more than
        MAX_SESSIONS_PER_CALLER (for the caller to close). Synchronous, so the token check
        just before it and the registration see the same config."""
        assert session.caller is not None
        name = session.caller.name
        open_ = self.sessions.setdefault(name, [])
        open_.append(session)
        self.routes_of(name).open(session)
        return open_[0] if len(open_) > MAX_SESSIONS_PER_CALLER else None

    def open_sessions(self) -> list["Session"]:
        return [s for open_ in self.sessions.values() for s in open_]

    async def drain(self) -> None:
        """Shutdown: every connected host gets what is pending for it, and the answers to
        pushes in flight are acknowledged (the daemon bounds the wait: a host that does
        not answer gets those notices again after the restart, with the same eventIds)."""
        deliveries = [s.delivery for s in self.open_sessions()]
        for d in deliveries:
            d.drain()
        for d in deliveries:
            if d.running:
                await d.drained.wait()

    def detach(self, session: "Session") -> None:
        if session.caller is None:
            return
        name = session.caller.name
        open_ = self.sessions.get(name, [])
        if session in open_:
            open_.remove(session)
            self.routes_of(name).close(session)
        if not open_:
            self.sessions.pop(name, None)


class Session:
    def __init__(self, transport: Transport, caller: Caller | None, sup: Supervisor,
                 outbox: Outbox, hub: Hub, rng: random.Random | None = None, *,
                 peer: str = "unknown", presented_sha256: str | None = None) -> None:
        self.t = transport
        self.caller = caller
        self.peer = peer                            # the remote address, for the refusal log
        self.presented_sha256 = presented_sha256    # what a refused token hashes to (refusals.py)
        # The hash of the token this connection presented (the one its caller had when it
        # was matched): every reload, and the registration, judge the session by it.
        self.token_sha256 = caller.tokenSha256 if caller is not None else ""
        self.sup = sup
        self.outbox = outbox
        self.hub = hub
        routes = hub.routes_of(caller.name) if caller is not None else Routes()
        self.delivery = Delivery(self, outbox, routes, hub.observers, hub.first_report, rng or random.Random())
        self.initialized = False
        self.mcpl_version: str | None = None   # None: a plain MCP client
        self.client_name: str | None = None
        self.grant = features.EMPTY_GRANT
        self.selection: selection.Selection | None = None   # set at initialize for an MCPL host
        self.notices_of_own_runs_only = False       # the client's `--wait`: see _initialize
        # Runs started (or resumed into) from here, oldest first, at most OWN_RUNS_KEPT: a
        # resident that lives for weeks must not grow it without end (an older run's
        # notices are then anybody's, which for a resident is the same thing).
        self._own_runs: dict[str, None] = {}
        self.grant_changed = trio.Event()
        self._next_id = 0
        self._waiting: dict[int, trio.MemorySendChannel[Response]] = {}
        self._send_lock = trio.Lock()
        self._closed = False
        self._scope = trio.CancelScope()     # serve() runs in it; close() cancels it

    # -- plumbing -----------------------------------------------------------
    async def send(self, msg: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.t.send(jsonrpc.dumps(msg))

    async def close(self, code: int, reason: str) -> None:
        """Send the close frame and stop serving, whether or not the frame could be sent: a
        session the daemon closed must never answer again (issue 31.7)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.t.close(code, reason)
        except Exception:  # the peer may already be gone
            pass
        finally:
            self._scope.cancel()

    async def request(self, method: str, params: Any) -> Response:
        """A request to the host, and its answer (read by the read loop); the caller bounds
        the wait."""
        rid = self._next_id
        self._next_id += 1
        send_ch, recv_ch = trio.open_memory_channel[Response](1)
        self._waiting[rid] = send_ch
        try:
            await self.send(jsonrpc.request(rid, method, params))
            return await recv_ch.receive()
        finally:
            self._waiting.pop(rid, None)

    # -- what delivery reads (notify/delivery.py PushPeer) ----------------------
    @property
    def caller_name(self) -> str:
        assert self.caller is not None
        return self.caller.name

    @property
    def can_push(self) -> bool:
        return self.grant.can_push

    # -- what routing reads (notify/routing.py Route) ----------------------------
    @property
    def own_runs_only(self) -> bool:
        return self.notices_of_own_runs_only

    def owns(self, run_id: str) -> bool:
        return run_id in self._own_runs

    def _set_grant(self, grant: features.Grant) -> None:
        self.grant = grant
        ev, self.grant_changed = self.grant_changed, trio.Event()
        ev.set()
        self.delivery.routes.changed()      # another session may now take (or leave) a notice

    def _started(self, params: Any, result: dict[str, Any]) -> None:
        run_id = tools.started_run(params, result)
        if run_id is not None:
            self._own_runs[run_id] = None
            if len(self._own_runs) > OWN_RUNS_KEPT:
                del self._own_runs[next(iter(self._own_runs))]
            self.delivery.routes.changed()

    # -- main loop ------------------------------------------------------------
    async def serve(self) -> None:
        with self._scope:
            if self._closed:
                return
            if self.caller is None:
                await self._refuse()
                return
            # A reload may have swapped the config since the token was matched (and judged
            # the open sessions without this one): check the token against the live config
            # and register with no checkpoint between.
            verdict = reload.session_verdict(self.sup.env.cfg, self.caller.name, self.token_sha256)
            if isinstance(verdict, tuple):
                log.info("closing a new session of caller %s: %s", self.caller.name, verdict[1])
                await self.close(*verdict)
                return
            self.caller = verdict
            replaced = self.hub.attach(self)
            try:
                if replaced is not None:
                    await replaced.close(CLOSE_REPLACED, f"replaced: caller {self.caller.name} has more than "
                                                         f"{MAX_SESSIONS_PER_CALLER} sessions open; the oldest is closed")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.delivery.run)
                    await self._read_loop(nursery)
                    nursery.cancel_scope.cancel()
            finally:
                self.hub.detach(self)

    async def _refuse(self) -> None:
        """Bad or missing token: the first frame, whatever it is (a request, a notification,
        a frame that is not JSON or nests too deep to parse), is answered -32001 (with the
        request's id when it has one) and the connection closed 4001 at once. Reading on
        would let an unauthenticated peer hold the connection and make the daemon parse
        what it sends; one that sends nothing is closed after UNAUTH_CLOSE_AFTER_S. A token
        the daemon remembers (a removed caller's, a rotated one) is told so; the log has one
        line per address per refusals.WINDOW_S."""
        message, once_of = self.hub.refusals.why(self.presented_sha256)
        unlogged = self.hub.refusals.note(self.peer, trio.current_time())
        if unlogged is not None:
            log.warning("refused an MCPL connection from %s: %s%s%s", self.peer, message.removeprefix("unauthorized: "),
                        f" (caller {once_of})" if once_of else "",
                        f"; {unlogged} more refused from this address since the last such line" if unlogged else "")
        with trio.move_on_after(UNAUTH_CLOSE_AFTER_S):
            frame = await self.t.receive()
            parsed = jsonrpc.parse_frame(frame if isinstance(frame, str) else frame.decode("utf-8", "replace"))
            messages = [] if isinstance(parsed, RpcError) else parsed
            rid = next((m.id for m in messages if isinstance(m, (Request, Invalid)) and m.id is not None), None)
            await self.send(jsonrpc.error(rid, RpcError(jsonrpc.UNAUTHORIZED, message)))
        await self.close(CLOSE_UNAUTHORIZED, "unauthorized")

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        while True:
            frame = await self.t.receive()
            text = frame if isinstance(frame, str) else frame.decode("utf-8", "replace")
            parsed = jsonrpc.parse_frame(text)
            if isinstance(parsed, RpcError):
                await self.send(jsonrpc.error(None, parsed))
                continue
            for msg in parsed:
                await self._dispatch(msg, nursery)

    async def _dispatch(self, msg: Any, nursery: trio.Nursery) -> None:
        if isinstance(msg, Response):
            ch = self._waiting.get(msg.id) if isinstance(msg.id, int) else None
            if ch is not None:
                ch.send_nowait(msg)
            return
        if isinstance(msg, Invalid):
            await self.send(jsonrpc.error(msg.id, msg.error))
            return
        if isinstance(msg, Notification):
            self._on_notification(msg, nursery)
            return
        try:
            if msg.method == "tools/call" and self.initialized and self.caller is not None \
                    and tools.runs_in_thread(msg.params):
                # `usage` reads agent records from disk: keep that off the event loop.
                value = await trio.to_thread.run_sync(tools.call, self.sup, self.caller, msg.params)
            else:
                value = self._handle(msg, nursery)
            if msg.method == "tools/call":
                # Before any checkpoint: the run cannot have ended (and its notice been routed).
                self._started(msg.params, value)
            await self.send(jsonrpc.result(msg.id, value))
        except RpcError as e:
            await self.send(jsonrpc.error(msg.id, e))
        except Exception as e:
            # The text goes to a remote peer: no paths, no stack, only a reference to the log.
            ref = secrets.token_hex(4)
            log.exception("request %s failed (ref %s)", msg.method, ref)
            await self.send(jsonrpc.error(msg.id, RpcError(
                jsonrpc.INTERNAL_ERROR, f"internal error ({type(e).__name__}); the daemon log has the details "
                                        f"under ref {ref}")))

    def _on_notification(self, msg: Notification, nursery: trio.Nursery) -> None:
        if msg.method == "featureSets/update" and self.selection is not None:
            self._apply(self.selection.on_notification(self.grant, msg.params))
        # notifications/initialized, notifications/cancelled and unknown ones need no answer.

    def _apply(self, decision: selection.Decision) -> None:
        if decision.grant is not None:
            self._set_grant(decision.grant)
        if decision.note and self.caller is not None \
                and self.hub.first_report(("selection", self.caller.name, self.client_name, decision.note)):
            log.warning("caller %s (host %s): %s", self.caller.name, self.client_name or "unnamed", decision.note)

    def _handle(self, req: Request, nursery: trio.Nursery) -> Any:
        m = req.method
        if m == "initialize":
            return self._initialize(req.params, nursery)
        if m == "ping":
            return {}
        if m == "featureSets/update":
            if self.selection is None:
                raise RpcError(jsonrpc.METHOD_NOT_FOUND, "method not found: featureSets/update (not an MCPL session)")
            try:
                grant, receipt = self.selection.on_request(req.params)
            except features.GrantError as e:
                self._set_grant(features.EMPTY_GRANT)
                raise RpcError(jsonrpc.INVALID_PARAMS, f"invalid params: {e}") from None
            self._set_grant(grant)
            return receipt
        if m in ("tools/list", "tools/call"):
            if not self.initialized:
                raise RpcError(jsonrpc.INVALID_REQUEST, "invalid request: send initialize first")
            if m == "tools/list":
                assert self.caller is not None
                return {"tools": tool_docs.for_caller(tools.TOOLS, self.caller, self.sup.env.cfg)}
            assert self.caller is not None
            return tools.call(self.sup, self.caller, req.params)
        raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"method not found: {m}")

    def _initialize(self, params: Any, nursery: trio.Nursery) -> dict[str, Any]:
        params = params if isinstance(params, dict) else {}
        caps = object_at(params, "capabilities")
        exp = object_at(caps, "experimental")
        mcpl = exp.get("mcpl")
        # `python -m swarmbase.client … --wait` asks for its own runs' notices only, so it
        # never takes (and acknowledges) one meant for the caller's resident host.
        self.notices_of_own_runs_only = object_at(exp, "swarmbase").get("notices") == "ownRuns"
        info = object_at(params, "clientInfo")
        self.client_name = info.get("name") if isinstance(info.get("name"), str) else None
        self.initialized = True
        result: dict[str, Any] = {
            "protocolVersion": PROTOCOL_VERSION,
            "serverInfo": {"name": "swarmbase", "version": __version__},
            "capabilities": {"tools": {}},
            "instructions": "Call the guide tool for the script authoring reference.",
        }
        if isinstance(mcpl, dict):
            self.mcpl_version = str(mcpl.get("version", "0"))
            result["capabilities"]["experimental"] = {"mcpl": {
                "version": "0.5", "pushEvents": True,
                "featureSets": features.declarations_for(self.mcpl_version, self.client_name)}}
            self.selection = selection.Selection(self.mcpl_version, bool(mcpl.get("pushEvents")))
            if self.selection.grace_s is not None:
                nursery.start_soon(self._grace, self.selection, self.selection.grace_s)
        return result

    async def _grace(self, sel: selection.Selection, seconds: float) -> None:
        """Some hosts never send a featureSets/update Request: decide what to assume once
        the grace period is over (selection.py)."""
        await trio.sleep(seconds)
        if sel is self.selection:
            self._apply(sel.on_grace_over(self.grant))
