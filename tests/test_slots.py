"""Run slots granted in call order (runs/slots.py), waking only the agent that may go next."""

from __future__ import annotations

import random

import trio

from swarmbase.runs import slots
from swarmbase.runs.slots import OrderedSlots


async def test_slots_go_in_call_order_and_wake_only_the_next(monkeypatch: object) -> None:
    waits = [0]
    real_event = trio.Event

    class CountingEvent:
        def __init__(self) -> None:
            self.ev = real_event()

        def set(self) -> None:
            self.ev.set()

        def is_set(self) -> bool:
            return self.ev.is_set()

        async def wait(self) -> None:
            waits[0] += 1
            await self.ev.wait()
    monkeypatch.setattr(slots.trio, "Event", CountingEvent)     # type: ignore[attr-defined]
    n = 200
    s = OrderedSlots(3)
    for i in range(1, n + 1):
        s.register(i)
    granted: list[int] = []
    order = list(range(1, n + 1))
    random.Random(7).shuffle(order)                   # tasks start in any order

    async def agent(i: int) -> None:
        await s.acquire(i)
        granted.append(i)
        await trio.sleep(0)
        s.release()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in order:
                nursery.start_soon(agent, i)
    assert granted == list(range(1, n + 1))
    # About one wait per agent that had to wait: waking every waiter on every change made
    # this grow as n * n (about 20,000 here).
    assert waits[0] <= 2 * n


async def test_a_withdrawn_head_lets_the_next_go() -> None:
    s = OrderedSlots(1)
    for i in (1, 2, 3):
        s.register(i)
    await s.acquire(1)                                # holds the only slot
    got: list[int] = []

    async def agent(i: int) -> None:
        await s.acquire(i)
        got.append(i)
        s.release()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent, 3)
            await trio.sleep(0.01)
            s.withdraw(2)                             # 2 will never come (replayed, refused)
            s.release()                               # 1 is done: 3 is next
    assert got == [3]
