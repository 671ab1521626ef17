"""Serving the dashboard's SSE streams at a bounded cost, per viewer and in total.

An SSE viewer costs the daemon a task, a socket, and whatever it has been sent but has
not read. Hostile or broken viewers (1,500 clients that never read took a daemon to
5.4 GB once) are bounded four ways:
- admission: at most MAX_STREAMS streams, at most MAX_PER_CLIENT per client, shared
  fairly by what a viewer cannot forge (dashboard/admission.py, dashboard/peers.py);
- the replay a viewer may ask for is what the hub still holds (bounded); older → reload;
- a viewer is sent at most CHUNK bytes at a time, and its socket's kernel send buffer is
  set small, so a reader that stops reading blocks after a bounded amount;
- a viewer blocked in a send for STALL_S is dropped (its socket closed) whenever a new
  viewer needs room or a keep-alive tick comes round; one that falls behind the hub's
  buffer is told to reload and its stream ends; at the global cap, a branch of viewers
  holding more streams gives one up to a viewer holding fewer (see admission.Viewers).

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

import trio

from swarmbase.events import EventHub, Stream, frame

from .admission import MAX_STREAMS, Viewer, Viewers
from .peers import header, viewer_key

__all__ = ["MAX_STREAMS", "Viewers", "header", "serve_stream", "chunks", "hand_back_memory_later"]

CHUNK = 32 * 1024
SNDBUF = 32 * 1024
KEEPALIVE_S = 15.0
# Least time between two sends to one viewer: a burst of events goes out as one write
# (and a run list being logged to 100 times a second refreshes twice a second).
MIN_GAP_S = {"list": 0.5, "run": 0.02, "agent": 0.02}

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
                       headers: list[tuple[bytes, bytes]], proxy_host: str | None) -> None:
    """`proxy_host`: the host name of `publicUrl`, which requests through `tailscale serve` name."""
    admitted = viewers.admit(viewer_key(scope, proxy_host))
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
