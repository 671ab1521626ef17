"""What a live run has changed and not yet written (flush.py writes it): log lines,
agent records, and whether run.json and phases.json are due."""

from __future__ import annotations


import attrs
import trio

from ..jsonvalue import JsonObject
from .records import AgentRecord


@attrs.define
class Pending:
    log: list[JsonObject] = attrs.Factory(list)
    agents: dict[int, AgentRecord] = attrs.Factory(dict)
    run_dirty: bool = False
    phases_dirty: bool = False
    urgent: trio.Event = attrs.Factory(trio.Event)
    phases_at: float = float("-inf")       # trio time phases.json was last written

    def agent(self, rec: AgentRecord) -> None:
        self.agents[rec.n] = rec
        self.phases_dirty = True
        self.run_dirty = True
