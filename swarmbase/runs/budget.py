"""The per-run budget: reserve a cap before an agent starts, settle what it used after.

`Ledger` is the pure arithmetic; `BudgetGate` adds the waiting: an agent that cannot
reserve the minimum waits while others hold reservations (their unused parts may come
back), and fails when nothing can free up.
"""

from __future__ import annotations

from collections import deque

import attrs
import trio

from .. import money

MIN_USD = 0.03
EPS = 1e-9


class BudgetSpent(Exception):
    pass


def default_max_usd(budget_usd: float, per_run_concurrency: int) -> float:
    """An agent's USD cap when it sets no maxUsd: the run's budget shared by its slots, so
    a script that never sets maxUsd can have perRunConcurrency agents at once."""
    return max(MIN_USD, budget_usd / max(1, per_run_concurrency))


@attrs.define
class Ledger:
    total: float
    minimum: float = MIN_USD
    spent: float = 0.0
    reserved: float = 0.0

    @property
    def available(self) -> float:
        return max(0.0, self.total - self.spent - self.reserved)

    def try_reserve(self, cap: float) -> float | None:
        """Reserve min(cap, available), if that is at least the minimum."""
        avail = self.available
        want = min(cap, avail)
        if want + EPS < min(self.minimum, cap) or want <= EPS:
            return None
        self.reserved += want
        return want

    def settle(self, reserved: float, used: float) -> None:
        """Return a reservation and book what was used (which may exceed it by one turn)."""
        self.reserved = max(0.0, self.reserved - reserved)
        self.spent += used

    @property
    def can_free_up(self) -> bool:
        return self.reserved > EPS

    def view(self) -> dict[str, float]:
        return {"total": round(self.total, 6), "spent": round(self.spent, 6), "reserved": round(self.reserved, 6),
                "remaining": round(self.available, 6)}


class BudgetGate:
    """Reservations wait first-in first-out: while anyone waits, a newcomer queues behind
    them even if its (smaller) cap would fit, so agents start in the order they asked."""

    def __init__(self, ledger: Ledger, what: str = "USD") -> None:
        self.ledger = ledger
        self.what = what
        self._waiters: deque[trio.Event] = deque()
        self._changed = trio.Event()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_now(self, cap: float) -> float | None:
        """A reservation without waiting, if nobody is queued and it fits."""
        if self._waiters:
            return None
        return self.ledger.try_reserve(cap)

    async def reserve(self, cap: float) -> float:
        got = self.try_now(cap)
        if got is not None:
            return got
        turn = trio.Event()
        self._waiters.append(turn)
        try:
            while True:
                if self._waiters[0] is turn:
                    got = self.ledger.try_reserve(cap)
                    if got is not None:
                        return got
                    if not self.ledger.can_free_up:
                        raise BudgetSpent(self._spent_message())
                changed = self._changed
                await changed.wait()
        finally:
            self._waiters.remove(turn)
            self._wake()

    def _spent_message(self) -> str:
        lg = self.ledger
        if self.what == "USD":
            return (f"the run's budget is spent: {money.usd(lg.spent)} of {money.usd(lg.total)} used, "
                    f"less than {money.usd(lg.minimum)} left for another agent")
        return (f"the run's token budget is spent: {lg.spent:,.0f} of {lg.total:,.0f} tokens used")

    def _wake(self) -> None:
        ev, self._changed = self._changed, trio.Event()
        ev.set()

    def settle(self, reserved: float, used: float) -> None:
        self.ledger.settle(reserved, used)
        self._wake()
