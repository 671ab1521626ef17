"""Serving the dashboard's SSE streams at a bounded cost, per viewer and in total.

An SSE viewer costs the daemon a task, a socket, and whatever it has been sent but has
not read. Hostile or broken viewers (1,500 clients that never read took a daemon to
5.4 GB once) are bounded four ways:
- admission: at most MAX_STREAMS streams, at most MAX_PER_CLIENT per client (the peer
  address; behind `tailscale serve` every peer is loopback, so there the tailnet login
  the proxy adds is part of the key);
- the replay a viewer may ask for is what the hub still holds (bounded); older → reload;
- a viewer is sent at most CHUNK bytes at a time, and its socket's kernel send buffer is
  set small, so a reader that stops reading blocks after a bounded amount;
- a viewer blocked in a send for STALL_S is dropped (its socket closed) whenever a new
  viewer needs room or a keep-alive tick comes round; one that falls behind the hub's
  buffer is told to reload and its stream ends; at the global cap, the client holding the
  most streams gives one up to a client holding fewer (see Viewers).

Hypercorn writes responses inside a shielded scope, so a blocked write cannot be
cancelled from the app: the only way to drop that viewer is to close its socket. The
socket is found from the ASGI `send` callable's owners (Hypercorn 0.18's HTTPStream →
H11Protocol → TCPServer.stream); where that fails, the other bounds still hold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import socket
from typing import Any, Awaitable, Callable, Iterator

import attrs
import trio

from swarmbase.events import EventHub, Stream, frame

MAX_STREAMS = 256
MAX_PER_CLIENT = 16
CHUNK = 32 * 1024
SNDBUF = 32 * 1024
STALL_S = 10.0
REAP_AT_ONCE = 32
KEEPALIVE_S = 15.0
# Least time between two sends to one viewer: a burst of events goes out as one write
# (and a run list being logged to 100 times a second refreshes twice a second).
MIN_GAP_S = {"list": 0.5, "run": 0.02, "agent": 0.02}
LOOPBACK_PEERS = ("127.", "::1", "::ffff:127.")

TRIM_AFTER_S = 8.0      # past Hypercorn's keep-alive timeout, so refused connections are gone too
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _malloc_trim() -> Callable[[], None] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None                              # not glibc: nothing to hand back this way
    return lambda: trim(0)


MALLOC_TRIM = _malloc_trim()


@attrs.define(eq=False)
class Viewer:
    client: str
    since: float = 0.0
    sending_since: float | None = None
    drop: Callable[[], None] | None = None      # ends the stream: cancels it, closes its socket


class Viewers:
    """Admission and dropping for SSE viewers. Pure bookkeeping, clock injected.

    At the global cap a newcomer first reclaims stalled viewers; if none, and some client
    holds more streams than the newcomer's client would, that client's oldest stream makes
    room. A flood of clients that never read therefore only displaces itself: a person
    opening one page still gets a stream.
    """

    def __init__(self, max_total: int = MAX_STREAMS, max_per_client: int = MAX_PER_CLIENT,
                 stall_s: float = STALL_S, clock: Callable[[], float] = trio.current_time) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.stall_s = stall_s
        self.clock = clock
        self.by_client: dict[str, list[Viewer]] = {}
        self.count = 0
        self.refused = 0
        self.dropped = 0
        self.high = 0             # most viewers since the last ebb
        self.on_ebb: Callable[[], None] = lambda: None
        self._last_reap = 0.0

    def admit(self, client: str) -> Viewer | str:
        """A new viewer, or why not (a reason for the 429/503 answer)."""
        mine = len(self.by_client.get(client, ()))
        if mine >= self.max_per_client:
            self.reap()
            if len(self.by_client.get(client, ())) >= self.max_per_client:
                self.refused += 1
                return f"at most {self.max_per_client} live streams per client; close some tabs"
        if self.count >= self.max_total:
            self.reap()
        if self.count >= self.max_total and not self._make_room(client):
            self.refused += 1
            return f"the dashboard serves at most {self.max_total} live streams; try again shortly"
        v = Viewer(client, since=self.clock())
        self.by_client.setdefault(client, []).append(v)
        self.count += 1
        self.high = max(self.high, self.count)
        return v

    def _make_room(self, client: str) -> bool:
        mine = len(self.by_client.get(client, ()))
        heaviest = max(self.by_client.values(), key=len, default=[])
        if len(heaviest) <= mine + 1 or not heaviest[0].drop:
            return False
        self._drop(heaviest[0])
        return True

    def _drop(self, v: Viewer) -> None:
        self.leave(v)
        if v.drop is not None:
            v.drop()
            v.drop = None
        self.dropped += 1

    def leave(self, v: Viewer) -> None:
        mine = self.by_client.get(v.client)
        if mine and v in mine:
            mine.remove(v)
            self.count -= 1
            if not mine:
                del self.by_client[v.client]
            if self.count <= self.high // 10 and self.high >= 64:
                self.high = self.count
                self.on_ebb()

    def stalled(self) -> list[Viewer]:
        now = self.clock()
        return [v for vs in self.by_client.values() for v in vs
                if v.sending_since is not None and now - v.sending_since >= self.stall_s]

    def reap(self, limit: int = REAP_AT_ONCE) -> int:
        """Drop viewers stuck in one send for stall_s or longer, longest stuck first, at most
        `limit` at a time (hundreds unwinding at once would stall the loop); returns how many."""
        self._last_reap = self.clock()
        stuck = sorted((v for v in self.stalled() if v.drop is not None), key=lambda v: v.sending_since or 0.0)
        for v in stuck[:limit]:
            self._drop(v)
        return len(stuck[:limit])

    def reap_now_and_then(self) -> None:
        if self.clock() - self._last_reap >= 1.0:
            self.reap()


def hand_back_memory_later() -> None:
    """After a flood of viewers ebbs, give the freed heap back to the system. Python and
    glibc keep freed memory for reuse; after thousands of connections that is tens of MB
    held for ever (the daemon would stay at its flood size)."""
    if MALLOC_TRIM is None:
        return

    async def later() -> None:
        await trio.sleep(TRIM_AFTER_S)
        # In a worker thread: trimming a fragmented heap can take a few hundred ms.
        await trio.to_thread.run_sync(MALLOC_TRIM)
    trio.lowlevel.spawn_system_task(later, name="dashboard: malloc_trim after a flood")


def client_key(scope: dict[str, Any]) -> str:
    peer = (scope.get("client") or ("?", 0))[0] or "?"
    if peer.startswith(LOOPBACK_PEERS):
        login = header(scope, b"tailscale-user-login")
        if login:
            return f"{peer} {login[:200]}"
    return peer


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def socket_closer(send: Send) -> Callable[[], None] | None:
    """A function that closes the connection under `send`, or None if it cannot be found.
    Also shrinks the socket's send buffer, so a non-reading viewer blocks sooner."""
    obj: Any = send
    for _ in range(6):
        owner = getattr(obj, "__self__", None)
        if owner is None:
            return None
        stream = getattr(owner, "stream", None)
        if isinstance(stream, trio.SocketStream):
            try:
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
            except OSError:
                pass
            return stream.socket.close     # wakes a blocked send with ClosedResourceError
        obj = getattr(owner, "send", None)
    return None


