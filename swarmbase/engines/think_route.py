"""Which path an agent takes: a think agent (no tools) of an engine whose
`inProcessThink` is on runs inside the daemon (engines/think_run.py), and so does a claude
read agent on this machine while `inProcessRead` is on (engines/read_run.py, its tools in a
sandboxed host); write agents, and every agent of an engine that opted out, run the CLI. The journal key is
built before this choice (runs/agents.py), from the call alone, so a resume replays
across the two paths. Everything but `run` is the CLI engine's: the models, schema
rules, token budget and prices an agent gets do not depend on the path."""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from ..config import Caller, PriceRow
from .base import AgentIO, AgentJob, Engine
from .verdict import Verdict


class AgentRunner(Protocol):
    """What the in-daemon path offers: it runs an agent; the rest is the CLI engine's."""
    async def run(self, job: AgentJob, io: AgentIO) -> Verdict: ...


class ReadRunner(AgentRunner, Protocol):
    """An in-daemon path for some agents with tools: it says which (at each agent)."""
    def takes(self, job: AgentJob, io: AgentIO) -> bool: ...


@attrs.frozen
class ThinkRouter:
    """An Engine: `in_daemon` for think agents when `enabled`, `reader` for the agents it
    takes, `cli` for the rest."""
    cli: Engine
    in_daemon: AgentRunner
    enabled: bool
    reader: ReadRunner | None = None

    @property
    def name(self) -> str:
        return self.cli.name

    @property
    def max_schema_bytes(self) -> int:
        return self.cli.max_schema_bytes

    @property
    def cli_default_model(self) -> str | None:
        return self.cli.cli_default_model

    @property
    def local_only(self) -> str | None:
        return self.cli.local_only

    def default_model(self, caller: Caller, run_model: str | None, phase_model: str | None) -> str | None:
        return self.cli.default_model(caller, run_model, phase_model)

    def token_budget(self, asked: int | None) -> int | None:
        return self.cli.token_budget(asked)

    def prepare_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return self.cli.prepare_schema(schema)

    def price(self, model: str | None) -> PriceRow | None:
        return self.cli.price(model)

    def runs_in_daemon(self, job: AgentJob) -> bool:
        return self.enabled and job.profile == "think"

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        if self.runs_in_daemon(job):
            return await self.in_daemon.run(job, io)
        if self.reader is not None and self.reader.takes(job, io):
            return await self.reader.run(job, io)
        return await self.cli.run(job, io)
