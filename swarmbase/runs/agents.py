"""agent(): caps, fairness, budget, one CLI process per call, records.

Order of waits, and why: an agent first takes one of its run's slots (perRunConcurrency,
FIFO), then reserves budget, then takes a daemon-wide slot (maxConcurrentAgents, FIFO).
A run therefore never has more than perRunConcurrency agents queued for the global
slots, so one run with hundreds of agents cannot starve another. Both semaphores wake
waiters in FIFO order (Trio's ParkingLot).

However an agent ends (done, failed, skipped, cancelled, timed out), its process group is
killed, its reservation settled (a missing cost is estimated from usage and marked so),
and its record written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

import attrs

from .. import prices
from ..config import Config
from ..engines import claude, codex, codex_run
from ..engines.strict_schema import StrictSchemaError, strict
from ..engines.verdict import Verdict
from ..engines.process import parse_json_line, run_cli
from ..prices import Tokens
from ..runner import AgentCallError
from . import journal, records
from .agent_opts import AgentOptions, OptionError, resolve
from .budget import BudgetSpent
from .records import AgentRecord, Transcript, redact_value

if TYPE_CHECKING:
    from .supervisor import LiveRun, Supervisor

SYSTEM_PROMPT_TOKENS = 10_000   # what a claude -p turn costs before the prompt, for estimates


def is_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(e) for e in exc.exceptions)
    return False


class Agents:
    def __init__(self, cfg: Config, sup: "Supervisor", meter: Any = None) -> None:
        self.cfg = cfg
        self.sup = sup
        self.meter = meter          # the codex engine's usage meter, when it runs
        self.global_slots = trio.Semaphore(cfg.maxConcurrentAgents)
        self.homes = cfg.state_dir / "homes"
        self.procs = cfg.state_dir / "procs"
        self.homes.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.procs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.spawned = 0            # processes started since boot (for benches and tests)

    # -- the AgentService interface ---------------------------------------------
    def begin(self, live: "LiveRun", prompt: str, opts: dict[str, Any]) -> tuple[int, str]:
        """In call order: the agent's number and its journal key."""
        live.agent_count += 1
        return live.agent_count, live.keys.key(self._base_key(live, prompt, opts))

    def _base_key(self, live: "LiveRun", prompt: str, opts: dict[str, Any]) -> str:
        run, caller = live.run, live.caller
        engine = opts.get("engine", "claude")
        model = opts.get("model")
        if model is None:
            model = (run.model or caller.defaultModels.claude) if engine == "claude" else caller.defaultModels.codex
        return journal.base_key(engine=str(engine), model=model, profile=str(opts.get("profile", run.profile)),
                                effort=opts.get("effort", run.effort), schema=opts.get("schema"),
                                cwd=opts.get("cwd"), prompt=prompt, args_digest=journal.args_hash(run.args))

    async def call(self, live: "LiveRun", prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        run = live.run
        n, key = ticket if ticket is not None else self.begin(live, prompt, opts)
        if n > self.cfg.maxAgentsPerRun:
            raise AgentCallError(f"agent(): this run reached its cap of {self.cfg.maxAgentsPerRun} agents "
                                 f"(maxAgentsPerRun)")
        try:
            o = resolve(prompt, opts, run, live.caller, self.cfg, n, self.cfg.agentTimeoutMs)
        except OptionError as e:
            raise AgentCallError(str(e)) from None
        cached = live.replay.get(key)
        if cached is not None:
            return self._replay(live, n, o, prompt, opts, cached)
        max_tokens = 0
        if o.engine == "codex":
            try:
                o = attrs.evolve(o, schema=strict(o.schema)) if o.schema is not None else o
            except StrictSchemaError as e:
                raise AgentCallError(str(e)) from None
            cx = self.cfg.engines.codex
            assert cx is not None
            max_tokens = min(o.max_tokens or cx.maxTokensDefault, cx.maxTokensMax)
            if self.meter is None:
                raise AgentCallError("agent(): the codex engine's meter is not running")
        rec = AgentRecord(n=n, dir=self.sup.store.dir(run) / "agents" / str(n), label=o.label, engine=o.engine,
                          model=o.model, profile=o.profile)
        rec.set_state("queued")
        records.create(rec.dir, rec, prompt, {**opts, "resolved": {
            "engine": o.engine, "model": o.model, "effort": o.effort, "profile": o.profile,
            "cwd": o.cwd, "timeoutMs": o.timeout_ms, "maxUsd": o.max_usd}})
        live.add_agent(rec)
        self.sup.agent_changed(live, rec)

        scope = trio.CancelScope()
        live.agent_scopes[n] = scope
        reserved = 0.0
        reserved_tokens = 0
        verdict: Verdict | None = None
        try:
            with scope:
                async with live.slots:
                    cap = o.max_usd if o.max_usd is not None else max(0.50, run.budget_usd / 8)
                    try:
                        reserved = await live.usd.reserve(cap)
                        if o.engine == "codex":
                            reserved_tokens = int(await live.tokens.reserve(max_tokens))
                    except BudgetSpent as e:
                        if reserved:                 # the USD part was held: give it back
                            live.usd.settle(reserved, 0.0)
                        self._end(live, rec, "failed", error=str(e))
                        raise AgentCallError(f"agent(): {e}") from None
                    async with self.global_slots:
                        if o.engine == "codex":
                            verdict = await self._run_codex(live, rec, o, prompt, reserved, reserved_tokens)
                        else:
                            verdict = await self._run_claude(live, rec, o, prompt, reserved)
        except BaseException as exc:
            # Run cancel or shutdown (Cancelled, often grouped by nurseries) or a daemon
            # bug: either way the agent is over; charge it and say so, then re-raise.
            with trio.CancelScope(shield=True):
                if rec.state not in records.ENDED:
                    self._settle(live, rec, o, prompt, reserved, verdict, reserved_tokens)
                    if is_cancellation(exc):
                        self._end(live, rec, "cancelled", error=f"cancelled with the run ({live.stop_reason or 'cancel'})")
                    elif isinstance(exc, AgentCallError):
                        self._end(live, rec, "failed", error=str(exc))
                    else:
                        self._end(live, rec, "failed", error=live.redact(f"internal error: {exc!r}"))
            raise
        finally:
            live.agent_scopes.pop(n, None)
        if scope.cancelled_caught:
            self._settle(live, rec, o, prompt, reserved, verdict, reserved_tokens)
            self._end(live, rec, "skipped", error="skipped by an admin")
            self._journal(live, key, rec, None)
            return None
        self._settle(live, rec, o, prompt, reserved, verdict, reserved_tokens)
        assert verdict is not None
        if verdict.ok:
            value = redact_value(live.redact, verdict.value)
            self._end(live, rec, "done")
            self._journal(live, key, rec, value)
            return value
        self._end(live, rec, "failed", error=live.redact(verdict.error or "failed"))
        self._journal(live, key, rec, None)
        return None

    def _journal(self, live: "LiveRun", key: str, rec: AgentRecord, value: Any) -> None:
        if live.journal is None:
            return
        live.journal.append({"key": key, "n": rec.n, "label": rec.label, "ok": rec.state == "done",
                             "state": rec.state, "result": value, "engine": rec.engine, "model": rec.model,
                             "costUsd": round(rec.cost_usd, 6), "estimated": rec.cost_estimated,
                             "tokens": rec.tokens.to_json()})

    def _replay(self, live: "LiveRun", n: int, o: AgentOptions, prompt: str, opts: dict[str, Any],
                cached: dict[str, Any]) -> Any:
        """A journaled success: no process, no spend; recorded and shown as replayed."""
        rec = AgentRecord(n=n, dir=self.sup.store.dir(live.run) / "agents" / str(n), label=o.label,
                          engine=o.engine, model=o.model, profile=o.profile, replayed=True)
        rec.set_state("queued")
        records.create(rec.dir, rec, prompt, {**opts, "replayedFrom": live.run.resumed_from})
        live.add_agent(rec)
        rec.started_at = rec.queued_at
        rec.set_state("done", replayed=True, originalCostUsd=cached.get("costUsd"))
        live.run.agents_done += 1
        self.sup.agent_changed(live, rec)
        return cached.get("result")

    def skip(self, live: "LiveRun", n: int) -> bool:
        scope = live.agent_scopes.get(n)
        if scope is None:
            return False
        scope.cancel()
        return True

    # -- one process -------------------------------------------------------------
    async def _run_claude(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, prompt: str,
                          reserved: float) -> Verdict:
        run = live.run
        engine = self.cfg.engines.claude
        assert engine is not None
        api_key = self._read_key(live)
        live.redact.add(api_key)
        cwd = o.cwd or str(self.sup.store.work_dir(run))
        os.makedirs(cwd, exist_ok=True)
        home = self.homes / f"{run.id}-{rec.n}"
        (home / "home").mkdir(parents=True, exist_ok=True, mode=0o700)
        (home / "tmp").mkdir(parents=True, exist_ok=True, mode=0o700)
        secret_files = [p for p in [live.caller.apiKeyFile, str(self.cfg.path)] if p]
        call = claude.ClaudeCall(bin=engine.bin, cwd=cwd, profile=o.profile, model=o.model, effort=o.effort,
                                 schema=o.schema, max_usd=reserved, state_dir=str(self.cfg.state_dir),
                                 user_home=os.path.expanduser("~"), secret_files=secret_files)
        argv = claude.argv(call)
        env = claude.environment(bin_path=engine.bin, home=str(home / "home"), tmp=str(home / "tmp"),
                                 api_key=api_key, base_url=engine.baseUrl, run_id=run.id, n=rec.n,
                                 label=rec.label, parent_env=os.environ)
        state = claude.StreamState()
        transcript = Transcript(rec.dir / "transcript.jsonl", live.redact)

        def on_line(line: bytes) -> bool:
            transcript.append(line)
            event = parse_json_line(line)
            state.feed(event)
            return state.result is not None

        rec.set_state("running")
        self.sup.agent_changed(live, rec)
        self.spawned += 1
        timed_out = False
        try:
            with trio.move_on_after(o.timeout_ms / 1000) as deadline:
                res = await run_cli(argv, env=env, cwd=cwd, stdin_path=rec.dir / "prompt.txt",
                                    record=self.procs / f"{run.id}-{rec.n}.json",
                                    record_extra={"runId": run.id, "n": rec.n}, on_line=on_line,
                                    idle_timeout=self.cfg.agentIdleTimeoutMs / 1000)
            timed_out = deadline.cancelled_caught
        finally:
            rec.stream = state    # for settling after a kill
            transcript.close()
            shutil.rmtree(home, ignore_errors=True)
        verdict = claude.judge(state, o.schema)
        if timed_out:
            return Verdict(ok=False, error=f"timed out after {o.timeout_ms} ms", cost_usd=verdict.cost_usd,
                                  tokens=verdict.tokens)
        rec.exit_code = res.exit_code
        if res.idle_timeout:
            return Verdict(ok=False, cost_usd=verdict.cost_usd, tokens=verdict.tokens, error=(
                f"no output for {self.cfg.agentIdleTimeoutMs} ms (idle watchdog); the agent was killed"))
        return verdict

    async def _run_codex(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, prompt: str,
                         reserved: float, reserved_tokens: int) -> Verdict:
        assert self.meter is not None and self.cfg.engines.codex is not None
        key = self._read_key(live)
        live.redact.add(key)
        cwd = o.cwd or str(self.sup.store.work_dir(live.run))
        os.makedirs(cwd, exist_ok=True)
        rec.set_state("running")
        self.sup.agent_changed(live, rec)
        self.spawned += 1
        return await codex_run.run(
            cfg=self.cfg, meter=self.meter, live=live, rec=rec, opts=o, cwd=cwd, gateway_token=key,
            max_usd=reserved, max_tokens=reserved_tokens,
            home=codex.codex_homes_dir(self.cfg.state_dir) / f"{live.run.id}-{rec.n}",
            record=self.procs / f"{live.run.id}-{rec.n}.json", transcript=Transcript(rec.dir / "transcript.jsonl",
                                                                                     live.redact))

    def _read_key(self, live: "LiveRun") -> str:
        path = live.caller.apiKeyFile
        if not path:
            raise AgentCallError(f"agent(): caller {live.caller.name!r} has no apiKeyFile; the engine has no key")
        try:
            key = Path(path).read_text().strip()
        except OSError as e:
            raise AgentCallError(f"agent(): cannot read the caller's apiKeyFile: {e.strerror}") from None
        if not key:
            raise AgentCallError(f"agent(): the caller's apiKeyFile {path} is empty")
        return key

    # -- settling and recording ---------------------------------------------------
    def _settle(self, live: "LiveRun", rec: AgentRecord, o: AgentOptions, prompt: str, reserved: float,
                verdict: Verdict | None, reserved_tokens: int = 0) -> None:
        if rec.started_at is None:
            if reserved:
                live.usd.settle(reserved, 0.0)   # never started: nothing used
            if reserved_tokens:
                live.tokens.settle(reserved_tokens, 0)
            return
        if o.engine == "codex":
            if verdict is None:               # killed: what the meter booked
                verdict = codex_run.metered_verdict(rec.meter, rec.stream)
            rec.cost_usd = verdict.cost_usd or 0.0
            rec.cost_estimated = not verdict.tokens_exact
            rec.tokens = verdict.tokens
            live.usd.settle(reserved, rec.cost_usd)
            live.tokens.settle(reserved_tokens, verdict.tokens.total)
            live.run.spent_usd = live.usd.ledger.spent
            live.run.spent_estimated = live.run.spent_estimated or rec.cost_estimated
            return
        if verdict is None:
            verdict = claude.judge(rec.stream, o.schema) if rec.stream is not None else Verdict(ok=False)
        tokens = verdict.tokens
        cost = verdict.cost_usd
        estimated = cost is None
        if cost is None:
            streamed_model = rec.stream.model if rec.stream is not None else None
            row = prices.row_for(o.model or streamed_model, self.cfg.prices)
            if tokens.total == 0:
                # Nothing streamed: at least the prompt and the system prompt went in.
                tokens = Tokens(input=len(prompt) // 4 + SYSTEM_PROMPT_TOKENS)
            cost = prices.cost(tokens, row) if row else 0.0
        rec.cost_usd = cost
        rec.cost_estimated = estimated
        rec.tokens = tokens
        live.usd.settle(reserved, cost)
        live.run.spent_usd = live.usd.ledger.spent
        live.run.spent_estimated = live.run.spent_estimated or estimated

    def _end(self, live: "LiveRun", rec: AgentRecord, state: str, error: str | None = None) -> None:
        rec.error = error
        rec.set_state(state, **({"error": error} if error else {}))
        live.run.agents_done += 1
        self.sup.agent_changed(live, rec)
