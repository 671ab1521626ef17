"""What a script's hooks do on the daemon side (the runner bridge's ScriptHost), for the
root script and for each nested workflow, and starting a script's runner through the
launcher: sandboxed, no network, a memory and a CPU limit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

import attrs

from ..launch.spec import LaunchSpec
from .. import money
from ..script.runner import MAX_LOG_CHARS, AgentCallError, Answered, ScriptOutcome, run_script, runner_spec
from . import workflows
from .records import redact_value
from .workflows import WorkflowCall, WorkflowError, WorkflowScope

if TYPE_CHECKING:
    from .live import LiveRun
    from .supervisor import Supervisor

log = logging.getLogger("swarmbase.workflows")


@attrs.frozen
class Refused:
    """A workflow() call refused in call order; it throws when the call is answered."""
    error: str


class ScriptHost:
    def __init__(self, sup: "Supervisor", scope: Any) -> None:
        self.sup = sup
        self.scope = scope               # the root LiveRun, or a WorkflowScope
        self.live: "LiveRun" = scope.root

    def attach(self, bridge: Any) -> None:
        self.scope.bridge = bridge

    # -- agent() ------------------------------------------------------------------
    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        agents = self.sup.agents
        begin = getattr(agents, "begin", None)
        if begin is None:
            return None
        ticket = begin(self.scope, prompt, opts)
        replay_now = getattr(agents, "replay_now", None)
        if replay_now is not None:
            done, value = replay_now(self.scope, prompt, opts, ticket)
            if done:
                return Answered(value)
        return ticket

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        return await self.sup.agents.call(self.scope, prompt, opts, ticket)

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        for t in tickets:
            if isinstance(t, WorkflowCall):     # its agents end "cancelled: <reason>" too
                self.live.cancelled_workflows[t.path] = reason
        cancel = getattr(self.sup.agents, "calls_cancelled", None)
        if cancel is not None:
            cancel(self.live, [t for t in tickets if not isinstance(t, (WorkflowCall, Refused))], reason)

    # -- workflow() ------------------------------------------------------------------
    def workflow_begin(self, source: Any, args: Any, opts: dict[str, Any]) -> Any:
        cfg = self.sup.cfg
        try:
            call = workflows.resolve(self.scope, source, args, opts, cfg.state_dir, cfg.maxWorkflowDepth,
                                     cfg.maxWorkflowsPerRun, self.live.workflows_total)
        except WorkflowError as e:
            return Refused(str(e))
        self.live.workflows_total += 1
        # On resume a workflow runs again (a runner starts) and its finished agents replay
        # from the journal, so the resumed run shows every agent of the tree.
        return call

    async def workflow(self, source: Any, args: Any, opts: dict[str, Any], ticket: Any = None) -> Any:
        if isinstance(ticket, Refused):
            raise AgentCallError(ticket.error)
        if not isinstance(ticket, WorkflowCall):
            ticket = self.workflow_begin(source, args, opts)
            if isinstance(ticket, Refused):
                raise AgentCallError(ticket.error)
        return await run_workflow(self.sup, self.scope, ticket)

    # -- phase() and log() ------------------------------------------------------------
    def phase(self, title: str) -> None:
        """Agents started after it are filed under this title (one group per title, as in
        Claude Code: phase('A') again goes back to group A)."""
        live, cfg = self.live, self.sup.cfg
        path = self.scope.workflow_path
        known = any(p["title"] == title and p.get("workflow", "") == path for p in live.phases)
        if not known and len(live.phases) >= cfg.maxPhasesPerRun:
            self.sup.fail_run(live, f"the script made more than {cfg.maxPhasesPerRun} phases "
                                    f"(maxPhasesPerRun in the daemon config lifts it)")
            return
        live.enter_phase(path, title)
        self.sup.events.publish(live.run.id, "phase", {"title": title, "workflow": path})
        self.sup.notify("phase", live.run, title, path)
        self._log(f"phase: {title}" if not path else f"[{path}] phase: {title}")

    def log(self, message: str) -> None:
        path = self.scope.workflow_path
        self._log(message if not path else f"[{path}] {message}")

    def _log(self, message: str) -> None:
        live, cfg = self.live, self.sup.cfg
        live.log_bytes += len(message) + 60
        if live.log_bytes > cfg.maxLogBytesPerRun:
            self.sup.fail_run(live, f"the script logged more than {cfg.maxLogBytesPerRun:,} bytes "
                                    f"(maxLogBytesPerRun)")
            return
        self.sup.record_log(live.run, message[:MAX_LOG_CHARS])

    def budget_view(self) -> dict[str, Any]:
        return self.scope.budget_view()


async def start_script(sup: "Supervisor", scope: Any, host: ScriptHost, source: str, args: Any,
                       key: str) -> ScriptOutcome:
    cfg = sup.cfg
    spec = runner_spec(key=key, memory_mb=cfg.runnerMemoryMb, cpu_seconds=cfg.runnerCpuSeconds,
                       record={"runId": scope.run.id, "runner": True, "workflow": scope.workflow_path})
    spare = sup.spares.take(spec.record) if sup.spares is not None and sup.runner_argv is None else None
    if spare is None:
        return await run_script(source, args, host, sup.limits, sup.runner_argv, launcher=sup.launcher, spec=spec)
    try:
        return await run_script(source, args, host, sup.limits, launcher=sup.launcher, spec=spec, opened=spare.use())
    finally:
        spare.released.set()      # let its keeper kill it even if the run never got to use it


def spare_spec(cfg: Any) -> Callable[[str], LaunchSpec]:
    """A spare runner's spec: the one start_script would build, with a spare's key and
    nothing of any run in it."""
    return lambda key: runner_spec(key=key, memory_mb=cfg.runnerMemoryMb, cpu_seconds=cfg.runnerCpuSeconds,
                                   record={"runner": True, "spare": True})


async def run_live_script(sup: "Supervisor", live: "LiveRun", host: ScriptHost) -> ScriptOutcome:
    return await start_script(sup, live, host, sup.store.script(live.run), live.run.args, f"{live.run.id}-runner")


async def run_workflow(sup: "Supervisor", parent: Any, call: WorkflowCall) -> Any:
    """Run a nested workflow to its end in its own runner; its value, or AgentCallError."""
    live = parent.root
    run = live.run
    try:
        usd, tokens, got_usd, got_tokens = await workflows.slice_budget(parent, call)
    except WorkflowError as e:
        raise AgentCallError(str(e)) from None
    child = WorkflowScope(live, parent, call, usd, tokens)
    live.scopes[call.path] = child
    sup.record_log(run, f"workflow {call.label} ({call.path}) started"
                        + (f" with {money.usd(call.budget_usd)}" if call.budget_usd is not None else ""))
    sup.events.publish(run.id, "workflow", {"path": call.path, "label": call.label, "state": "running"})
    sup.notify("workflow_started", run, call.path, call.label)
    outcome: ScriptOutcome | None = None
    try:
        outcome = await start_script(sup, child, ScriptHost(sup, child), call.source, call.args,
                                     f"{run.id}-wf{call.path.replace('/', '.')}")
    finally:
        if got_usd:
            parent.usd.settle(got_usd, child.usd.ledger.spent)
        if got_tokens:
            parent.tokens.settle(got_tokens, child.tokens.ledger.spent)
        del live.scopes[call.path]
        sup.spend_changed(parent)
        ok = outcome is not None and outcome.ok
        sup.events.publish(run.id, "workflow", {"path": call.path, "label": call.label,
                                                "state": "done" if ok else "failed"})
        sup.notify("workflow_ended", run, call.path, ok)
    if outcome.ok:
        value = redact_value(sup.redact, outcome.value)
        await sup.journal_append(live, {"key": call.key, "kind": "workflow", "path": call.path, "label": call.label,
                                        "ok": True, "result": value})
        sup.record_log(run, f"workflow {call.label} ({call.path}) returned")
        return value
    where = f" (its script line {outcome.line})" if outcome.line else ""
    message = f"workflow {call.label} ({call.path}) failed{where}: {sup.redact(outcome.error or 'no reason')}"
    sup.record_log(run, message, "warning")
    raise AgentCallError(message)

