"""The view of a run that one script has: the root script's is the LiveRun itself, a
nested workflow's is its WorkflowScope (workflows.py). What differs per scope is here
(its path and depth, its profile, its budget slice, its journal-key counter and args,
its runner bridge, how its agents are filed); what the whole run shares (agents, slots,
journal, records, change reporting) is reached through `root`, never proxied.
"""

from __future__ import annotations

from typing import Protocol

from ..jsonvalue import JsonObject
from .budget import BudgetGate
from .journal import KeyCounter
from .live import Bridge, LiveRun
from .records import AgentRecord


class Scope(Protocol):
    workflow_path: str               # "" for the root script, "1", "1/2" … for workflows
    depth: int
    workflow_calls: int              # workflow() calls this script has made
    usd: BudgetGate
    tokens: BudgetGate
    keys: KeyCounter
    args_digest: str
    bridge: Bridge | None

    @property
    def root(self) -> LiveRun: ...

    @property
    def profile(self) -> str:
        """The script's profile: its agents' default and ceiling."""

    def add_agent(self, rec: AgentRecord, phase_title: str | None = None) -> None:
        """File one of this script's agents in the run (under opts.phase, else its current phase)."""

    def budget_view(self) -> JsonObject:
        """What this script's `budget` shows."""
