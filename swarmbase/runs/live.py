"""A run's in-memory state while it is in flight (LiveRun): its phases, agents, budget
gates, journal, pending writes and nested workflow scopes. The supervisor owns the
lifecycle; this is the state every piece of a running run shares."""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ..config import Caller
from . import flush
from . import journal as journal_mod
from .budget import BudgetGate, Ledger
from .journal import Journal, KeyCounter
from .model import Run
from .records import AgentRecord
from .slots import RunSlots

TOKEN_MINIMUM = 1_000     # a codex agent that cannot reserve this many tokens waits or fails


@attrs.define(eq=False)
class LiveRun:
    """In-memory state of a run while it is in flight."""
    run: Run
    caller: Caller
    slots: RunSlots
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    stop_reason: str | None = None          # 'cancel', 'shutdown', 'timeout', 'limit'
    stop_detail: str | None = None
    cancelled_by: str = "the caller"
    phases: list[dict[str, Any]] = attrs.Factory(list)
    finished: trio.Event = attrs.Factory(trio.Event)
    usd: BudgetGate = attrs.field(default=None)
    agent_count: int = 0
    agents: dict[int, AgentRecord] = attrs.Factory(dict)
    agent_scopes: dict[int, trio.CancelScope] = attrs.Factory(dict)
    stop_reasons: dict[int, tuple[str, str]] = attrs.Factory(dict)
    journal: Journal | None = None
    journal_lock: trio.Lock = attrs.Factory(trio.Lock)
    replay: dict[str, dict[str, Any]] = attrs.Factory(dict)    # key -> old journal entry
    keys: KeyCounter = attrs.Factory(KeyCounter)
    tokens: BudgetGate = attrs.field(default=None)     # the codex token budget
    workflow_path: str = ""
    args_digest: str = ""
    writes: flush.Pending = attrs.Factory(flush.Pending)
    log_bytes: int = 0
    bridge: Any = None
    scopes: dict[str, Any] = attrs.Factory(dict)       # live nested workflows by path
    cancelled_workflows: dict[str, str] = attrs.Factory(dict)   # path -> why the script gave it up
    workflows_total: int = 0
    warned: bool = False                                 # the budget warning went out
    depth: int = 0                                       # the root script; workflows count from 1
    workflow_calls: int = 0                              # workflow() calls made by the root script
    chains: Any = None                  # the run's hash chains (swarmbase.audit.seal.RunChains)
    # Kept as agents change (agent_changed), so a change costs the same at agent 2,000 as
    # at agent 2: the numbers running now, and the rows of ended agents (they never change).
    running_now: set[int] = attrs.Factory(set)
    ended_rows: dict[int, dict[str, Any]] = attrs.Factory(dict)

    def __attrs_post_init__(self) -> None:
        if self.usd is None:
            self.usd = BudgetGate(Ledger(total=self.run.budget_usd, spent=self.run.spent_usd))
        if self.tokens is None:
            self.tokens = BudgetGate(Ledger(total=float(self.run.budget_tokens), minimum=TOKEN_MINIMUM), what="tokens")
        self.args_digest = journal_mod.args_hash(self.run.args)

    # -- the scope interface (shared with workflows.WorkflowScope) -------------------

    @property
    def profile(self) -> str:
        return self.run.profile

    @property
    def root(self) -> "LiveRun":
        return self

    def next_agent_number(self) -> int:
        self.agent_count += 1
        return self.agent_count

    def add_agent(self, rec: AgentRecord, path: str = "") -> None:
        """Count an agent in the run and file it under its workflow's current phase."""
        phase = self.phase_for(path)
        phase["agents"].append(rec.n)
        rec.phase = phase["title"]
        self.agents[rec.n] = rec
        self.run.agents_total += 1

    def budget_view(self) -> dict[str, Any]:
        return {**self.usd.ledger.view(), "tokens": self.tokens.ledger.view()}

    def phase_for(self, path: str) -> dict[str, Any]:
        """A workflow's current phase; agents started before any phase() go to an implicit
        one ('main' for the root script, the workflow's label for a nested one)."""
        for p in reversed(self.phases):
            if p.get("workflow", "") == path:
                return p
        scope = self.scopes.get(path)
        title = "main" if not path else (scope.call.label if scope is not None else f"workflow {path}")
        self.phases.append({"title": title, "workflow": path, "agents": []})
        return self.phases[-1]

    def phase_for_agents(self) -> dict[str, Any]:
        return self.phase_for("")

    def phases_view(self) -> list[dict[str, Any]]:
        ended = self.ended_rows
        return [{"title": p["title"], "workflow": p.get("workflow", ""),
                 "agents": [ended[n] if n in ended else self.agents[n].row() for n in p["agents"] if n in self.agents]}
                for p in self.phases]

    def totals(self) -> tuple[float, int, float, int]:
        """(spent USD, spent tokens, reserved USD, reserved tokens) across the run: the root's
        ledgers hold what finished workflows spent; live workflows' slices are counted
        from their own ledgers (each ledger once)."""
        usd = {id(self.usd.ledger): self.usd.ledger}
        tok = {id(self.tokens.ledger): self.tokens.ledger}
        for scope in self.scopes.values():
            usd.setdefault(id(scope.usd.ledger), scope.usd.ledger)
            tok.setdefault(id(scope.tokens.ledger), scope.tokens.ledger)
        return (sum(lg.spent for lg in usd.values()), int(sum(lg.spent for lg in tok.values())),
                self.usd.ledger.reserved, int(self.tokens.ledger.reserved))

    @property
    def running(self) -> int:
        return len(self.running_now)
