"""The supervisor: starts, tracks, cancels and finishes runs.

Every run is a task in the supervisor's nursery under its own cancel scope; cancelling
the scope reaches the script runner's process group (and, through the engines, every
agent group). A run's end is always recorded the same way: status, result, work dir,
then a notice into the durable outbox.
"""

from __future__ import annotations

import logging
import shutil
import time
from typing import Any, Protocol

import attrs
import trio

from .. import notices
from ..config import PROFILES, Caller, Config
from ..engines.codex import codex_homes_dir
from ..engines.process import reap_recorded_groups
from ..events import EventHub
from ..outbox import Outbox
from ..runner import RunnerLimits, run_script
from . import journal as journal_mod
from . import records
from .agent_opts import EFFORTS  # noqa: F401  (re-exported for the tool schemas)
from .budget import BudgetGate, Ledger
from .journal import Journal, KeyCounter
from .model import Run, iso, new_run_id
from .records import AgentRecord, Redactor, redact_value
from .store import RunStore

log = logging.getLogger("swarmbase.supervisor")

FLUSH_INTERVAL_S = 0.25
TOKEN_MINIMUM = 1_000     # a codex agent that cannot reserve this many tokens waits or fails


class RunRefused(Exception):
    """A run request the caller's policy does not allow; the message says why."""


