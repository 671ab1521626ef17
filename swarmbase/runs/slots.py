"""A run's agent slots, granted in call order.

Trio does not promise that tasks start in the order they were spawned, so a plain
semaphore let agents #3–5 of a parallel() start before #1–2. Here every agent registers
its number synchronously when the script calls agent() (call order), and a free slot goes
to the lowest registered number still waiting; an agent that will not wait (replayed,
refused) withdraws its number so it never holds the queue up.

Only the waiter that can go next is woken (each waiter has its own event): waking every
waiter on every change made a 2,000-agent run cost millions of task wake-ups, quadratic in
its agents (perf v2).
"""

from __future__ import annotations

import heapq
from contextlib import asynccontextmanager
from typing import AsyncIterator

import trio


class OrderedSlots:
    def __init__(self, limit: int) -> None:
        self.free = limit
        self._pending: list[int] = []          # registered, not yet granted (a heap)
        self._members: set[int] = set()        # the same numbers, for membership
        self._gone: set[int] = set()           # withdrawn, still in the heap until pruned
        self._waiters: dict[int, trio.Event] = {}    # numbers blocked in acquire()

    def register(self, n: int) -> None:
        heapq.heappush(self._pending, n)
        self._members.add(n)

    def withdraw(self, n: int) -> None:
        """n will not acquire (or stopped waiting); a no-op once it was granted."""
        if n in self._members:
            self._members.discard(n)
            self._gone.add(n)
            self._prune()
            self._wake()

    def _prune(self) -> None:
        while self._pending and self._pending[0] in self._gone:
            self._gone.discard(heapq.heappop(self._pending))

    def _wake(self) -> None:
        """Wake the waiter that may go next, if a slot is free and it is waiting."""
        self._prune()
        if self.free > 0 and self._pending:
            ev = self._waiters.get(self._pending[0])
            if ev is not None:
                ev.set()

    @property
    def waiting(self) -> int:
        return len(self._members)

    async def acquire(self, n: int) -> None:
        try:
            while True:
                self._prune()
                if self.free > 0 and self._pending and self._pending[0] == n:
                    heapq.heappop(self._pending)
                    self._members.discard(n)
                    self.free -= 1
                    self._wake()               # the next in line, if a slot is still free
                    return
                ev = self._waiters[n] = trio.Event()
                try:
                    await ev.wait()
                finally:
                    if self._waiters.get(n) is ev:
                        del self._waiters[n]
        except BaseException:
            self.withdraw(n)
            raise

    def release(self) -> None:
        self.free += 1
        self._wake()


class RunSlots:
    """A run's slots plus a doorway: after taking a slot, an agent passes the doorway
    (one at a time, in call order) to reserve its budget, take a daemon-wide slot and be
    marked running. Every await in there (budget, the global semaphore) is a checkpoint
    where trio may reorder tasks; the doorway keeps a run's agents starting in the order
    the script called them. Nothing waits on the doorway while holding what another
    agent in it needs, so it cannot deadlock: agents past it run and free what they hold."""

    def __init__(self, limit: int) -> None:
        self.slots = OrderedSlots(limit)
        self.door = OrderedSlots(1)

    def register(self, n: int) -> None:
        self.slots.register(n)
        self.door.register(n)

    def withdraw(self, n: int) -> None:
        self.slots.withdraw(n)
        self.door.withdraw(n)

    async def acquire(self, n: int) -> None:
        try:
            await self.slots.acquire(n)
        except BaseException:
            self.door.withdraw(n)
            raise

    def release(self) -> None:
        self.slots.release()

    @asynccontextmanager
    async def doorway(self, n: int) -> AsyncIterator[None]:
        await self.door.acquire(n)
        try:
            yield
        finally:
            self.door.release()

    @property
    def waiting(self) -> int:
        return self.slots.waiting
