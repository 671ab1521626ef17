"""A run in flight (LiveRun): its state — phases, agents, budget gates, journal, pending
writes, nested workflow scopes — and the reporting of its own changes: to viewers (the
event hub), to its records (the batched flush), to observers, to its caller (the budget
warning). The Supervisor owns the lifecycle; the agent service and the script host
change a run only through the methods here, so what a change reports is said once.

LiveRun is the root Scope (scope.py); a nested workflow's scope shares it as its root."""

from __future__ import annotations

import logging
from typing import Protocol

import attrs
import trio

from .. import fsutil, money
from ..audit.seal import RunChains
from ..config import Caller
from ..jsonvalue import JsonObject
from ..notify import notices
from ..script.meta import Meta
from . import journal as journal_mod
from .budget import BudgetGate, Ledger
from .ending import Stop
from .env import RunEnv
from .journal import Journal, KeyCounter
from .model import Run
from .pending import Pending
from .project_agents import NO_PROJECT_AGENTS, ProjectAgents
from .records import ENDED, AgentRecord
from .slots import RunSlots

log = logging.getLogger("swarmbase.supervisor")

TOKEN_MINIMUM = 1_000     # an agent that cannot reserve this many tokens (a token-budgeted engine) waits or fails


class Bridge(Protocol):
    """What a scope's runner bridge offers the agent service (script/bridge.py)."""

    async def settle(self) -> None:
        """Return once the runner has acted on every answer sent so far."""


class Slice(Protocol):
    """What the run counts of a live nested workflow (workflows.WorkflowScope): its budget
    slice's ledgers, and the title its agents are filed under before any phase()."""
    usd: BudgetGate
    tokens: BudgetGate

    @property
    def default_phase(self) -> str: ...


