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
    meta: Any = None                    # the script's meta (swarmbase.script.meta.Meta), or None
    current_phase: dict[str, int] = attrs.Factory(dict)    # workflow path -> index in phases
    output_tokens: int = 0              # what budget.spent() reports: output tokens of every agent
    max_agents: int = 1000              # the daemon's maxAgentsPerRun, shown to the script

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

    def add_agent(self, rec: AgentRecord, phase_title: str | None = None) -> None:
        """The scope interface (shared with workflows.WorkflowScope): an agent of the root script."""
        self.file_agent(rec, "", phase_title)

    def file_agent(self, rec: AgentRecord, path: str, phase_title: str | None = None) -> None:
        """Count an agent in the run and file it under its own phase (opts.phase) or its
        workflow's current one."""
        phase = self.phase_named(path, phase_title) if phase_title is not None else self.phase_for(path)
        phase["agents"].append(rec.n)
        rec.phase = phase["title"]
        self.agents[rec.n] = rec
        self.run.agents_total += 1

    def budget_view(self) -> dict[str, Any]:
        return script_budget(self, self.usd, self.tokens)

    # -- phases: one group per (workflow path, title), as Claude Code groups them --------
    def declare_phases(self) -> None:
        """The lanes a script's meta.phases declares, there before any agent starts."""
        for p in (self.meta.phases if self.meta is not None else ()):
            group = self.phase_named("", p.title)
            if p.detail:
                group["detail"] = p.detail

    def phase_named(self, path: str, title: str) -> dict[str, Any]:
        """The group of this title in this workflow, made if new; the current phase stays."""
        for p in self.phases:
            if p["title"] == title and p.get("workflow", "") == path:
                return p
        self.phases.append({"title": title, "workflow": path, "agents": []})
        self.writes.phases_dirty = True
        return self.phases[-1]

    def enter_phase(self, path: str, title: str) -> bool:
        """phase(title) in a workflow: its agents go there from now on. True if the group is new."""
        before = len(self.phases)
        group = self.phase_named(path, title)
        self.current_phase[path] = self.phases.index(group)
        return len(self.phases) > before

    def current_phase_title(self, path: str) -> str | None:
        i = self.current_phase.get(path)
        return self.phases[i]["title"] if i is not None else None

    def phase_model(self, path: str, title: str | None) -> str | None:
        """A declared phase's model (meta.phases[].model): the default of the root script's
        agents filed under it."""
        return self.meta.phase_model(title) if self.meta is not None and not path and title else None

    def phase_for(self, path: str) -> dict[str, Any]:
        """A workflow's current phase; agents started before any phase() go to an implicit
        one ('main' for the root script, the workflow's label for a nested one)."""
        i = self.current_phase.get(path)
        if i is not None:
            return self.phases[i]
        scope = self.scopes.get(path)
        title = "main" if not path else (scope.call.label if scope is not None else f"workflow {path}")
        return self.phase_named(path, title)

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


def script_budget(live: LiveRun, usd: BudgetGate, tokens: BudgetGate) -> dict[str, Any]:
    """What a script's `budget` shows (sandbox/context/hooks.mjs): Claude Code's token target
    and output tokens spent (shared by the whole run, nested workflows too), the run's agent
    count and cap (parallel() and pipeline() check them before they start anything), and
    SwarmBase's USD and codex token ledgers of this scope."""
    return {"usd": usd.ledger.view(), "codex": tokens.ledger.view(), "target": live.run.token_target,
            "outputTokens": live.output_tokens, "agents": live.agent_count, "maxAgents": live.max_agents}
