"""What every engine gets and gives: one agent's job, its I/O hooks, its live usage.

Engines build a launch spec and read their CLI's stream; they never import the run
supervisor or know where their process runs (the launcher decides). The agent service
owns caps, budgets, records and the journal around them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

import attrs

from .. import json_depth
from ..launch.egress import Endpoint, endpoints
from ..launch.spec import Launcher
from ..prices import PriceRow, Tokens
from .verdict import Verdict

if TYPE_CHECKING:
    from ..config import Caller


@attrs.define
class LiveUsage:
    """What an agent has used so far, updated as it streams. It prices a killed agent and
    feeds the live view. `responses` counts model responses that began: with none, nothing
    was charged and a killed agent costs $0."""
    tokens: Tokens = Tokens()
    cost_usd: float = 0.0
    exact: bool = False          # set once the CLI (or the meter) reported final figures
    responses: int = 0
    priced: bool = True          # False: no price row (codex), cost stays $0


@attrs.frozen
class AgentJob:
    run_id: str
    n: int
    label: str
    engine: str
    model: str | None
    effort: str | None
    profile: str
    schema: dict[str, Any] | None
    prompt: str
    cwd: str                      # host path, realpath-pinned
    api_key: str
    max_usd: float                # the USD reservation: the CLI's own budget flag
    max_tokens: int               # codex: the token ceiling reserved
    caller_max_profile: str
    timeout_ms: int
    secret_files: tuple[str, ...] = ()
    extra_read: tuple[str, ...] = ()          # e.g. a worktree's repository .git (read-only)
    extra_write: tuple[str, ...] = ()         # e.g. a worktree's own admin dir under that .git
    # Checked again at launch (launch/pins.py): the daemon-made dirs under its state dir
    # the agent may use, the caller's roots, and the paths that must still be under them.
    state_dirs: tuple[str, ...] = ()
    cwd_roots: tuple[str, ...] = ()
    caller_paths: tuple[str, ...] = ()
    network: tuple[str, ...] = ()             # the caller's `network` entries (write agents may reach them)
    disallowed_tools: tuple[str, ...] = ()    # agent({disallowedTools}): tools the CLI must not offer
    caller: str | None = None                 # whose agent: a root daemon runs it as that caller's uid
    system_prompt: str | None = None          # a project agent type's body: replaces the CLI's default one

    def egress(self, model_api: Endpoint | None, profile: str | None = None) -> tuple[Endpoint, ...]:
        """What this agent's network may reach: its model API (None: the launcher adds the
        door to a key door it runs beside the agent, launch/spec.ModelKey), and for a write
        agent (the profile it really runs with, when the engine lowered it) the caller's
        hosts too."""
        extra = [ep for entry in self.network for ep in endpoints(entry)] if (profile or self.profile) == "write" else []
        return tuple(dict.fromkeys([*([model_api] if model_api else []), *extra]))

    @property
    def key(self) -> str:
        return f"{self.run_id}-{self.n}"


@attrs.define(eq=False)
class AgentIO:
    launcher: Launcher
    transcript: Callable[[bytes], None]               # one raw line of the CLI's stream
    usage: LiveUsage = attrs.Factory(LiveUsage)
    usage_changed: Callable[[], None] = lambda: None   # live view; rate-limited by the caller
    started: Callable[[Mapping[str, Any]], None] = lambda where: None


class SchemaRefused(ValueError):
    """An agent's schema this engine cannot use; the message says why (the script gets it)."""


# The engines (by name) whose agents keep a token budget (Engine.token_budget), so an
# agent() asking maxTokens of another engine is told which, even when none is configured.
TOKEN_BUDGETED = ("codex",)


class Engine(Protocol):
    """One agent CLI: what the agent service asks of it, so nothing above this seam
    names an engine (no `if engine == "codex"` in runs/)."""

    @property
    def name(self) -> str: ...

    @property
    def max_schema_bytes(self) -> int:
        """The largest opts.schema (JSON bytes) the engine can hand its CLI."""

    @property
    def cli_default_model(self) -> str | None:
        """The model its CLI uses when none is named (checked against the caller's models)."""

    @property
    def local_only(self) -> str | None:
        """Why its agents must run on this machine (None: any placement)."""

    def default_model(self, caller: Caller, run_model: str | None, phase_model: str | None) -> str | None:
        """The model an agent gets when its call names none (None: the CLI's own default)."""

    def token_budget(self, asked: int | None) -> int | None:
        """The tokens an agent reserves from the run's token budget (`asked`: its
        maxTokens); None when the engine keeps no token budget (USD only)."""

    def prepare_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        """The schema as the CLI needs it; SchemaRefused when it cannot be used."""

    def price(self, model: str | None) -> PriceRow | None:
        """The price row for a model (None: unpriced, the agent counts $0)."""

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict: ...


class EngineBase:
    """What an engine is unless it says otherwise: its CLI has no default model of its
    own worth checking, any placement can run it, it keeps no token budget and takes a
    schema as it is."""
    cli_default_model: str | None = None
    local_only: str | None = None

    def token_budget(self, asked: int | None) -> int | None:
        return None

    def prepare_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return schema


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _TooDeep:
    def __repr__(self) -> str:
        return "TOO_DEEP"


# What parse_json_line gives for a line nested deeper than json_depth.LINE_DEPTH: a hostile
# (or broken) model answer the engine must refuse, saying so, rather than just miss.
TOO_DEEP = _TooDeep()


def parse_json_line(line: bytes) -> Any:
    """One event of a CLI's stream; None for anything that is not strict JSON (NaN and
    Infinity tokens included: nothing non-finite may reach a result or a record),
    TOO_DEEP for a line nested deeper than json_depth.LINE_DEPTH."""
    try:
        return json_depth.loads(line, json_depth.LINE_DEPTH, parse_constant=_no_constants)
    except json_depth.TooDeep:
        return TOO_DEEP
    except ValueError:
        return None


def spawn_failure(engine: str, bin_path: str, detail: str) -> Verdict:
    """The CLI could not be started: nothing ran, nothing is charged."""
    return Verdict(ok=False, error=f"could not start the {engine} CLI ({bin_path}): {detail}",
                   cost_usd=0.0, tokens=Tokens(), tokens_exact=True)
