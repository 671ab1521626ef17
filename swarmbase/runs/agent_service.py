"""What the script host asks of whoever answers agent() calls: the whole interface, so
nothing finds a member by `getattr`. `Agents` (agents.py) is the daemon's; tests use one
complete fake (tests/fakes/agents.py).

A call is taken in two steps. `begin` runs synchronously in the script's call order,
before the runner's next line is read: what must follow call order (the agent's number,
its options, its journal key) is decided there; `replay_now` answers a journaled call at
once, in that same order. `call` then runs the agent in its own task.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import attrs

from ..jsonvalue import Json, JsonObject
from .agent_opts import AgentOptions
from .live import LiveRun
from .scope import Scope


@attrs.frozen
class Ticket:
    """What `begin` decided in call order: the number, the key, the options (or why not)."""
    n: int
    key: str | None = None
    opts: AgentOptions | None = None
    error: str | None = None


@attrs.frozen
class Replayed:
    """A journaled call's answer, known at once."""
    value: Json


class AgentService(Protocol):
    @property
    def spawned(self) -> int:
        """Agent processes started since boot (for benches and tests)."""

    def begin(self, scope: Scope, prompt: str, opts: JsonObject) -> Ticket:
        """In call order: number the call, resolve its options, key it."""

    def replay_now(self, scope: Scope, prompt: str, opts: JsonObject, ticket: Ticket) -> Replayed | None:
        """In call order: the answer of a call the old journal holds, else None."""

    async def call(self, scope: Scope, prompt: str, opts: JsonObject, ticket: Ticket) -> Json:
        """Run the agent; its answer (AgentCallError makes agent() throw in the script)."""

    def calls_cancelled(self, live: LiveRun, tickets: Sequence[Ticket], reason: str) -> None:
        """The script no longer wants these calls (a race or waitN was decided)."""

    def skip(self, live: LiveRun, n: int) -> bool:
        """An admin skips a running agent; False if it is not running."""
