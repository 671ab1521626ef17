"""Live events for the dashboard: numbered, serialised once, kept in bounded buffers.

Streams: one per run (agent states, phases, log lines, status), one per agent that a
viewer watches or that streams transcript lines, and one for the run list (`LIST`).

Why it is shaped like this (each point answers an attack or a measurement):
- An event is turned into its SSE frame bytes once, at publish; every viewer sends the
  same bytes object. Per-viewer serialisation cost 1,500 viewers × the backlog.
- Sequence numbers are hub-wide and start at the boot time in microseconds, so an id
  from an earlier daemon life or from an evicted stream is never mistaken for a current
  one: a viewer whose id is older than what a stream still holds (its `floor`), or newer
  than anything published, is told to reload instead of being fed a partial history.
- Buffers are bounded by events and bytes. Superseding events coalesce: a run's `run`
  row, an agent's row and a run-list row keep only their latest version in the buffer,
  so a script logging 1,000 lines makes 1,000 log events but one pending `run` row.
- Streams of ended runs shrink to a short tail and only the most recently used few are
  kept, so a daemon's memory does not grow with the runs it has served.
"""

from __future__ import annotations

import json
import math
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable, Hashable

import trio

LIST = "*"
TERMINAL = ("completed", "failed", "cancelled", "interrupted")
AGENT_ENDED = ("done", "failed", "skipped", "cancelled", "interrupted")

# (events, bytes) kept per kind of stream while it is live, and once it has ended.
LIMITS = {"list": (1_000, 256 * 1024), "run": (2_000, 512 * 1024), "agent": (400, 128 * 1024)}
ENDED_LIMITS = (16, 16 * 1024)
KEEP_ENDED = 64           # ended streams kept (least recently used evicted first)

Frame = tuple[int, bytes]


