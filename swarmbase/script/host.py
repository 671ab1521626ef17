"""What a script's hooks call on the daemon side (a ScriptHost), and the values that cross
the bridge: the bridge (bridge.py) turns the runner's lines into these calls, and
their answers and errors back into lines.

The host is a complete Protocol with a no-op base (ScriptHostBase) for the members a host
may not need, so the bridge calls every member directly instead of probing for it.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs


class AgentCallError(Exception):
    """Raised by a ScriptHost to make agent() or workflow() throw inside the script with this
    message. `kind` marks a stop of the whole run rather than of this call: "budget" (the
    USD budget or the token target is spent) or "cap" (maxAgentsPerRun); the script sees
    Claude Code's error names for them (WorkflowBudgetExceededError, WorkflowAgentCapError)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class ProbeError(Exception):
    """A test probe failed in the runner, or the runner ended before answering it."""


@attrs.frozen
class Answered:
    """What `agent_begin`/`workflow_begin` may return when the answer is known at once (a
    journal replay). The bridge then replies before it reads the runner's next line, so the
    answer reaches the script in call order, and `settle()` can wait for the script's
    reaction to it."""
    value: Any


@attrs.frozen
class ScriptOutcome:
    ok: bool
    value: Any = None
    error: str | None = None
    line: int | None = None
    watchdog: bool = False


@attrs.frozen
class RunnerLimits:
    slice_ms: int = 5000
    ping_interval: float = 2.0
    pong_timeout: float = 10.0
    memory_mb: int = 512
    cpu_seconds: int | None = None


class Attached(Protocol):
    """What a host may ask of the bridge it is attached to."""

    async def sync(self) -> None:
        """Return once the bridge has read what the runner wrote in answer to what was sent."""

    async def settle(self) -> None:
        """Sync until no answer known at once is left to reach the script."""

    async def probe(self, code: str) -> Any:
        """Test hook: run `code` in the runner's own realm (a runner started to allow it)."""


class ScriptHost(Protocol):
    def attach(self, bridge: Attached) -> None:
        """The bridge of this host's runner, before the script starts."""

    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        """In call order, before the runner's next line is read: what must follow the
        script's call order (numbering, journal keys). A ticket for `agent`, or Answered."""

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any) -> Any:
        """The agent's answer; AgentCallError makes agent() throw in the script."""

    def workflow_begin(self, source: Any, args: Any, opts: dict[str, Any]) -> Any:
        """As agent_begin, for a nested workflow() call."""

    async def workflow(self, source: Any, args: Any, opts: dict[str, Any], ticket: Any) -> Any:
        """The nested workflow's value (AgentCallError: workflow() throws)."""

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        """The script gave up these in-flight calls (race/waitN losers); called before their
        tasks are cancelled, so the host can record why. A ticket may belong to a call that
        has just finished."""

    def phase(self, title: str) -> None: ...
    def log(self, message: str) -> None: ...
    def budget_view(self) -> dict[str, Any]: ...


class ScriptHostBase:
    """What a host is unless it says otherwise: it keeps no bridge, its calls need no
    ticket, it runs no nested workflows, and it ignores cancels (its calls' tasks are
    cancelled anyway)."""

    def attach(self, bridge: Attached) -> None:
        pass

    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        return None

    def workflow_begin(self, source: Any, args: Any, opts: dict[str, Any]) -> Any:
        return None

    async def workflow(self, source: Any, args: Any, opts: dict[str, Any], ticket: Any) -> Any:
        raise AgentCallError("workflow() is not available in this daemon")

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        pass
