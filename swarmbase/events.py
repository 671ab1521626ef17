"""Live events for the dashboard: numbered, buffered per stream, replayable by id.

One stream per run (agent states, phases, log lines, status) and one for the run list.
A reconnecting viewer passes the last id it saw (SSE Last-Event-ID) and gets what it
missed from the buffer; if that has been evicted it is told to reload (`reset`).
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from typing import Any

import trio

RUN_BUFFER = 20_000
LIST_BUFFER = 5_000
KEEP_ENDED_STREAMS = 200
LIST = "*"


class Stream:
    def __init__(self, maxlen: int) -> None:
        self.seq = 0
        self.buffer: deque[tuple[int, str, dict[str, Any]]] = deque(maxlen=maxlen)
        self._changed = trio.Event()

    def publish(self, name: str, data: dict[str, Any]) -> None:
        self.seq += 1
        self.buffer.append((self.seq, name, {**data, "ts": time.time()}))
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def since(self, after: int) -> list[tuple[int, str, dict[str, Any]]] | None:
        """Events after `after`; None if some of them were evicted (the viewer must reload)."""
        if after >= self.seq:
            return []
        if not self.buffer or self.buffer[0][0] > after + 1:
            return None
        # Sequence numbers are contiguous in the buffer: index, don't scan.
        return list(itertools.islice(self.buffer, after + 1 - self.buffer[0][0], None))

    def wake(self) -> None:
        """Wake every waiting viewer without an event (e.g. to notice a shutdown)."""
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def changed_event(self) -> trio.Event:
        """Take this before calling since(), so nothing published in between is missed."""
        return self._changed


class EventHub:
    def __init__(self) -> None:
        self.streams: OrderedDict[str, Stream] = OrderedDict()
        self.streams[LIST] = Stream(LIST_BUFFER)

    def stream(self, key: str) -> Stream:
        s = self.streams.get(key)
        if s is None:
            s = self.streams[key] = Stream(RUN_BUFFER if key != LIST else LIST_BUFFER)
            self._evict()
        else:
            self.streams.move_to_end(key)
        return s

    def _evict(self) -> None:
        while len(self.streams) > KEEP_ENDED_STREAMS + 1:
            oldest = next(k for k in self.streams if k != LIST)
            del self.streams[oldest]

    def publish(self, run_id: str, name: str, data: dict[str, Any]) -> None:
        self.stream(run_id).publish(name, data)

    def wake_all(self) -> None:
        for s in self.streams.values():
            s.wake()

    def publish_list(self, data: dict[str, Any]) -> None:
        self.streams[LIST].publish("run", data)
