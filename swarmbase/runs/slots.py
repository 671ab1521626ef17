"""A run's agent slots, granted in call order.

Trio does not promise that tasks start in the order they were spawned, so a plain
semaphore let agents #3–5 of a parallel() start before #1–2. Here every agent registers
its number synchronously when the script calls agent() (call order), and a free slot goes
to the lowest registered number still waiting; an agent that will not wait (replayed,
refused) withdraws its number so it never holds the queue up.
"""

from __future__ import annotations

import heapq

import trio


class OrderedSlots:
    def __init__(self, limit: int) -> None:
        self.free = limit
        self._pending: list[int] = []          # registered, not yet granted (a heap)
        self._members: set[int] = set()        # the same numbers, for membership
        self._gone: set[int] = set()           # withdrawn, still in the heap until pruned
        self._changed = trio.Event()

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
        ev, self._changed = self._changed, trio.Event()
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
                    self._wake()
                    return
                await self._changed.wait()
        except BaseException:
            self.withdraw(n)
            raise

    def release(self) -> None:
        self.free += 1
        self._wake()
