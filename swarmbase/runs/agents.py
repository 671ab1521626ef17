"""agent(): caps, fairness, budget, one CLI process per call, records — the daemon's
AgentService (agent_service.py).

Order of waits, and why: an agent first takes one of its run's slots (perRunConcurrency,
granted in call order), then reserves budget (first-in first-out; shown as the state
`waiting-budget` while it waits), then takes a daemon-wide slot (maxConcurrentAgents,
FIFO). A run therefore never has more than perRunConcurrency agents queued for the global
slots, so one run with hundreds of agents cannot starve another.

However an agent ends (done, failed, skipped, cancelled, timed out), its process (and with
the sandbox, its whole PID namespace) is killed, its reservation settled from what it
reported or streamed (nothing streamed: $0), and its record written. Its process itself is
agent_launch.py's; what each engine can do (token budget, schema) is asked of the engine.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Sequence

import attrs
import trio

from ..config import Config
from ..engines.base import Engine, LiveUsage, SchemaRefused
from ..engines.verdict import Verdict
from ..jsonvalue import Json, JsonObject
from ..launch.spec import Placements
from ..script.bridge import AgentCallError
from . import answers, records, worktrees
from .agent_launch import AgentLauncher, Launch
from .agent_opts import AgentOptions, NoRepository, OptionError, resolve
from .agent_service import Replayed, Ticket
from .budget import BudgetSpent, default_max_usd
from .ending import agent_stopped_with_run
from .env import RunEnv
from .git_sandbox import SandboxedGit
from .live import LiveRun
from .records import AgentRecord, redact_value
from .scope import Scope

log = logging.getLogger("swarmbase.agents")


def is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return False


class Agents:
    def __init__(self, env: RunEnv, engines: Mapping[str, Engine], launchers: Placements) -> None:
        self.env = env
        self.engines = dict(engines)
        self.launchers = launchers                 # by placement; "local" also opens processes
        self.global_slots = trio.Semaphore(env.cfg.maxConcurrentAgents)
        self.git = SandboxedGit(launchers.local)  # worktrees' git: untrusted work, in the sandbox
        self.launch = AgentLauncher(env, self.engines, launchers.local, self.git)

    @property
    def cfg(self) -> Config:
        return self.env.cfg              # read each time: a reload swaps it (live_reload.py)

    @property
    def spawned(self) -> int:
        """Processes started on this machine since boot (for benches and tests)."""
        return self.launchers.local.spawned

    # -- in call order (the ScriptHost side) -----------------------------------------------
    def begin(self, scope: Scope, prompt: str, opts: JsonObject) -> Ticket:
        """In call order: the agent's number, its resolved options and its journal key."""
        live = scope.root
        n = live.next_agent_number()
        path = scope.workflow_path
        phase = opts.get("phase") if isinstance(opts.get("phase"), str) else live.current_phase_title(path)
        if opts.get("isolation") == "worktree":
            live.worktree_agents += 1
        try:
            o = resolve(prompt, opts, live.run, live.caller, self.cfg, n, self.cfg.agentTimeoutMs, self.engines,
                        profile=scope.profile, phase_model=live.phase_model(path, phase),
                        project_types=live.project_agents)
        except NoRepository as e:
            live.no_repository.append(str(e))
            return Ticket(n=n, error=str(e))
        except OptionError as e:
            return Ticket(n=n, error=str(e))
        except (ValueError, TypeError, RecursionError) as e:   # hostile shapes: never take the run down
            return Ticket(n=n, error=f"agent(): invalid options ({type(e).__name__})")
        if o.ignored:
            # Claude Code's runtime ignores options it does not know; so do we, saying so once.
            live.record_log(f"agent {n} ({o.label}): ignored option{'s' if len(o.ignored) > 1 else ''} "
                            f"{', '.join(o.ignored)}: SwarmBase does not know "
                            f"{'them' if len(o.ignored) > 1 else 'it'}", "warn")
        for note in o.type_notes:
            live.record_log(f"agent {n} ({o.label}): {note}", "warn")
        key = scope.keys.key(o.key_material(prompt, scope.args_digest, workflow=path or None))
        if key not in live.replay and n <= self.cfg.maxAgentsPerRun:
            live.slots.register(n)
        return Ticket(n=n, key=key, opts=o)

    def replay_now(self, scope: Scope, prompt: str, opts: JsonObject, ticket: Ticket) -> Replayed | None:
        """In call order, for the bridge: a journaled success is answered at once."""
        t = ticket
        if t.error is None and t.opts is not None and t.key is not None and t.n <= self.cfg.maxAgentsPerRun:
            cached = scope.root.replay.get(t.key)
            if cached is not None:
                return Replayed(self._replay(scope, t.n, t.opts, prompt, opts, cached))
        return None

    def calls_cancelled(self, live: LiveRun, tickets: Sequence[Ticket], reason: str) -> None:
        """The script no longer wants these calls (a race or waitN was decided)."""
        for t in tickets:
            live.stop_reasons[t.n] = ("cancelled", f"cancelled: {reason}")
            scope = live.agent_scopes.get(t.n)
            if scope is not None:
                scope.cancel()
            else:
                live.slots.withdraw(t.n)

    def skip(self, live: LiveRun, n: int) -> bool:
        scope = live.agent_scopes.get(n)
        if scope is None:
            return False
        live.stop_reasons[n] = ("skipped", "skipped by an admin")
        scope.cancel()
        return True

    # -- the call --------------------------------------------------------------------------
    async def call(self, scope: Scope, prompt: str, opts: JsonObject, ticket: Ticket) -> Json:
        live, t = scope.root, ticket
        if t.n > self.cfg.maxAgentsPerRun:
            raise AgentCallError(f"agent(): this run reached its cap of {self.cfg.maxAgentsPerRun} agents "
                                 f"(maxAgentsPerRun in the daemon config lifts it)", kind="cap")
        if t.error is not None or t.opts is None or t.key is None:
            raise AgentCallError(t.error or "agent(): invalid call")
        o = t.opts
        cached = live.replay.get(t.key)
        if cached is not None:
            return self._replay(scope, t.n, o, prompt, opts, cached)
        target, spent = live.run.token_target, live.output_tokens
        if target is not None and spent >= target:
            # Claude Code's token target: checked before each dispatch, no reservation.
            live.slots.withdraw(t.n)
            raise AgentCallError(f"agent(): the run's token target is spent ({spent:,} of {target:,} output "
                                 f"tokens; the run's tokenTarget lifts it)", kind="budget")
        if live.replay and scope.bridge is not None:
            # A resumed run: let the runner act on every replayed answer first (a replayed
            # race winner cancels its losers) before this agent may spawn anything.
            await scope.bridge.settle()
            if t.n in live.stop_reasons:
                live.slots.withdraw(t.n)
                return None
        try:
            if o.isolation == "worktree":
                try:
                    work = await trio.to_thread.run_sync(os.path.realpath, self.env.store.work_dir(live.run))
                    await worktrees.repository(o.cwd or work, git=self.git,
                                               roots=tuple(live.caller.cwdRoots) if o.cwd else (work,))
                except worktrees.WorktreeError as e:
                    raise AgentCallError(str(e)) from None
            if o.schema is not None:
                try:
                    o = attrs.evolve(o, schema=self.engines[o.engine].prepare_schema(o.schema))
                except SchemaRefused as e:
                    raise AgentCallError(str(e)) from None
        except AgentCallError:
            live.slots.withdraw(t.n)
            raise
        return await self._run_agent(scope, t, o, prompt, opts)

    # -- one agent -------------------------------------------------------------------
    async def _run_agent(self, scope: Scope, t: Ticket, o: AgentOptions, prompt: str, opts: JsonObject) -> Json:
        live = scope.root
        run, redact = live.run, self.env.redact
        rec = AgentRecord(n=t.n, dir=self.env.store.dir(run) / "agents" / str(t.n), label=o.label, engine=o.engine,
                          model=o.model, profile=o.profile, workflow=scope.workflow_path)
        rec.set_state("queued")
        scope.add_agent(rec, o.phase)             # filed under opts.phase, else the script's current phase
        # Its files in a worker thread (a burst of agents made hundreds of files on the
        # loop), shielded: they exist before anything can end the agent and write its record.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.env.store.create_agent, rec, prompt, {**opts, "resolved": {
                "engine": o.engine, "model": o.model, "effort": o.effort, "profile": o.profile, "cwd": o.cwd,
                "timeoutMs": o.timeout_ms, "maxUsd": o.max_usd, "placement": o.placement,
                **({"agentType": o.agent_type} if o.agent_type else {})}})
        live.agent_changed(rec)

        cancel = trio.CancelScope()
        live.agent_scopes[t.n] = cancel
        reserved, reserved_tokens = 0.0, 0
        verdict: Verdict | None = None
        usage = LiveUsage()
        rec.usage = usage
        try:
            with cancel:
                if t.n in live.stop_reasons:          # cancelled before it could start
                    cancel.cancel()
                launcher = self.launchers.get(o.placement)
                if launcher is None:
                    raise AgentCallError(f"agent(): placement {o.placement!r} is not available on this daemon")
                await live.slots.acquire(t.n)
                holding_global = False
                try:
                    async with live.slots.doorway(t.n):
                        reserved, reserved_tokens = await self._reserve(scope, rec, o)
                        await self.global_slots.acquire()
                        holding_global = True
                        # Running, or waiting for a node (Ray) until the CLI starts there.
                        rec.set_state(launcher.initial_state)
                        live.agent_changed(rec)
                    verdict = await self.launch.run(live, Launch(rec=rec, o=o, prompt=prompt, reserved=reserved,
                                                                 reserved_tokens=reserved_tokens, usage=usage,
                                                                 launcher=launcher))
                finally:
                    if holding_global:
                        self.global_slots.release()
                    live.slots.release()
        except BaseException as exc:
            # Run cancel or shutdown (Cancelled, often grouped by nurseries) or a daemon
            # bug: either way the agent is over; charge it and say so, then re-raise.
            with trio.CancelScope(shield=True):
                if rec.state not in records.ENDED:
                    self._settle(scope, rec, reserved, reserved_tokens, verdict, usage)
                    stop = live.stop_reasons.get(t.n) or answers.workflow_stop(live.cancelled_workflows, rec.workflow)
                    if isinstance(exc, AgentCallError):
                        self._end(live, rec, "failed", error=str(exc))
                    elif stop is not None and is_cancellation(exc):
                        self._end(live, rec, stop[0], error=stop[1])
                    elif is_cancellation(exc):       # stopped with its run: it never finished
                        self._end(live, rec, "cancelled", error=agent_stopped_with_run(live.stopped), finished=False)
                    else:
                        log.exception("agent %s/%d crashed", run.id, t.n)
                        self._end(live, rec, "failed", error=redact(f"internal error: {exc!r}"))
                    await self._journal(live, t.key, rec, None)
            raise
        finally:
            live.agent_scopes.pop(t.n, None)
            live.slots.withdraw(t.n)
        self._settle(scope, rec, reserved, reserved_tokens, verdict, usage)
        if cancel.cancelled_caught:
            state, error = live.stop_reasons.get(t.n, ("skipped", "skipped by an admin"))
            self._end(live, rec, state, error=error)
            await self._journal(live, t.key, rec, None)
            return answers.answer(o.detail, rec, redact, None, verdict)
        assert verdict is not None
        if verdict.ok:
            value = redact_value(redact, verdict.value)
            self._end(live, rec, "done")
            await self._journal(live, t.key, rec, value)
            return answers.answer(o.detail, rec, redact, value, verdict)
        self._end(live, rec, "failed", error=redact(verdict.error or "failed"))
        await self._journal(live, t.key, rec, None)
        if verdict.schema_error and not o.detail:
            # Claude Code's agent({schema}) throws when no valid structured output came back.
            raise AgentCallError(f"agent({{schema}}): agent {t.n} returned no valid structured output: "
                                 f"{redact(verdict.schema_error)}")
        return answers.answer(o.detail, rec, redact, None, verdict)

    async def _reserve(self, scope: Scope, rec: AgentRecord, o: AgentOptions) -> tuple[float, int]:
        live = scope.root
        run = live.run
        # The default cap is the run's share per slot, so a script that never sets maxUsd can
        # have perRunConcurrency agents at once; a smaller maxUsd fits more.
        cap = o.max_usd if o.max_usd is not None else default_max_usd(run.budget_usd, self.cfg.perRunConcurrency)
        reserved, tokens = 0.0, 0
        try:
            got = scope.usd.try_now(cap)
            if got is None:
                rec.set_state("waiting-budget")
                live.agent_changed(rec)
                got = await scope.usd.reserve(cap)
            reserved = got
            live.spend_changed()
            wanted = self.engines[o.engine].token_budget(o.max_tokens)
            if wanted is not None:              # an engine that keeps a token budget
                tokens = int(await scope.tokens.reserve(wanted))
        except BudgetSpent as e:
            if reserved:                 # the USD part was held: give it back
                scope.usd.settle(reserved, 0.0)
            self._end(live, rec, "failed", error=str(e))
            raise AgentCallError(f"agent(): {e}", kind="budget") from None
        except BaseException:
            if reserved:
                scope.usd.settle(reserved, 0.0)
            raise
        if rec.state != "queued":
            rec.set_state("queued")      # budget held; waiting for a daemon-wide slot
            live.agent_changed(rec)
        return reserved, tokens

    # -- replay, settling and recording --------------------------------------------------
    def _replay(self, scope: Scope, n: int, o: AgentOptions, prompt: str, opts: JsonObject,
                cached: JsonObject) -> Json:
        """A journaled success: no process, no spend; recorded and shown as replayed."""
        live = scope.root
        rec = AgentRecord(n=n, dir=self.env.store.dir(live.run) / "agents" / str(n), label=o.label,
                          engine=o.engine, model=o.model, profile=o.profile, replayed=True,
                          workflow=scope.workflow_path, original_duration_s=cached.get("durationS"),
                          branch=cached.get("worktree"))
        rec.set_state("queued")
        live.writes.replayed_inputs(rec, prompt, {**opts, "replayedFrom": live.run.resumed_from})
        scope.add_agent(rec, o.phase)
        rec.started_at = rec.queued_at
        rec.set_state("done", replayed=True, originalCostUsd=cached.get("costUsd"))
        live.run.agents_done += 1
        live.agent_changed(rec)
        return answers.replayed(o.detail, n, cached.get("result"), cached.get("worktree"))

    async def _journal(self, live: LiveRun, key: str | None, rec: AgentRecord, value: Json) -> None:
        """Shielded: a result the script was about to get is journaled even if the run is
        being cancelled right now (a resume then replays it)."""
        if live.journal is None or key is None:
            return
        with trio.CancelScope(shield=True):
            await live.journal_append({
                # runId: boot finishes from this line an agent whose final record a kill cut off
                # (carried lines of a resumed run keep their own run's id).
                "key": key, "runId": live.run.id, "n": rec.n, "label": rec.label, "ok": rec.state == "done",
                "state": rec.state,
                "result": value, "engine": rec.engine, "model": rec.model, "costUsd": round(rec.cost_usd, 6),
                "estimated": rec.cost_estimated, "tokens": rec.tokens.to_json(), "durationS": rec.duration_s,
                "workflow": rec.workflow, **({"worktree": rec.branch} if rec.branch else {})})

    def _settle(self, scope: Scope, rec: AgentRecord, reserved: float, reserved_tokens: int,
                verdict: Verdict | None, usage: LiveUsage) -> None:
        live = scope.root
        if rec.started_at is None:
            if reserved:
                scope.usd.settle(reserved, 0.0)   # never started: nothing used
            if reserved_tokens:
                scope.tokens.settle(reserved_tokens, 0)
            return
        tokens, cost, estimated = answers.charge(verdict, usage)
        rec.cost_usd, rec.cost_estimated, rec.tokens = cost, estimated, tokens
        rec.priced = usage.priced
        scope.usd.settle(reserved, cost)
        live.output_tokens += tokens.output
        if reserved_tokens:                       # its engine keeps a token budget
            scope.tokens.settle(reserved_tokens, tokens.total)
        live.run.spent_estimated = live.run.spent_estimated or estimated
        live.spend_changed()

    def _end(self, live: LiveRun, rec: AgentRecord, state: str, error: str | None = None,
             finished: bool = True) -> None:
        """`finished`: the agent ended by itself (done, failed, skipped, a decided race), so
        it counts in agentsDone; one stopped with its run (cancel, shutdown, timeout) does not."""
        rec.error = error
        rec.set_state(state, **({"error": error} if error else {}))
        rec.usage = None
        if finished:
            live.run.agents_done += 1
        live.agent_changed(rec)