@attrs.define(eq=False)
class LiveRun:
    """In-memory state of a run while it is in flight."""
    run: Run
    caller: Caller
    env: RunEnv
    slots: RunSlots
    chains: RunChains | None = None     # the run's hash chains
    meta: Meta | None = None            # the script's meta, or None
    max_agents: int = 1000              # the daemon's maxAgentsPerRun, shown to the script
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    stopped: Stop | None = None         # why the run was stopped (the first reason stays)
    stop_detail: str | None = None
    cancelled_by: str = "the caller"
    # Worktree agents asked for, and those refused for want of a repository (the reason kept):
    # a run whose every worktree agent was refused so is failed, not completed.
    worktree_agents: int = 0
    no_repository: list[str] = attrs.Factory(list)
    # The project's agent types (.claude/agents), read when the run starts (supervisor._run).
    project_agents: ProjectAgents = NO_PROJECT_AGENTS
    finished: trio.Event = attrs.Factory(trio.Event)
    usd: BudgetGate = attrs.field(default=None)
    tokens: BudgetGate = attrs.field(default=None)     # the token budget (token-budgeted engines)
    # The agents: numbered in call order; their records, cancel scopes and why each was stopped.
    agent_count: int = 0
    agents: dict[int, AgentRecord] = attrs.Factory(dict)
    agent_scopes: dict[int, trio.CancelScope] = attrs.Factory(dict)
    stop_reasons: dict[int, tuple[str, str]] = attrs.Factory(dict)
    # Kept as agents change (agent_changed), so a change costs the same at agent 2,000 as
    # at agent 2: the numbers running now, and the rows of ended agents (they never change).
    running_now: set[int] = attrs.Factory(set)
    ended_rows: dict[int, JsonObject] = attrs.Factory(dict)
    output_tokens: int = 0              # what budget.spent() reports: output tokens of every agent
    # The journal: this run's, the old one's entries a resume replays, and the key counter.
    journal: Journal | None = None
    journal_lock: trio.Lock = attrs.Factory(trio.Lock)
    # Lines of agents that ended while a journal write was under way: the next lock holder
    # writes them all with one fsync (journal_append).
    journal_waiting: list[JsonObject] = attrs.Factory(list)
    replay: dict[str, JsonObject] = attrs.Factory(dict)    # key -> old journal entry
    keys: KeyCounter = attrs.Factory(KeyCounter)
    args_digest: str = ""
    # Phases: one group per (workflow path, title); the current one of each workflow.
    phases: list[JsonObject] = attrs.Factory(list)
    current_phase: dict[str, int] = attrs.Factory(dict)    # workflow path -> index in phases
    writes: Pending = attrs.Factory(Pending)
    log_bytes: int = 0
    warned: bool = False                # the budget warning went out
    # Nested workflows: live scopes by path, the ones the script gave up, how many there were.
    scopes: dict[str, Slice] = attrs.Factory(dict)
    cancelled_workflows: dict[str, str] = attrs.Factory(dict)   # path -> why the script gave it up
    workflows_total: int = 0
    # The Scope side (a nested workflow's scope has its own of each).
    workflow_path: str = ""
    depth: int = 0                      # the root script; workflows count from 1
    workflow_calls: int = 0             # workflow() calls made by the root script
    bridge: Bridge | None = None

    def __attrs_post_init__(self) -> None:
        if self.usd is None:
            self.usd = BudgetGate(Ledger(total=self.run.budget_usd, spent=self.run.spent_usd))
        if self.tokens is None:
            self.tokens = BudgetGate(Ledger(total=float(self.run.budget_tokens), minimum=TOKEN_MINIMUM), what="tokens")
        self.args_digest = journal_mod.args_hash(self.run.args)

    # -- the Scope interface (shared with workflows.WorkflowScope) -------------------
    @property
    def profile(self) -> str:
        return self.run.profile

    @property
    def root(self) -> LiveRun:
        return self

    @property
    def default_phase(self) -> str:
        """Where the root script's agents go before any phase()."""
        return "main"

    def next_agent_number(self) -> int:
        self.agent_count += 1
        return self.agent_count

    def add_agent(self, rec: AgentRecord, phase_title: str | None = None) -> None:
        """An agent of the root script."""
        self.file_agent(rec, "", phase_title)

    def file_agent(self, rec: AgentRecord, path: str, phase_title: str | None = None) -> None:
        """Count an agent in the run and file it under its own phase (opts.phase) or its
        workflow's current one."""
        phase = self.phase_named(path, phase_title) if phase_title is not None else self.phase_for(path)
        phase["agents"].append(rec.n)
        rec.phase = phase["title"]
        self.agents[rec.n] = rec
        self.run.agents_total += 1

    def budget_view(self) -> JsonObject:
        return script_budget(self, self.usd, self.tokens)

    # -- stopping ------------------------------------------------------------------------
    def worktrees_all_refused(self) -> str | None:
        """Why the run failed when every worktree agent it asked for had no repository."""
        if self.no_repository and len(self.no_repository) == self.worktree_agents:
            return (f"every worktree agent of the run ({self.worktree_agents}) failed before it started: "
                    + self.no_repository[0].removeprefix("agent(): "))
        return None

    def note_stop(self, why: Stop, detail: str | None = None) -> None:
        """Why the run is ending; the first reason given stays."""
        if self.stopped is None:
            self.stopped, self.stop_detail = why, detail

    def stop(self, why: Stop, detail: str | None = None) -> None:
        """Stop the run: its scope (the runner, every agent) is cancelled."""
        self.note_stop(why, detail)
        self.scope.cancel()

    def fail(self, why: str) -> None:
        """A limit was hit: the run ends failed, with a message naming the limit."""
        self.stop(Stop.LIMIT, why)

    # -- change reporting ------------------------------------------------------------------
    def agent_changed(self, rec: AgentRecord, usage_only: bool = False) -> None:
        """An agent's state (or live usage) moved: viewers now; its record and phases.json
        on the run's flush (at once when it ended)."""
        row = rec.row()
        self.env.events.publish(self.run.id, "agent", {**row, "phase": rec.phase})
        if usage_only:
            return
        if rec.state == "running":
            self.running_now.add(rec.n)
        else:
            self.running_now.discard(rec.n)
        if rec.state in ENDED:
            self.ended_rows[rec.n] = row
        self.writes.agent(rec)
        if rec.state in ENDED:
            self.writes.urgent.set()
            self.env.observers.agent_ended(self.run, rec)
        elif rec.state == "running":
            self.env.observers.agent_started(self.run, rec)
        self.changed()

    def spend_changed(self) -> None:
        """Spend or reservations moved somewhere in the run: totals, and the once-per-run
        budget warning when spent + reserved crosses budgetWarnAt of the budget."""
        run = self.run
        spent, spent_tokens, reserved, _ = self.totals()
        run.spent_usd, run.spent_tokens = spent, spent_tokens
        self.writes.run_dirty = True
        if not self.warned and run.budget_usd > 0 and spent + reserved >= self.warn_at * run.budget_usd:
            self.warned = True
            self._budget_warning(spent, reserved)

    @property
    def warn_at(self) -> float:
        return self.run.budget_warn_at if self.run.budget_warn_at is not None else self.caller.budgetWarnAt

    def _budget_warning(self, spent: float, reserved: float) -> None:
        run = self.run
        self.record_log(f"budget warning: {money.usd(spent)} spent + {money.usd(reserved)} reserved of "
                        f"{money.usd(run.budget_usd)} (budgetWarnAt {self.warn_at:g})", "warning")
        self.env.events.publish(run.id, "budget-warning", {"spentUsd": round(spent, 6), "reservedUsd": round(reserved, 6),
                                                           "budgetUsd": run.budget_usd})
        self.env.outbox.add(run.caller, notices.build_budget_warning(run, spent, reserved, run.budget_usd,
                                                                     self.env.links.run(run.id)))

    def changed(self) -> None:
        """The run's row moved: viewers now, run.json on the flush."""
        publish_row(self.env, self.run, self)
        self.writes.run_dirty = True

    def record_log(self, message: str, level: str = "info") -> None:
        """A log line: to viewers now, to log.jsonl on the flush (or at once once the run
        has ended: no flush is left to write it)."""
        entry = self.env.store.log_entry(self.env.redact(message), level)
        if not self.finished.is_set():
            self.writes.log.append(entry)
        else:
            try:
                self.env.store.append_log_lines(self.run, [entry])
            except OSError as e:
                log.error("run %s: could not write a log line: %s", self.run.id, e)
        self.env.events.publish(self.run.id, "log", entry)

    async def journal_append(self, entry: JsonObject) -> None:
        """A finished agent's journal line, fsync'd off the event loop before agent() answers.
        A full disk keeps it in memory (the agent's paid result is not lost: it is written
        when space returns, and resume waits for it) and the answer goes to the script."""
        assert self.journal is not None
        journal = self.journal
        self.journal_waiting.append(entry)
        async with self.journal_lock:
            if not any(e is entry for e in self.journal_waiting):
                return          # a group commit made while this waited for the lock wrote it
            batch, self.journal_waiting = self.journal_waiting, []
            try:
                await trio.to_thread.run_sync(journal.append_many, batch)
            except OSError as e:
                fault = fsutil.disk_fault(e)
                if fault is None:
                    raise
                self.env.deferred.journal_refused(self.run.id, journal, fault)

    # -- phases: one group per (workflow path, title), as Claude Code groups them --------
    def declare_phases(self) -> None:
        """The lanes a script's meta.phases declares, there before any agent starts."""
        for p in (self.meta.phases if self.meta is not None else ()):
            group = self.phase_named("", p.title)
            if p.detail:
                group["detail"] = p.detail

    def phase_named(self, path: str, title: str) -> JsonObject:
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

    def phase_for(self, path: str) -> JsonObject:
        """A workflow's current phase; agents started before any phase() go to an implicit
        one ('main' for the root script, the workflow's label for a nested one)."""
        i = self.current_phase.get(path)
        if i is not None:
            return self.phases[i]
        scope = self.scopes.get(path)
        title = self.default_phase if not path else (scope.default_phase if scope is not None else f"workflow {path}")
        return self.phase_named(path, title)

    def phases_view(self) -> list[JsonObject]:
        ended = self.ended_rows
        return [{"title": p["title"], "workflow": p.get("workflow", ""),
                 "agents": [ended[n] if n in ended else self.agents[n].row() for n in p["agents"] if n in self.agents]}
                for p in self.phases]

    # -- totals ------------------------------------------------------------------------------
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