class AgentService(Protocol):
    async def call(self, live: "LiveRun", prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any: ...


@attrs.define(eq=False)
class LiveRun:
    """In-memory state of a run while it is in flight."""
    run: Run
    caller: Caller
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    stop_reason: str | None = None          # 'cancel' or 'shutdown'
    cancelled_by: str = "the caller"
    phases: list[dict[str, Any]] = attrs.Factory(list)
    finished: trio.Event = attrs.Factory(trio.Event)
    usd: BudgetGate = attrs.field(default=None)
    slots: trio.Semaphore = attrs.field(default=None)
    agent_count: int = 0
    agents: dict[int, AgentRecord] = attrs.Factory(dict)
    agent_scopes: dict[int, trio.CancelScope] = attrs.Factory(dict)
    redact: Redactor = attrs.Factory(Redactor)
    dirty: bool = False
    journal: Journal | None = None
    replay: dict[str, dict[str, Any]] = attrs.Factory(dict)    # key -> old journal entry
    keys: KeyCounter = attrs.Factory(KeyCounter)
    tokens: BudgetGate = attrs.field(default=None)     # the codex token budget

    def __attrs_post_init__(self) -> None:
        if self.usd is None:
            self.usd = BudgetGate(Ledger(total=self.run.budget_usd, spent=self.run.spent_usd))
        if self.tokens is None:
            self.tokens = BudgetGate(Ledger(total=float(self.run.budget_tokens), minimum=TOKEN_MINIMUM), what="tokens")

    def add_agent(self, rec: AgentRecord) -> None:
        """Count an agent in the run and file it under the current phase."""
        phase = self.phase_for_agents()
        phase["agents"].append(rec.n)
        rec.phase = phase["title"]
        self.agents[rec.n] = rec
        self.run.agents_total += 1

    def budget_view(self) -> dict[str, Any]:
        return {**self.usd.ledger.view(), "tokens": self.tokens.ledger.view()}

    def phase_for_agents(self) -> dict[str, Any]:
        """The current phase; agents started before any phase() go to an implicit 'main'."""
        if not self.phases:
            self.phases.append({"title": "main", "agents": []})
        return self.phases[-1]

    def phases_view(self) -> list[dict[str, Any]]:
        return [{"title": p["title"], "agents": [self.agents[n].row() for n in p["agents"] if n in self.agents]}
                for p in self.phases]


class _Host:
    """The ScriptHost for one run: what the script's hooks do on the daemon side."""

    def __init__(self, sup: "Supervisor", live: LiveRun) -> None:
        self.sup = sup
        self.live = live

    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        begin = getattr(self.sup.agents, "begin", None)
        return begin(self.live, prompt, opts) if begin else None

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        return await self.sup.agents.call(self.live, prompt, opts, ticket)

    def phase(self, title: str) -> None:
        self.live.phases.append({"title": title, "agents": []})
        self.sup.store.save_phases(self.live.run, self.live.phases_view())
        self.sup.events.publish(self.live.run.id, "phase", {"title": title})
        self.sup.record_log(self.live.run, f"phase: {title}")

    def log(self, message: str) -> None:
        self.sup.record_log(self.live.run, self.live.redact(message))

    def meta(self, meta: Any) -> None:
        if isinstance(meta, dict):
            clean = {k: str(v)[:500] for k, v in meta.items() if k in ("name", "description") and v is not None}
            self.live.run.meta = clean
            self.sup.store.save(self.live.run)
            self.sup.changed(self.live.run)

    def budget_view(self) -> dict[str, Any]:
        return self.live.budget_view()


class Supervisor:
    def __init__(self, cfg: Config, store: RunStore, outbox: Outbox,
                 agents: AgentService | None = None, limits: RunnerLimits | None = None,
                 runner_argv: list[str] | None = None, meter: Any = None) -> None:
        self.cfg = cfg
        self.store = store
        self.outbox = outbox
        (cfg.state_dir / "procs").mkdir(parents=True, exist_ok=True, mode=0o700)
        if agents is None:
            from .agents import Agents
            agents = Agents(cfg, self, meter)
        self.agents = agents
        self.limits = limits or RunnerLimits(slice_ms=cfg.scriptSliceMs)
        self.runner_argv = runner_argv
        self.runs: dict[str, Run] = {}
        self.live: dict[str, LiveRun] = {}
        self.accepting = True
        # Links handed to callers: publicUrl when configured; the daemon replaces the
        # default with its bound loopback URL once it listens.
        self.public_base: str = cfg.publicUrl or f"http://127.0.0.1:{cfg.port}"
        self.events = EventHub()
        self._nursery: trio.Nursery | None = None

    # -- boot -------------------------------------------------------------
    def recover(self) -> list[Run]:
        """Load every run; runs left in flight by a dead daemon become interrupted (and
        their callers get a notice); ended runs' work dirs are swept unless kept."""
        reaped = reap_recorded_groups(self.cfg.state_dir / "procs")
        if reaped:
            log.warning("reaped %d agent process groups left by an unclean stop", len(reaped))
        # Throwaway agent homes (and codex CODEX_HOMEs) of runs that did not end cleanly.
        shutil.rmtree(self.cfg.state_dir / "homes", ignore_errors=True)
        shutil.rmtree(codex_homes_dir(self.cfg.state_dir), ignore_errors=True)
        interrupted = []
        for run in self.store.load_all():
            self.runs[run.id] = run
            if run.active:
                run.set_status("interrupted", time.time(), reason="the daemon stopped while the run was in flight")
                run.error = "interrupted: the daemon stopped while the run was in flight"
                self.store.save(run)
                self.outbox.add(run.caller, notices.build(run, None, url=self.run_url(run.id)))
                interrupted.append(run)
            if not self._keeps_work(run):
                self.store.delete_work(run)
        return interrupted

    def _keeps_work(self, run: Run) -> bool:
        return run.keep_work or not self.cfg.deleteWorkOnEnd

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED,
                    resume: list[Run] | None = None) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for run in resume or []:
                self._resume_on_boot(run)
            task_status.started()
            await trio.sleep_forever()

    def _resume_on_boot(self, run: Run) -> None:
        caller = self.cfg.caller(run.caller)
        if caller is None:
            log.warning("not resuming %s: caller %s is no longer configured", run.id, run.caller)
            return
        try:
            new = self.resume(caller, run.id, {})
        except RunRefused as e:
            log.warning("not resuming %s: %s", run.id, e)
            return
        self.record_log(run, f"resumed on boot as {new.id}")
        log.info("resumed interrupted run %s as %s", run.id, new.id)

    # -- queries ----------------------------------------------------------
    def run_url(self, run_id: str) -> str:
        return f"{self.public_base.rstrip('/')}/runs/{run_id}"

    def runs_of(self, caller: str) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.caller == caller),
                      key=lambda r: r.created_at, reverse=True)

    def get(self, caller: str, run_id: str) -> Run:
        run = self.runs.get(run_id)
        # Another caller's run answers exactly like a missing one.
        if run is None or run.caller != caller:
            raise RunRefused(f"no run {run_id!r} for this caller")
        return run

    def phases(self, run: Run) -> list[dict[str, Any]]:
        live = self.live.get(run.id)
        return live.phases_view() if live else self.store.phases(run)

    def agent_changed(self, live: LiveRun, rec: AgentRecord) -> None:
        """An agent's state moved: its record now if it ended, run.json and phases.json
        on the run's next flush (they are rewritten whole; per change would be O(n²))."""
        if rec.state in records.ENDED or rec.state == "queued":
            # A replayed agent's truth is the journal line it came from: no fsync for it.
            records.save(rec, durable=rec.state in records.ENDED and not rec.replayed)
        live.dirty = True
        self.events.publish(live.run.id, "agent", {**rec.row(), "phase": rec.phase})
        self.changed(live.run)

    def _flush(self, live: LiveRun) -> None:
        if live.dirty:
            live.dirty = False
            self.store.save_phases(live.run, live.phases_view())
            self.store.save(live.run)

    async def _flush_loop(self, live: LiveRun) -> None:
        while True:
            await trio.sleep(FLUSH_INTERVAL_S)
            self._flush(live)

    # -- changes ------------------------------------------------------------
    def changed(self, run: Run) -> None:
        row = {**run.summary(), "caller": run.caller, "createdAtEpoch": run.created_at, "endedAtEpoch": run.ended_at,
               "resumedFrom": run.resumed_from}
        self.events.publish(run.id, "run", row)
        self.events.publish_list(row)

    def record_log(self, run: Run, message: str, level: str = "info") -> None:
        entry = self.store.append_log(run, message, level)
        self.events.publish(run.id, "log", entry)
        self.changed(run)

    # -- start ------------------------------------------------------------
    def start(self, caller: Caller, params: dict[str, Any], carried: journal_mod.Loaded | None = None) -> Run:
        if not self.accepting or self._nursery is None:
            raise RunRefused("the daemon is shutting down and accepts no new runs")
        # Least privilege unless asked: read (or think, if that is all the caller may use).
        profile = params.get("profile") or PROFILES[min(PROFILES.index("read"), PROFILES.index(caller.maxProfile))]
        if PROFILES.index(profile) > PROFILES.index(caller.maxProfile):
            raise RunRefused(f"profile {profile!r} is above this caller's maxProfile {caller.maxProfile!r}")
        budget_usd = float(params.get("budgetUsd", caller.runUsdDefault))
        if budget_usd > caller.runUsdMax:
            raise RunRefused(f"budgetUsd {budget_usd:g} is above this caller's runUsdMax {caller.runUsdMax:g}")
        budget_tokens = int(params.get("budgetTokens", caller.runTokensDefault))
        if budget_tokens > caller.runTokensMax:
            raise RunRefused(f"budgetTokens {budget_tokens} is above this caller's runTokensMax {caller.runTokensMax}")
        active = [r for r in self.runs.values() if r.caller == caller.name and r.active]
        if len(active) >= caller.maxActiveRuns:
            raise RunRefused(f"this caller already has {len(active)} active runs (maxActiveRuns is "
                             f"{caller.maxActiveRuns}); wait for one to end or cancel one")
        now = time.time()
        run_id = new_run_id()
        run = Run(id=run_id, caller=caller.name, dir_name=RunStore.dir_name_for(run_id, now), created_at=now,
                  label=params.get("label"), args=params.get("args"), model=params.get("model"),
                  effort=params.get("effort"), profile=profile, budget_usd=budget_usd,
                  budget_tokens=budget_tokens, keep_work=bool(params.get("keepWork", False)),
                  resumed_from=params.get("resumedFrom"))
        run.history.append({"status": "queued", "at": iso(now)})
        self.store.create(run, params["script"])
        self.runs[run.id] = run
        live = LiveRun(run=run, caller=caller, slots=trio.Semaphore(self.cfg.perRunConcurrency))
        carry = list({e["key"]: e for e in carried.lines if e.get("ok")}.values()) if carried else []
        live.journal = Journal(self.store.dir(run) / "journal.jsonl", run.id, journal_mod.args_hash(run.args), carry)
        live.replay = dict(carried.entries) if carried else {}
        if carried and carried.torn:
            self.record_log(run, f"resume: {carried.torn} torn journal line(s) of {run.resumed_from} skipped", "warning")
        self.live[run.id] = live
        self._nursery.start_soon(self._run, live)
        self.changed(run)
        return run

    async def _run(self, live: LiveRun) -> None:
        run = live.run
        outcome = None
        try:
            with live.scope:
                run.set_status("running", time.time())
                self.store.save(run)
                self.changed(run)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._flush_loop, live)
                    outcome = await run_script(self.store.script(run), run.args, _Host(self, live),
                                               self.limits, self.runner_argv,
                                               record=self.cfg.state_dir / "procs" / f"{run.id}-runner.json")
                    nursery.cancel_scope.cancel()
        except Exception as e:  # a daemon bug must still end the run visibly
            log.exception("run %s crashed", run.id)
            outcome = None
            live.stop_reason = live.stop_reason or "crash"
            run.error = live.redact(f"internal error: {e!r}")
        finally:
            with trio.CancelScope(shield=True):
                self._finish(live, outcome)

    def _finish(self, live: LiveRun, outcome: Any) -> None:
        run = live.run
        now = time.time()
        run.spent_usd = live.usd.ledger.spent
        self.store.save_phases(run, live.phases_view())
        preview = None
        if live.stop_reason == "cancel":
            run.error = "cancelled by " + live.cancelled_by
            run.set_status("cancelled", now)
        elif live.stop_reason == "shutdown":
            run.error = "interrupted: the daemon was stopped while the run was in flight"
            run.set_status("interrupted", now, reason="daemon shutdown")
        elif outcome is not None and outcome.ok:
            self.store.save_result(run, redact_value(live.redact, outcome.value))
            preview = self.store.result_text(run)
            run.set_status("completed", now)
        else:
            if outcome is not None:
                run.error = live.redact(outcome.error or "")
                run.error_line = outcome.line
            run.set_status("failed", now)
        self.store.save(run)
        if run.error and run.status != "completed":
            self.store.append_log(run, f"run {run.status}: {run.error}", "error")
        if not self._keeps_work(run):
            self.store.delete_work(run)
        self.outbox.add(run.caller, notices.build(run, preview, url=self.run_url(run.id)))
        if preview is not None:
            self.events.publish(run.id, "result", {"text": preview[:100_000]})
        self.live.pop(run.id, None)
        live.finished.set()
        self.changed(run)

    def resume(self, caller: Caller, run_id: str, params: dict[str, Any]) -> Run:
        """A new run of the same script; agents whose keys succeeded in the old journal replay."""
        old = self.get(caller.name, run_id)
        if old.active:
            raise RunRefused(f"run {old.id} is still {old.status}; cancel it or let it end before resuming")
        try:
            loaded = journal_mod.load(self.store.dir(old) / "journal.jsonl")
        except journal_mod.JournalError as e:
            raise RunRefused(f"cannot resume {old.id}: {e}") from None
        new_params = {"script": self.store.script(old), "args": params["args"] if "args" in params else old.args,
                      "label": old.label, "model": old.model, "effort": old.effort, "profile": old.profile,
                      "budgetUsd": old.budget_usd, "budgetTokens": old.budget_tokens, "keepWork": old.keep_work,
                      "resumedFrom": old.id}
        new_params = {k: v for k, v in new_params.items() if v is not None or k == "args"}
        return self.start(caller, new_params, carried=loaded)

    # -- stop -------------------------------------------------------------
    def cancel(self, run: Run, by: str = "the caller") -> bool:
        live = self.live.get(run.id)
        if live is None:
            return False
        live.stop_reason = live.stop_reason or "cancel"
        live.cancelled_by = by
        live.scope.cancel()
        return True

    def skip_agent(self, run: Run, n: int) -> bool:
        live = self.live.get(run.id)
        skip = getattr(self.agents, "skip", None)
        return bool(live and skip and skip(live, n))

    async def shutdown(self) -> None:
        """No new runs; every in-flight run is stopped and recorded as interrupted."""
        self.accepting = False
        pending = list(self.live.values())
        for live in pending:
            live.stop_reason = live.stop_reason or "shutdown"
            live.scope.cancel()
        for live in pending:
            await live.finished.wait()
