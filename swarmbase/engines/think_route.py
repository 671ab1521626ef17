"""Which path an agent takes: a think agent (no tools) of an engine whose
`inProcessThink` is on runs inside the daemon (engines/think_run.py); every agent with
tools, and every agent of an engine that opted out, runs its CLI. The journal key is
built before this choice (runs/agents.py), from the call alone, so a resume replays
across the two paths."""

from __future__ import annotations

import attrs

from .base import AgentIO, AgentJob, Engine
from .verdict import Verdict


@attrs.frozen
class ThinkRouter:
    """An Engine: `cli` for agents with tools, `in_daemon` for think agents when `enabled`."""
    cli: Engine
    in_daemon: Engine
    enabled: bool

    @property
    def name(self) -> str:
        return self.cli.name

    def engine_for(self, job: AgentJob) -> Engine:
        return self.in_daemon if self.enabled and job.profile == "think" else self.cli

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        return await self.engine_for(job).run(job, io)