async def respond_json(send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


def chunks(frames: list[tuple[int, bytes]]) -> Iterator[tuple[bytes, int]]:
    """Frames joined into writes of about CHUNK bytes: (bytes, last seq in it), made one at
    a time as the viewer takes them. A lone frame is the hub's own bytes object, not a copy."""
    batch: list[bytes] = []
    size = 0
    for seq, data in frames:
        batch.append(data)
        size += len(data)
        if size >= CHUNK:
            yield (batch[0] if len(batch) == 1 else b"".join(batch)), seq
            batch, size = [], 0
    if batch:
        yield (batch[0] if len(batch) == 1 else b"".join(batch)), frames[-1][0]


async def serve_stream(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Send, *,
                       hub: EventHub, stream: Stream, after: int | None, viewers: Viewers, drain: trio.Event,
                       headers: list[tuple[bytes, bytes]]) -> None:
    admitted = viewers.admit(client_key(scope))
    if isinstance(admitted, str):
        status = 503 if viewers.count >= viewers.max_total else 429
        await respond_json(send, status, {"error": admitted}, [(b"retry-after", b"10"), *headers])
        return
    viewer = admitted
    stream.viewers += 1
    try:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *headers]})
        close_socket = socket_closer(send)
        async with trio.open_nursery() as nursery:
            def drop() -> None:
                nursery.cancel_scope.cancel()
                if close_socket is not None:
                    close_socket()     # a send blocked in Hypercorn's shielded write needs this
            viewer.drop = drop

            async def until_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()
            nursery.start_soon(until_disconnect)
            await _pump(send, hub, stream, after, viewer, viewers, drain)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()
    finally:
        stream.viewers -= 1
        viewers.leave(viewer)


async def _pump(send: Send, hub: EventHub, stream: Stream, after: int | None, viewer: Viewer,
                viewers: Viewers, drain: trio.Event) -> None:
    async def push(data: bytes) -> None:
        viewer.sending_since = trio.current_time()
        await send({"type": "http.response.body", "body": data, "more_body": True})
        viewer.sending_since = None

    await push(b"retry: 2000\n\n")
    if after is not None and after > hub.seq:      # an id from an earlier daemon life
        await push(frame(None, "reload", {"reason": "the daemon restarted"}))
        return
    last = stream.floor if after is None else after     # no id: what the stream still keeps
    gap = MIN_GAP_S[stream.kind]
    sent_at = -gap
    while True:
        changed = stream.changed_event()
        frames = stream.since(last)
        if frames is None:
            await push(frame(None, "reload", {"reason": "events were missed; reload"}))
            return
        for data, upto in chunks(frames):
            await push(data)
            last = upto
        if frames:
            sent_at = trio.current_time()
        if drain.is_set() or hub.closing:
            await push(frame(None, "shutdown", {}))
            return
        with trio.move_on_after(KEEPALIVE_S) as idle:
            await changed.wait()       # set by a publish, or by wake_all() at shutdown
        if idle.cancelled_caught:
            viewers.reap_now_and_then()
            await push(b": keep-alive\n\n")
        else:
            # Let a burst gather into one write.
            await trio.sleep(max(0.0, sent_at + gap - trio.current_time()))