def script_budget(live: LiveRun, usd: BudgetGate, tokens: BudgetGate) -> JsonObject:
    """What a script's `budget` shows (sandbox/context/hooks.mjs): Claude Code's token target
    and output tokens spent (shared by the whole run, nested workflows too), the run's agent
    count and cap (parallel() and pipeline() check them before they start anything), and
    SwarmBase's USD and codex token ledgers of this scope."""
    return {"usd": usd.ledger.view(), "codex": tokens.ledger.view(), "target": live.run.token_target,
            "outputTokens": live.output_tokens, "agents": live.agent_count, "maxAgents": live.max_agents}


def summary(run: Run, live: LiveRun | None, url: str) -> JsonObject:
    """A run's row (status and list tools, the dashboard): its record, what a live run holds
    reserved and has running, its link."""
    out = run.summary()
    if live is not None:
        out["reservedUsd"] = round(live.usd.ledger.reserved, 6)
        out["reservedTokens"] = int(live.tokens.ledger.reserved)
        out["agents"]["running"] = live.running
    else:
        out["reservedUsd"], out["reservedTokens"] = 0.0, 0
        out["agents"]["running"] = 0
    out["url"] = url
    return out


def publish_row(env: RunEnv, run: Run, live: LiveRun | None) -> None:
    """A run's row to its viewers and to the run list."""
    row = {**summary(run, live, env.links.run(run.id)), "caller": run.caller, "createdAtEpoch": run.created_at,
           "endedAtEpoch": run.ended_at}
    env.events.publish(run.id, "run", row)
    env.events.publish_list(row)
