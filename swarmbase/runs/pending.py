"""What a live run has changed and not yet written (flush.py writes it): log lines,
agent records, replayed agents' inputs, and whether run.json and phases.json are due."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio

from ..jsonvalue import JsonObject
from .records import AgentRecord


@attrs.define
class Pending:
    log: list[JsonObject] = attrs.Factory(list)
    agents: dict[int, AgentRecord] = attrs.Factory(dict)
    # A replayed agent's dir, prompt and opts: written with its record in the flush's
    # thread, not on the event loop (a resume replays 1,000 agents in a burst: issue 33 #2).
    inputs: dict[int, tuple[Path, str, JsonObject]] = attrs.Factory(dict)
    run_dirty: bool = False
    phases_dirty: bool = False
    urgent: trio.Event = attrs.Factory(trio.Event)
    phases_at: float = float("-inf")       # trio time phases.json was last written

    def replayed_inputs(self, rec: AgentRecord, prompt: str, opts: JsonObject) -> None:
        self.inputs[rec.n] = (rec.dir, prompt, opts)

    def agent(self, rec: AgentRecord) -> None:
        self.agents[rec.n] = rec
        self.phases_dirty = True
        self.run_dirty = True