def _finite(value: Any) -> Any:
    """The value with NaN and infinities replaced by null (they are not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def frame(seq: int | None, name: str, data: Any) -> bytes:
    """One SSE frame. JSON never spans lines (no newlines survive json.dumps)."""
    try:
        body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:
        body = json.dumps(_finite(data), separators=(",", ":"), ensure_ascii=False)
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {name}\ndata: {body}\n\n".encode()


def agent_key(run_id: str, n: int) -> str:
    return f"{run_id}/{n}"


class Stream:
    """A bounded, coalescing buffer of frames, and the event viewers wait on."""

    def __init__(self, key: str, kind: str, floor: int) -> None:
        self.key = key
        self.kind = kind
        self.max_events, self.max_bytes = LIMITS[kind]
        self.floor = floor           # events numbered <= floor may be missing here
        self.seq = floor             # the newest event published here
        self.size = 0
        self.ended = False
        self.viewers = 0
        self._events: OrderedDict[Hashable, Frame] = OrderedDict()
        self._changed = trio.Event()

    def __len__(self) -> int:
        return len(self._events)

    def append(self, seq: int, data: bytes, coalesce: Hashable | None) -> int:
        """Add a frame; returns the highest sequence number dropped to stay in bounds (0: none)."""
        if coalesce is not None:
            old = self._events.pop(coalesce, None)
            if old is not None:
                self.size -= len(old[1])
        self._events[coalesce if coalesce is not None else seq] = (seq, data)
        self.size += len(data)
        self.seq = seq
        dropped = self.trim(self.max_events, self.max_bytes)
        self.wake()
        return dropped

    def trim(self, max_events: int, max_bytes: int) -> int:
        dropped = 0
        while len(self._events) > max_events or (self.size > max_bytes and len(self._events) > 1):
            _, (seq, data) = self._events.popitem(last=False)
            self.size -= len(data)
            dropped = seq
        if dropped:
            self.floor = max(self.floor, dropped)
        return dropped

    def since(self, after: int) -> list[Frame] | None:
        """Frames after `after`, oldest first; None if some of them are gone (reload)."""
        if after < self.floor:
            return None
        out: list[Frame] = []
        for item in reversed(self._events.values()):
            if item[0] <= after:
                break
            out.append(item)
        out.reverse()
        return out

    def wake(self) -> None:
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def changed_event(self) -> trio.Event:
        """Take this before calling since(), so nothing published in between is missed."""
        return self._changed


class EventHub:
    def __init__(self, start: int | None = None) -> None:
        self.seq = int(time.time() * 1_000_000) if start is None else start
        self.dropped = self.seq          # highest sequence number no longer kept somewhere
        self.closing = False
        self.live: dict[str, Stream] = {}
        self.ended: OrderedDict[str, Stream] = OrderedDict()
        self._agents_of: dict[str, set[str]] = {}
        self._evicted: weakref.WeakSet[Stream] = weakref.WeakSet()   # still held by a viewer
        # How a transcript line becomes what the agent page shows; the dashboard sets it.
        self.render_line: Callable[[Any], Any] = lambda entry: [entry]
        self.live[LIST] = Stream(LIST, "list", self.seq)

    # -- finding streams -----------------------------------------------------------
    def get(self, key: str) -> Stream | None:
        s = self.live.get(key)
        if s is None:
            s = self.ended.get(key)
            if s is not None:
                self.ended.move_to_end(key)
        return s

    def watch(self, key: str, *, ended: bool = False) -> Stream:
        """The stream a viewer follows, created if needed. A viewer of something that has
        ended gets a stream in the bounded ended set, so watching old runs costs nothing
        lasting."""
        s = self.get(key)
        if s is None:
            s = Stream(key, self._kind(key), self.dropped)
            if ended:
                self._park(s)
            else:
                self._adopt(s)
        return s

    def stream(self, key: str) -> Stream:
        """The stream for publishing (created live)."""
        s = self.get(key)
        if s is None:
            s = Stream(key, self._kind(key), self.dropped)
            self._adopt(s)
        return s

    @staticmethod
    def _kind(key: str) -> str:
        return "list" if key == LIST else ("agent" if "/" in key else "run")

    def _adopt(self, s: Stream) -> None:
        self.live[s.key] = s
        if s.kind == "agent":
            self._agents_of.setdefault(s.key.split("/", 1)[0], set()).add(s.key)

    def _park(self, s: Stream) -> None:
        """Move a stream to the ended set: a short tail of it is kept, for a while."""
        self.live.pop(s.key, None)
        s.ended = True
        self._drop(s.trim(*ENDED_LIMITS))
        self.ended[s.key] = s
        self.ended.move_to_end(s.key)
        while len(self.ended) > KEEP_ENDED:
            _, old = self.ended.popitem(last=False)
            self._drop(old.seq)
            if old.viewers:
                self._evicted.add(old)

    def _drop(self, seq: int) -> None:
        if seq > self.dropped:
            self.dropped = seq

    # -- publishing ----------------------------------------------------------------
    def _publish(self, s: Stream, name: str, data: dict[str, Any], coalesce: Hashable | None = None) -> None:
        self.seq += 1
        self._drop(s.append(self.seq, frame(self.seq, name, {**data, "ts": round(time.time(), 3)}), coalesce))

    def publish(self, run_id: str, name: str, data: dict[str, Any]) -> None:
        s = self.stream(run_id)
        if name == "run":
            self._publish(s, name, data, ("run",))
            if data.get("status") in TERMINAL:
                self._end_run(run_id)
        elif name == "agent":
            n = data.get("n")
            self._publish(s, name, data, ("agent", n))
            watched = self.get(agent_key(run_id, n)) if isinstance(n, int) else None
            if watched is not None:
                self._publish(watched, name, data, ("agent",))
                if data.get("state") in AGENT_ENDED and not watched.ended:
                    self._retire(watched)
        else:
            self._publish(s, name, data)

    def publish_list(self, data: dict[str, Any]) -> None:
        self._publish(self.live[LIST], "run", data, ("run", data.get("runId")))

    def publish_agent_line(self, run_id: str, n: int, entry: Any) -> None:
        """One transcript line of a running agent (already redacted), for its agent page."""
        items = self.render_line(entry)
        if items:
            self._publish(self.stream(agent_key(run_id, n)), "line", {"n": n, "items": items})

    def _end_run(self, run_id: str) -> None:
        s = self.live.get(run_id)
        if s is not None:
            self._park(s)
        for key in self._agents_of.pop(run_id, ()):
            a = self.live.get(key)
            if a is not None:
                self._retire(a)

    def _retire(self, s: Stream) -> None:
        """An agent's stream once the agent has ended: kept briefly for its viewers, else gone."""
        self._agents_of.get(s.key.split("/", 1)[0], set()).discard(s.key)
        if s.viewers:
            self._park(s)
        else:
            self.live.pop(s.key, None)
            self._drop(s.seq)

    def wake_all(self) -> None:
        """Wake every waiting viewer without an event (they notice the shutdown)."""
        self.closing = True
        for s in [*self.live.values(), *self.ended.values(), *self._evicted]:
            s.wake()

    # -- for memory checks and tests -------------------------------------------------
    def retained_bytes(self) -> int:
        return sum(s.size for s in [*self.live.values(), *self.ended.values()])
