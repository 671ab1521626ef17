"""One fake of the daemon's agent service (swarmbase/runs/agent_service.py), implementing
the whole AgentService protocol, for tests about everything around agents (runs, notices,
spares, shutdown) rather than agents themselves: no engine, no process.

`FakeAgents` answers every call with its prompt; `Parked` calls never finish on their
own; `Gate` calls wait until the test opens the gate. The tickets are numbered by the
fake, not the run: these runs file no agents.
"""

from __future__ import annotations

from typing import Any, Sequence

import trio

from swarmbase.runs.agent_service import AgentService, Replayed, Ticket
from swarmbase.runs.live import LiveRun
from swarmbase.runs.scope import Scope


class FakeAgents:
    """An agent service whose calls answer with their prompt."""

    def __init__(self) -> None:
        self.begun = 0
        self.started = trio.Event()          # set by the first call
        self.cancelled: list[tuple[list[int], str]] = []

    @property
    def spawned(self) -> int:
        return 0                             # no processes

    def begin(self, scope: Scope, prompt: str, opts: dict[str, Any]) -> Ticket:
        self.begun += 1
        return Ticket(self.begun)

    def replay_now(self, scope: Scope, prompt: str, opts: dict[str, Any], ticket: Ticket) -> Replayed | None:
        return None                          # nothing is journaled

    async def call(self, scope: Scope, prompt: str, opts: dict[str, Any], ticket: Ticket) -> Any:
        self.started.set()
        return await self.answer(prompt)

    async def answer(self, prompt: str) -> Any:
        return prompt

    def calls_cancelled(self, live: LiveRun, tickets: Sequence[Ticket], reason: str) -> None:
        self.cancelled.append(([t.n for t in tickets], reason))

    def skip(self, live: LiveRun, n: int) -> bool:
        return False                         # no agent of these runs is ever running


class Parked(FakeAgents):
    """An agent service whose calls never finish on their own."""

    async def answer(self, prompt: str) -> Any:
        await trio.sleep_forever()


class Gate(FakeAgents):
    """Agent calls wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.open = trio.Event()

    async def answer(self, prompt: str) -> Any:
        await self.open.wait()
        return prompt


def conforms(fake: FakeAgents) -> AgentService:
    """Type-checked (pyproject.toml [tool.mypy] files): the fake is a whole AgentService."""
    return fake
