"""agent(): caps, fairness, budget, one CLI process per call, records.

Order of waits, and why: an agent first takes one of its run's slots (perRunConcurrency,
granted in call order), then reserves budget (first-in first-out; shown as the state
`waiting-budget` while it waits), then takes a daemon-wide slot (maxConcurrentAgents,
FIFO). A run therefore never has more than perRunConcurrency agents queued for the global
slots, so one run with hundreds of agents cannot starve another.

However an agent ends (done, failed, skipped, cancelled, timed out), its process (and with
the sandbox, its whole PID namespace) is killed, its reservation settled from what it
reported or streamed (nothing streamed: $0), and its record written.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import attrs
import trio

from .. import fsutil
from ..config import Config, key_file_problem
from ..engines.base import AgentIO, AgentJob, Engine, LiveUsage
from ..engines.strict_schema import StrictSchemaError, strict
from ..engines.verdict import Verdict
from ..script.runner import AgentCallError
from . import answers, nudge, records, worktrees
from .git_sandbox import SandboxedGit
from .agent_opts import AgentOptions, OptionError, resolve
from .budget import MIN_USD, BudgetSpent, default_max_usd
from .model import iso
from .records import AgentRecord, Transcript, redact_value

if TYPE_CHECKING:
    from .live import LiveRun
    from .supervisor import Supervisor

log = logging.getLogger("swarmbase.agents")

LIVE_PUBLISH_S = 0.5       # a running agent's usage reaches viewers at most this often


def is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return False


@attrs.frozen
class Ticket:
    """What agent_begin decided in call order: the number, the key, the options (or why not)."""
    n: int
    key: str | None = None
    opts: AgentOptions | None = None
    error: str | None = None


class Agents:
    def __init__(self, cfg: Config, sup: "Supervisor", engines: Mapping[str, Engine], launcher: Any) -> None:
        self.cfg = cfg
        self.sup = sup
        self.engines = dict(engines)
        self.launcher = launcher
        self.launchers: dict[str, Any] = {"local": launcher}    # by placement; the daemon adds "ray"
        self.global_slots = trio.Semaphore(cfg.maxConcurrentAgents)
        self.git = SandboxedGit(launcher)          # worktrees' git: untrusted work, in the sandbox

    @property
    def spawned(self) -> int:
        """Processes started since boot (for benches and tests)."""
        return int(getattr(self.launcher, "spawned", 0))

    # -- the ScriptHost side -------------------------------------------------------
    def begin(self, live: "LiveRun", prompt: str, opts: dict[str, Any]) -> Ticket:
        """In call order: the agent's number, its resolved options and its journal key."""
        n = live.next_agent_number()
        path = live.workflow_path
        phase = opts.get("phase") if isinstance(opts.get("phase"), str) else live.root.current_phase_title(path)
        try:
            o = resolve(prompt, opts, live.run, live.caller, self.cfg, n, self.cfg.agentTimeoutMs, profile=live.profile,
                        phase_model=live.root.phase_model(path, phase))
        except OptionError as e:
            return Ticket(n=n, error=str(e))
        except (ValueError, TypeError, RecursionError) as e:   # hostile shapes: never take the run down
            return Ticket(n=n, error=f"agent(): invalid options ({type(e).__name__})")
        key = live.keys.key(o.key_material(prompt, live.args_digest, workflow=live.workflow_path or None))
        if key not in live.replay and n <= self.cfg.maxAgentsPerRun:
            live.slots.register(n)
        return Ticket(n=n, key=key, opts=o)

    async def call(self, live: "LiveRun", prompt: str, opts: dict[str, Any], ticket: Ticket | None = None) -> Any:
        t = ticket if ticket is not None else self.begin(live, prompt, opts)
        if t.n > self.cfg.maxAgentsPerRun:
            raise AgentCallError(f"agent(): this run reached its cap of {self.cfg.maxAgentsPerRun} agents "
                                 f"(maxAgentsPerRun in the daemon config lifts it)", kind="cap")
        if t.error is not None or t.opts is None or t.key is None:
            raise AgentCallError(t.error or "agent(): invalid call")
        o = t.opts
        cached = live.replay.get(t.key)
        if cached is not None:
            return self._replay(live, t.n, o, prompt, opts, cached)
        target, spent = live.run.token_target, live.root.output_tokens
        if target is not None and spent >= target:
            # Claude Code's token target: checked before each dispatch, no reservation.
            live.slots.withdraw(t.n)
            raise AgentCallError(f"agent(): the run's token target is spent ({spent:,} of {target:,} output "
                                 f"tokens; the run's tokenTarget lifts it)", kind="budget")
        if live.replay and live.bridge is not None:
            # A resumed run: let the runner act on every replayed answer first (a replayed
            # race winner cancels its losers) before this agent may spawn anything.
            settle = getattr(live.bridge, "settle", None)
            if settle is not None:
                await settle()
            if t.n in live.stop_reasons:
                live.slots.withdraw(t.n)
                return None
        try:
            if o.isolation == "worktree":
                try:
                    work = os.path.realpath(self.sup.store.work_dir(live.run))
                    await worktrees.repository(o.cwd or work, git=self.git,
                                               roots=tuple(live.caller.cwdRoots) if o.cwd else (work,))
                except worktrees.WorktreeError as e:
                    raise AgentCallError(str(e)) from None
            if o.engine == "codex" and o.schema is not None:
                try:
                    o = attrs.evolve(o, schema=strict(o.schema))
                except StrictSchemaError as e:
                    raise AgentCallError(str(e)) from None
        except AgentCallError:
            live.slots.withdraw(t.n)
            raise
        return await self._run_agent(live, t, o, prompt, opts)

    def skip(self, live: "LiveRun", n: int) -> bool:
        scope = live.agent_scopes.get(n)
        if scope is None:
            return False
        live.stop_reasons[n] = ("skipped", "skipped by an admin")
        scope.cancel()
        return True

    def calls_cancelled(self, live: "LiveRun", tickets: list[Any], reason: str) -> None:
        """The script no longer wants these calls (a race or waitN was decided)."""
        for t in tickets:
            n = getattr(t, "n", None)
            if n is None:
                continue
            live.stop_reasons[n] = ("cancelled", f"cancelled: {reason}")
            scope = live.agent_scopes.get(n)
            if scope is not None:
                scope.cancel()
            else:
                live.slots.withdraw(n)

    # -- one agent -------------------------------------------------------------------
    async def _run_agent(self, live: "LiveRun", t: Ticket, o: AgentOptions, prompt: str, opts: dict[str, Any]) -> Any:
        run = live.run
        rec = AgentRecord(n=t.n, dir=self.sup.store.dir(run) / "agents" / str(t.n), label=o.label, engine=o.engine,
                          model=o.model, profile=o.profile, workflow=live.workflow_path)
        rec.set_state("queued")
        live.add_agent(rec, o.phase)              # filed under opts.phase, else the script's current phase
        # Its files in a worker thread (a burst of agents made hundreds of files on the
        # loop), shielded: they exist before anything can end the agent and write its record.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.sup.store.create_agent, rec, prompt, {**opts, "resolved": {
                "engine": o.engine, "model": o.model, "effort": o.effort, "profile": o.profile, "cwd": o.cwd,
                "timeoutMs": o.timeout_ms, "maxUsd": o.max_usd, "placement": o.placement,
                **({"agentType": o.agent_type} if o.agent_type else {})}})
        self.sup.agent_changed(live, rec)

        scope = trio.CancelScope()
        live.agent_scopes[t.n] = scope
        reserved, reserved_tokens = 0.0, 0
        verdict: Verdict | None = None
        usage = LiveUsage()
        rec.usage = usage
        try:
            with scope:
                if t.n in live.stop_reasons:          # cancelled before it could start
                    scope.cancel()
                launcher = self.launchers.get(o.placement)
                if launcher is None:
                    raise AgentCallError(f"agent(): placement {o.placement!r} is not available on this daemon")
                await live.slots.acquire(t.n)
                holding_global = False
                try:
                    async with live.slots.doorway(t.n):
                        reserved, reserved_tokens = await self._reserve(live, rec, o)
                        await self.global_slots.acquire()
                        holding_global = True
                        # Running, or waiting for a node (Ray) until the CLI starts there.
                        rec.set_state(getattr(launcher, "initial_state", "running"))
                        self.sup.agent_changed(live, rec)
                    verdict = await self._launch(live, rec, o, prompt, reserved, reserved_tokens, usage, launcher)
                finally:
                    if holding_global:
                        self.global_slots.release()
                    live.slots.release()
        except BaseException as exc:
            # Run cancel or shutdown (Cancelled, often grouped by nurseries) or a daemon
            # bug: either way the agent is over; charge it and say so, then re-raise.
            with trio.CancelScope(shield=True):
                if rec.state not in records.ENDED:
                    self._settle(live, rec, o, reserved, reserved_tokens, verdict, usage)
                    stop = live.stop_reasons.get(t.n) or answers.workflow_stop(live.root.cancelled_workflows, rec.workflow)
                    if isinstance(exc, AgentCallError):
                        self._end(live, rec, "failed", error=str(exc))
                    elif stop is not None and is_cancellation(exc):
                        self._end(live, rec, stop[0], error=stop[1])
                    elif is_cancellation(exc):       # stopped with its run: it never finished
                        self._end(live, rec, "cancelled", error=f"cancelled with the run ({live.stop_reason or 'cancel'})",
                                  finished=False)
                    else:
                        log.exception("agent %s/%d crashed", run.id, t.n)
                        self._end(live, rec, "failed", error=self.sup.redact(f"internal error: {exc!r}"))
                    await self._journal(live, t.key, rec, None)
            raise
        finally:
            live.agent_scopes.pop(t.n, None)
            live.slots.withdraw(t.n)
        self._settle(live, rec, o, reserved, reserved_tokens, verdict, usage)
        if scope.cancelled_caught:
            state, error = live.stop_reasons.get(t.n, ("skipped", "skipped by an admin"))
            self._end(live, rec, state, error=error)
            await self._journal(live, t.key, rec, None)
            return answers.answer(o.detail, rec, self.sup.redact, None, verdict)
        assert verdict is not None
        if verdict.ok:
            value = redact_value(self.sup.redact, verdict.value)
            self._end(live, rec, "done")
            await self._journal(live, t.key, rec, value)
            return answers.answer(o.detail, rec, self.sup.redact, value, verdict)
        self._end(live, rec, "failed", error=self.sup.redact(verdict.error or "failed"))
        await self._journal(live, t.key, rec, None)
        if verdict.schema_error and not o.detail:
            # Claude Code's agent({schema}) throws when no valid structured output came back.
            raise AgentCallError(f"agent({{schema}}): agent {t.n} returned no valid structured output: "
                                 f"{self.sup.redact(verdict.schema_error)}")
        return answers.answer(o.detail, rec, self.sup.redact, None, verdict)

    async def _reserve(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions) -> tuple[float, int]:
        run = live.run
        # The default cap is the run's share per slot, so a script that never sets maxUsd can
        # have perRunConcurrency agents at once; a smaller maxUsd fits more.
        cap = o.max_usd if o.max_usd is not None else default_max_usd(run.budget_usd, self.cfg.perRunConcurrency)
        reserved, tokens = 0.0, 0
        try:
            got = live.usd.try_now(cap)
            if got is None:
                rec.set_state("waiting-budget")
                self.sup.agent_changed(live, rec)
                got = await live.usd.reserve(cap)
            reserved = got
            self.sup.spend_changed(live)
            if o.engine == "codex":
                cx = self.cfg.engines.codex
                assert cx is not None
                tokens = int(await live.tokens.reserve(min(o.max_tokens or cx.maxTokensDefault, cx.maxTokensMax)))
        except BudgetSpent as e:
            if reserved:                 # the USD part was held: give it back
                live.usd.settle(reserved, 0.0)
            self._end(live, rec, "failed", error=str(e))
            raise AgentCallError(f"agent(): {e}", kind="budget") from None
        except BaseException:
            if reserved:
                live.usd.settle(reserved, 0.0)
            raise
        if rec.state != "queued":
            rec.set_state("queued")      # budget held; waiting for a daemon-wide slot
            self.sup.agent_changed(live, rec)
        return reserved, tokens

    async def _launch(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, prompt: str, reserved: float,
                      reserved_tokens: int, usage: LiveUsage, launcher: Any) -> Verdict:
        run = live.run
        api_key = self._read_key(live)
        # A caller's cwd is checked again at launch, under its roots; the run's work/ (and a
        # worktree) are the daemon's own, handed to the sandbox user.
        roots = tuple(live.caller.cwdRoots) if o.cwd else ()
        cwd = o.cwd or os.path.realpath(self.sup.store.work_dir(run))
        state_dirs: tuple[str, ...] = ()
        if not o.cwd:
            os.makedirs(cwd, exist_ok=True)
            self.launcher.adopt(cwd)
            state_dirs = (cwd,)
        caller_paths: tuple[str, ...] = (cwd,) if o.cwd else ()
        wt = None
        if o.isolation == "worktree":
            try:
                wt = await worktrees.create(cwd, self.sup.store.dir(run) / "worktrees", run.id, rec.n, o.base,
                                            git=self.git, roots=roots or state_dirs, keep=self.sup.keeps_work(run),
                                            adopt=self.launcher.adopt)
            except worktrees.WorktreeError as e:
                raise AgentCallError(str(e)) from None
            cwd = wt.cwd
            state_dirs += (wt.path,)
            caller_paths = (wt.common, wt.gitdir) if o.cwd else ()
        rec.cwd = cwd
        job = AgentJob(run_id=run.id, n=rec.n, label=rec.label, engine=o.engine, model=o.model, effort=o.effort,
                       profile=o.profile, schema=o.schema, prompt=prompt, cwd=cwd, api_key=api_key,
                       max_usd=reserved, max_tokens=reserved_tokens, caller_max_profile=live.caller.maxProfile,
                       timeout_ms=o.timeout_ms,
                       secret_files=tuple(p for p in [live.caller.apiKeyFile, str(self.cfg.path)] if p),
                       extra_read=(wt.common,) if wt else (), extra_write=(wt.path, wt.gitdir) if wt else (),
                       state_dirs=state_dirs, cwd_roots=roots, caller_paths=caller_paths,
                       network=tuple(live.caller.network))
        try:
            return await self._turns(live, rec, o, prompt, reserved, usage, job, launcher)
        finally:
            if wt is not None:
                with trio.CancelScope(shield=True):
                    try:
                        rec.branch = await worktrees.finish(wt, rec.n, rec.label, keep=self.sup.keeps_work(run),
                                                            git=self.git)
                    except worktrees.WorktreeError as e:
                        log.error("agent %s/%d: its worktree could not be committed: %s", run.id, rec.n, e)
                        rec.branch = {"branch": wt.branch, "commit": None, "error": str(e)}

    async def _turns(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, prompt: str, reserved: float,
                     usage: LiveUsage, job: AgentJob, launcher: Any) -> Verdict:
        """The agent's process, and the schema nudges that follow it."""
        run = live.run
        last = [0.0]

        def usage_changed() -> None:
            now = time.monotonic()
            if now - last[0] >= LIVE_PUBLISH_S:
                last[0] = now
                self.sup.agent_changed(live, rec, usage_only=True)

        def started(where: Mapping[str, Any]) -> None:
            rec.node = where.get("node") if isinstance(where.get("node"), str) else None
            if rec.state == "waiting-node":          # placed: the CLI runs on its node now
                rec.set_state("running", **({"node": rec.node} if rec.node else {}))
                self.sup.agent_changed(live, rec)

        publish_line = getattr(self.sup.events, "publish_agent_line", None)
        transcript = Transcript(rec.dir / "transcript.jsonl", self.sup.redact,
                                on_entry=(lambda entry: publish_line(run.id, rec.n, entry)) if publish_line else None)
        engine = self.engines[o.engine]
        done = LiveUsage()                       # what finished turns (schema nudges) used

        def turn_io() -> AgentIO:
            turn = LiveUsage()

            def changed() -> None:
                usage.tokens, usage.cost_usd = done.tokens + turn.tokens, done.cost_usd + turn.cost_usd
                usage.responses, usage.priced = done.responses + turn.responses, turn.priced
                usage_changed()
            return AgentIO(launcher=launcher, transcript=transcript.append, usage=turn,
                           usage_changed=changed, started=started)

        try:
            with trio.move_on_after(o.timeout_ms / 1000) as deadline:
                io = turn_io()
                verdict = total = await engine.run(job, io)
                attempt = 0
                while verdict.schema_error and attempt < o.schema_retries:
                    left = reserved - (total.cost_usd or 0.0)
                    if left < MIN_USD:
                        break
                    attempt += 1
                    done.tokens, done.cost_usd = total.tokens, total.cost_usd or 0.0
                    done.responses += max(io.usage.responses, 1)
                    transcript.append(json.dumps({"type": "swarmbase", "subtype": "schema-nudge", "attempt": attempt,
                                                  "schemaError": verdict.schema_error}).encode())
                    rec.history.append({"state": "running", "at": iso(time.time()), "schemaRetry": attempt,
                                        "schemaError": verdict.schema_error})
                    io = turn_io()
                    verdict = await engine.run(attrs.evolve(job, prompt=nudge.prompt(prompt, verdict, attempt),
                                                            max_usd=left), io)
                    total = nudge.add(total, verdict)
                verdict = total
        finally:
            # Its fsync in a worker thread: an fsync per agent on the loop stalled every
            # viewer and every other agent for its duration.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(transcript.close)
            if transcript.fault is not None:
                why = fsutil.describe_disk_fault(transcript.fault, self.cfg.state_dir)
                log.error("agent %s/%d: its transcript stops after %d lines: %s", run.id, rec.n, transcript.lines, why)
                rec.history.append({"state": rec.state, "at": iso(time.time()),
                                    "transcriptIncomplete": f"after {transcript.lines} lines: {why}"})
        rec.priced = usage.priced
        if deadline.cancelled_caught:
            return Verdict(ok=False, error=f"timed out after {o.timeout_ms} ms", cost_usd=answers.killed_cost(usage),
                           tokens=usage.tokens, tokens_exact=usage.responses == 0)
        rec.exit_code = verdict.exit_code
        return verdict

    def _read_key(self, live: "LiveRun") -> str:
        path = live.caller.apiKeyFile
        if not path:
            raise AgentCallError(f"agent(): caller {live.caller.name!r} has no apiKeyFile; the engine has no key")
        problem = key_file_problem(path)
        if problem is not None:
            raise AgentCallError(f"agent(): {problem}")
        try:
            key = Path(path).read_text().strip()
        except OSError as e:
            raise AgentCallError(f"agent(): cannot read the caller's apiKeyFile: {e.strerror}") from None
        if not key:
            raise AgentCallError(f"agent(): the caller's apiKeyFile {path} is empty")
        self.sup.redact.add(key)          # a rotated key is redacted from then on
        return key

    # -- replay, settling and recording --------------------------------------------------
    def replay_now(self, live: "LiveRun", prompt: str, opts: dict[str, Any], t: Ticket) -> tuple[bool, Any]:
        """In call order, for the bridge: a journaled success is answered at once."""
        if t.error is None and t.opts is not None and t.key is not None and t.n <= self.cfg.maxAgentsPerRun:
            cached = live.replay.get(t.key)
            if cached is not None:
                return True, self._replay(live, t.n, t.opts, prompt, opts, cached)
        return False, None

    def _replay(self, live: "LiveRun", n: int, o: AgentOptions, prompt: str, opts: dict[str, Any],
                cached: dict[str, Any]) -> Any:
        """A journaled success: no process, no spend; recorded and shown as replayed."""
        rec = AgentRecord(n=n, dir=self.sup.store.dir(live.run) / "agents" / str(n), label=o.label,
                          engine=o.engine, model=o.model, profile=o.profile, replayed=True,
                          workflow=live.workflow_path, original_duration_s=cached.get("durationS"),
                          branch=cached.get("worktree"))
        rec.set_state("queued")
        self.sup.store.create_agent(rec, prompt, {**opts, "replayedFrom": live.run.resumed_from})
        live.add_agent(rec, o.phase)
        rec.started_at = rec.queued_at
        rec.set_state("done", replayed=True, originalCostUsd=cached.get("costUsd"))
        live.run.agents_done += 1
        self.sup.agent_changed(live, rec)
        value = cached.get("result")
        return answers.replayed(o.detail, n, value, cached.get("worktree"))

    async def _journal(self, live: "LiveRun", key: str | None, rec: AgentRecord, value: Any) -> None:
        """Shielded: a result the script was about to get is journaled even if the run is
        being cancelled right now (a resume then replays it)."""
        if live.journal is None or key is None:
            return
        with trio.CancelScope(shield=True):
            await self._journal_line(live, key, rec, value)

    async def _journal_line(self, live: "LiveRun", key: str, rec: AgentRecord, value: Any) -> None:
        await self.sup.journal_append(live, {
            # runId: boot finishes from this line an agent whose final record a kill cut off
            # (carried lines of a resumed run keep their own run's id).
            "key": key, "runId": live.run.id, "n": rec.n, "label": rec.label, "ok": rec.state == "done",
            "state": rec.state,
            "result": value, "engine": rec.engine, "model": rec.model, "costUsd": round(rec.cost_usd, 6),
            "estimated": rec.cost_estimated, "tokens": rec.tokens.to_json(), "durationS": rec.duration_s,
            "workflow": rec.workflow, **({"worktree": rec.branch} if rec.branch else {})})

    def _settle(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, reserved: float, reserved_tokens: int,
                verdict: Verdict | None, usage: LiveUsage) -> None:
        if rec.started_at is None:
            if reserved:
                live.usd.settle(reserved, 0.0)   # never started: nothing used
            if reserved_tokens:
                live.tokens.settle(reserved_tokens, 0)
            return
        tokens, cost, estimated = answers.charge(verdict, usage)
        rec.cost_usd, rec.cost_estimated, rec.tokens = cost, estimated, tokens
        rec.priced = usage.priced
        live.usd.settle(reserved, cost)
        live.root.output_tokens += tokens.output
        if o.engine == "codex":
            live.tokens.settle(reserved_tokens, tokens.total)
        live.run.spent_estimated = live.run.spent_estimated or estimated
        self.sup.spend_changed(live)

    def _end(self, live: "LiveRun", rec: AgentRecord, state: str, error: str | None = None,
             finished: bool = True) -> None:
        """`finished`: the agent ended by itself (done, failed, skipped, a decided race), so
        it counts in agentsDone; one stopped with its run (cancel, shutdown, timeout) does not."""
        rec.error = error
        rec.set_state(state, **({"error": error} if error else {}))
        rec.usage = None
        if finished:
            live.run.agents_done += 1
        self.sup.agent_changed(live, rec)

