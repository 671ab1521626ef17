"""What a script's hooks do on the daemon side (the runner bridge's ScriptHost), for the
root script and for each nested workflow: agent() goes to the agent service, workflow()
to a child scope with its own runner, phase() and log() to the run's records. A host is
given its scope, the agent service and the runners, and nothing else."""

from __future__ import annotations

import logging

import attrs

from .. import money
from ..jsonvalue import Json, JsonObject
from ..script.bridge import MAX_LOG_CHARS
from ..script.host import AgentCallError, Answered, Attached, ScriptOutcome
from . import workflows
from .agent_service import AgentService, Ticket
from .records import redact_value
from .runners import Runners
from .scope import Scope
from .workflows import WorkflowCall, WorkflowError, WorkflowScope

log = logging.getLogger("swarmbase.workflows")


@attrs.frozen
class Refused:
    """A workflow() call refused in call order; it throws when the call is answered."""
    error: str


class ScriptHost:
    def __init__(self, scope: Scope, agents: AgentService, runners: Runners) -> None:
        self.scope = scope               # the root LiveRun, or a WorkflowScope
        self.live = scope.root
        self.env = self.live.env
        self.agents = agents
        self.runners = runners

    def attach(self, bridge: Attached) -> None:
        self.scope.bridge = bridge

    # -- agent() ------------------------------------------------------------------
    def agent_begin(self, prompt: str, opts: JsonObject) -> Ticket | Answered:
        ticket = self.agents.begin(self.scope, prompt, opts)
        replayed = self.agents.replay_now(self.scope, prompt, opts, ticket)
        return Answered(replayed.value) if replayed is not None else ticket

    async def agent(self, prompt: str, opts: JsonObject, ticket: object) -> Json:
        if not isinstance(ticket, Ticket):      # the bridge hands back what agent_begin gave
            raise AgentCallError("agent(): invalid call")
        return await self.agents.call(self.scope, prompt, opts, ticket)

    def calls_cancelled(self, tickets: list[Json], reason: str) -> None:
        for t in tickets:
            if isinstance(t, WorkflowCall):     # its agents end "cancelled: <reason>" too
                self.live.cancelled_workflows[t.path] = reason
        self.agents.calls_cancelled(self.live, [t for t in tickets if isinstance(t, Ticket)], reason)

    # -- workflow() ------------------------------------------------------------------
    def workflow_begin(self, source: Json, args: Json, opts: JsonObject) -> WorkflowCall | Refused:
        cfg = self.env.cfg
        try:
            call = workflows.resolve(self.scope, source, args, opts, cfg.state_dir, cfg.maxWorkflowDepth,
                                     cfg.maxWorkflowsPerRun, self.live.workflows_total)
        except WorkflowError as e:
            return Refused(str(e))
        self.live.workflows_total += 1
        # On resume a workflow runs again (a runner starts) and its finished agents replay
        # from the journal, so the resumed run shows every agent of the tree.
        return call

    async def workflow(self, source: Json, args: Json, opts: JsonObject, ticket: object) -> Json:
        if not isinstance(ticket, (WorkflowCall, Refused)):
            ticket = self.workflow_begin(source, args, opts)
        if isinstance(ticket, Refused):
            raise AgentCallError(ticket.error)
        return await self._run_workflow(ticket)

    async def _run_workflow(self, call: WorkflowCall) -> Json:
        """Run a nested workflow to its end in its own runner; its value, or AgentCallError."""
        parent, live, env = self.scope, self.live, self.env
        run = live.run
        try:
            usd, tokens, got_usd, got_tokens = await workflows.slice_budget(parent, call)
        except WorkflowError as e:
            raise AgentCallError(str(e)) from None
        child = WorkflowScope(live, parent, call, usd, tokens)
        live.scopes[call.path] = child
        live.record_log(f"workflow {call.label} ({call.path}) started"
                        + (f" with {money.usd(call.budget_usd)}" if call.budget_usd is not None else ""))
        env.events.publish(run.id, "workflow", {"path": call.path, "label": call.label, "state": "running"})
        env.observers.workflow_started(run, call.path, call.label)
        outcome: ScriptOutcome | None = None
        try:
            outcome = await self.runners.run(ScriptHost(child, self.agents, self.runners), call.source, call.args,
                                             key=f"{run.id}-wf{call.path.replace('/', '.')}", run_id=run.id,
                                             workflow=call.path)
        finally:
            if got_usd:
                parent.usd.settle(got_usd, child.usd.ledger.spent)
            if got_tokens:
                parent.tokens.settle(got_tokens, child.tokens.ledger.spent)
            del live.scopes[call.path]
            live.spend_changed()
            ok = outcome is not None and outcome.ok
            env.events.publish(run.id, "workflow", {"path": call.path, "label": call.label,
                                                    "state": "done" if ok else "failed"})
            env.observers.workflow_ended(run, call.path, ok)
        if outcome.ok:
            value = redact_value(env.redact, outcome.value)
            await live.journal_append({"key": call.key, "kind": "workflow", "path": call.path, "label": call.label,
                                       "ok": True, "result": value})
            live.record_log(f"workflow {call.label} ({call.path}) returned")
            return value
        where = f" (its script line {outcome.line})" if outcome.line else ""
        message = f"workflow {call.label} ({call.path}) failed{where}: {env.redact(outcome.error or 'no reason')}"
        live.record_log(message, "warning")
        raise AgentCallError(message)

    # -- phase() and log() ------------------------------------------------------------
    def phase(self, title: str) -> None:
        """Agents started after it are filed under this title (one group per title, as in
        Claude Code: phase('A') again goes back to group A)."""
        live, cfg = self.live, self.env.cfg
        path = self.scope.workflow_path
        known = any(p["title"] == title and p.get("workflow", "") == path for p in live.phases)
        if not known and len(live.phases) >= cfg.maxPhasesPerRun:
            live.fail(f"the script made more than {cfg.maxPhasesPerRun} phases "
                      f"(maxPhasesPerRun in the daemon config lifts it)")
            return
        live.enter_phase(path, title)
        self.env.events.publish(live.run.id, "phase", {"title": title, "workflow": path})
        self.env.observers.phase(live.run, title, path)
        self._log(f"phase: {title}" if not path else f"[{path}] phase: {title}")

    def log(self, message: str) -> None:
        path = self.scope.workflow_path
        self._log(message if not path else f"[{path}] {message}")

    def _log(self, message: str) -> None:
        live, cfg = self.live, self.env.cfg
        live.log_bytes += len(message) + 60
        if live.log_bytes > cfg.maxLogBytesPerRun:
            live.fail(f"the script logged more than {cfg.maxLogBytesPerRun:,} bytes (maxLogBytesPerRun)")
            return
        live.record_log(message[:MAX_LOG_CHARS])

    def budget_view(self) -> JsonObject:
        return self.scope.budget_view()
