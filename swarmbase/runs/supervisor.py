"""The supervisor: starts, tracks, cancels and finishes runs.

Every run is a task in the supervisor's nursery under its own cancel scope; cancelling
the scope reaches the script runner's process (and, through the engines, every agent's).
A run's end is always recorded the same way: status, result, work dir, then a notice into
the durable outbox — and recording it never raises: a full disk fails that run (kept in
memory and saved again when space returns), never the daemon.

Writes while a run is in flight (phases.json, run.json, agent records, log lines) are
batched on a short flush and done in a worker thread, so neither a chatty script nor a
burst of agents stalls the event loop; agent ends and the journal flush at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import trio

from .. import fsutil, money, notices
from ..audit.seal import RunChains
from ..config import Caller, Config, key_file_problem
from ..events import EventHub
from ..outbox import Outbox
from ..runner import RunnerLimits
from . import boot, flush
from . import deferred as deferred_mod
from . import journal as journal_mod
from . import run_request
from .agent_opts import EFFORTS  # noqa: F401  (re-exported for the tool schemas)
from .deferred import Deferred
from .run_request import RunRefused
from .journal import Journal
from .live import LiveRun
from .retention import RetentionPass
from .model import Run, iso, new_run_id
from .naming import leading_comment
from .records import ENDED, AgentRecord, Redactor, redact_value
from .script_host import ScriptHost, run_live_script, spare_spec
from .slots import RunSlots
from .spares import SpareRunners
from .store import DamagedFile, RunStore

log = logging.getLogger("swarmbase.supervisor")

# What a resume with the Workflow call shape may set anew (besides script and args).
RESUME_OVERRIDES = ("label", "description", "tokenTarget", "repository")


class AgentService(Protocol):
    async def call(self, live: "LiveRun", prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any: ...


class Supervisor:
    def __init__(self, cfg: Config, store: RunStore, outbox: Outbox, agents: AgentService | None = None,
                 limits: RunnerLimits | None = None, runner_argv: list[str] | None = None,
                 launcher: Any = None, engines: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.outbox = outbox
        (cfg.state_dir / "procs").mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg.homes_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        cfg.homes_dir.chmod(0o700)
        self.launcher = launcher
        if agents is None:
            from .agents import Agents
            agents = Agents(cfg, self, engines or {}, launcher)
        self.agents = agents
        self.limits = limits or RunnerLimits(slice_ms=cfg.scriptSliceMs, memory_mb=cfg.runnerMemoryMb,
                                             cpu_seconds=cfg.runnerCpuSeconds)
        self.runner_argv = runner_argv
        self.runs: dict[str, Run] = {}
        self.live: dict[str, LiveRun] = {}
        self.accepting = True
        self.events = EventHub()
        self.redact = Redactor()
        self.damaged = store.damaged        # what boot (and reads since) found damaged
        self.observers: list[Any] = []
        # Links handed to callers: publicUrl when configured; the daemon replaces the
        # default with its bound loopback URL once it listens.
        self.public_base = cfg.publicUrl.rstrip("/") if cfg.publicUrl else f"http://127.0.0.1:{cfg.port}"
        # What a full disk kept in memory: journal lines (paid results) and ended runs'
        # final records; `unsaved` (run id -> LiveRun) is also what status reads for them.
        self.deferred = Deferred(cfg.state_dir)
        self.unsaved = self.deferred.runs
        self._nursery: trio.Nursery | None = None
        # Warm spare runners (single-use; see spares.py), when runners start through the launcher.
        self.spares: SpareRunners | None = None
        if launcher is not None and runner_argv is None and cfg.spareRunners > 0:
            self.spares = SpareRunners(launcher, spare_spec(cfg), cfg.spareRunners)

    # -- boot -------------------------------------------------------------
    def recover(self) -> list[Run]:
        """Load every run (quarantining what cannot be read); runs left in flight by a dead
        daemon become interrupted; ended runs' work dirs are swept unless kept."""
        return boot.recover(self)

    def retention_pass(self) -> RetentionPass:
        assert self.cfg.retention is not None
        return RetentionPass(self.cfg.retention, self.cfg.state_dir, self.runs, self.store.dir, changed=self.changed,
                             busy=lambda r: r.active or r.id in self.live or r.id in self.unsaved)

    def keeps_work(self, run: Run) -> bool:
        return run.keep_work or not self.cfg.deleteWorkOnEnd

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED, resume: list[Run] | None = None) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._resave_loop)
            if self.spares is not None:
                nursery.start_soon(self.spares.serve)
            if self.cfg.retention is not None:
                nursery.start_soon(self.retention_pass().serve)
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
        log.info("resumed interrupted run %s as %s", run.id, new.id)

    async def _resave_loop(self) -> None:
        """Journal lines and ended runs' records that hit a full disk are written once
        space returns."""
        def journal_lock(run_id: str) -> trio.Lock | None:
            live = self.live.get(run_id)
            return live.journal_lock if live is not None else None
        while True:
            await trio.sleep(deferred_mod.RETRY_S)
            await self.deferred.retry(journal_lock, self._final_write)

    async def _final_write(self, live: LiveRun) -> None:
        """An ended run's records, sealed (raises OSError, keeping them, on a disk fault);
        then its end notice, if still queued, carries the end record's hash (so a record
        written late, once the disk takes writes again, stamps its notice too)."""
        run = live.run
        await flush.write(self, live, final=True)
        end = run.end
        eid = notices.event_id(run.id)
        queued = self.outbox.notice(eid)
        if end is not None and queued is not None:
            self.outbox.amend(eid, notices.with_end_hash(queued, end["hash"]))
        run.stow_end(self.store.dir(run) / "run.json")

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
        """Raises DamagedFile for an ended run whose phases.json cannot be read."""
        live = self.live.get(run.id) or self.unsaved.get(run.id)
        return live.phases_view() if live else self.store.phases(run)

    def recent_log(self, run: Run, n: int = 20) -> list[dict[str, Any]]:
        lines = self.store.recent_log(run, n)
        live = self.live.get(run.id) or self.unsaved.get(run.id)
        if live is not None and live.writes.log:
            lines = (lines + list(live.writes.log))[-n:]
        return lines

    def budget(self, run: Run) -> dict[str, Any]:
        live = self.live.get(run.id)
        if live is not None:
            return live.budget_view()
        return {"total": run.budget_usd, "spent": round(run.spent_usd, 6), "reserved": 0.0,
                "tokens": {"total": run.budget_tokens, "spent": run.spent_tokens, "reserved": 0}}

    def summary(self, run: Run) -> dict[str, Any]:
        out = run.summary()
        live = self.live.get(run.id)
        if live is not None:
            out["reservedUsd"] = round(live.usd.ledger.reserved, 6)
            out["reservedTokens"] = int(live.tokens.ledger.reserved)
            out["agents"]["running"] = live.running
        else:
            out["reservedUsd"], out["reservedTokens"] = 0.0, 0
            out["agents"]["running"] = 0
        out["url"] = self.run_url(run.id)
        return out

    # -- changes ------------------------------------------------------------
    def notify(self, method: str, *args: Any) -> None:
        for obs in self.observers:
            try:
                getattr(obs, method, lambda *a: None)(*args)
            except Exception:  # observers (telemetry) never affect runs
                log.exception("observer %r failed in %s", obs, method)

    def agent_changed(self, live: LiveRun, rec: AgentRecord, usage_only: bool = False) -> None:
        """An agent's state (or live usage) moved: viewers now; its record and phases.json
        on the run's flush (at once when it ended)."""
        row = rec.row()
        self.events.publish(live.run.id, "agent", {**row, "phase": rec.phase})
        if usage_only:
            return
        root = live.root
        if rec.state == "running":
            root.running_now.add(rec.n)
        else:
            root.running_now.discard(rec.n)
        if rec.state in ENDED:
            root.ended_rows[rec.n] = row
        live.writes.agent(rec)
        if rec.state in ENDED:
            live.writes.urgent.set()
            self.notify("agent_ended", live.run, rec)
        elif rec.state == "running":
            self.notify("agent_started", live.run, rec)
        self.changed(live.run)

    def spend_changed(self, scope: Any) -> None:
        """Spend or reservations moved somewhere in the run: totals, and the once-per-run
        budget warning when spent + reserved crosses budgetWarnAt of the budget."""
        live = scope.root
        run = live.run
        spent, spent_tokens, reserved, _ = live.totals()
        run.spent_usd, run.spent_tokens = spent, spent_tokens
        live.writes.run_dirty = True
        warn_at = run.budget_warn_at if run.budget_warn_at is not None else live.caller.budgetWarnAt
        if not live.warned and run.budget_usd > 0 and spent + reserved >= warn_at * run.budget_usd:
            live.warned = True
            self._budget_warning(live, spent, reserved)

    def _budget_warning(self, live: LiveRun, spent: float, reserved: float) -> None:
        run = live.run
        message = (f"budget warning: {money.usd(spent)} spent + {money.usd(reserved)} reserved of "
                   f"{money.usd(run.budget_usd)} "
                   f"(budgetWarnAt {run.budget_warn_at if run.budget_warn_at is not None else live.caller.budgetWarnAt:g})")
        self.record_log(run, message, "warning")
        self.events.publish(run.id, "budget-warning", {"spentUsd": round(spent, 6), "reservedUsd": round(reserved, 6),
                                                       "budgetUsd": run.budget_usd})
        self.outbox.add(run.caller, notices.build_budget_warning(run, spent, reserved, run.budget_usd,
                                                                 self.run_url(run.id)))

    def changed(self, run: Run) -> None:
        row = {**self.summary(run), "caller": run.caller, "createdAtEpoch": run.created_at,
               "endedAtEpoch": run.ended_at}
        self.events.publish(run.id, "run", row)
        self.events.publish_list(row)
        live = self.live.get(run.id)
        if live is not None:
            live.writes.run_dirty = True

    def record_log(self, run: Run, message: str, level: str = "info") -> None:
        """A log line: to viewers now, to log.jsonl on the flush (or at once for an ended run)."""
        entry = self.store.log_entry(self.redact(message), level)
        live = self.live.get(run.id)
        if live is not None:
            live.writes.log.append(entry)
        else:
            try:
                self.store.append_log_lines(run, [entry])
            except OSError as e:
                log.error("run %s: could not write a log line: %s", run.id, e)
        self.events.publish(run.id, "log", entry)

    async def journal_append(self, live: LiveRun, entry: dict[str, Any]) -> None:
        """A finished agent's journal line, fsync'd off the event loop before agent() answers.
        A full disk keeps it in memory (the agent's paid result is not lost: it is written
        when space returns, and resume waits for it) and the answer goes to the script."""
        assert live.journal is not None
        async with live.journal_lock:
            try:
                await trio.to_thread.run_sync(live.journal.append, entry)
            except OSError as e:
                fault = fsutil.disk_fault(e)
                if fault is None:
                    raise
                self.deferred.journal_refused(live.run.id, live.journal, fault)

    # -- start ------------------------------------------------------------
    def start(self, caller: Caller, params: dict[str, Any], carried: journal_mod.Loaded | None = None) -> Run:
        if not self.accepting or self._nursery is None:
            raise RunRefused("the daemon is shutting down and accepts no new runs")
        problem = key_file_problem(caller.apiKeyFile)
        if problem is not None:
            raise RunRefused(f"this caller's runs are refused: {problem}. Fix the file; no restart is needed")
        p = run_request.plan(caller, params, self.cfg)
        active = [r for r in self.runs.values() if r.caller == caller.name and r.active]
        if len(active) >= caller.maxActiveRuns:
            raise RunRefused(f"this caller already has {len(active)} active runs (maxActiveRuns is "
                             f"{caller.maxActiveRuns}); wait for one to end or cancel one")
        now = time.time()
        run_id = new_run_id()
        run = Run(id=run_id, caller=caller.name, dir_name=RunStore.dir_name_for(run_id, now), created_at=now,
                  label=params.get("label"), args=params.get("args"), model=p.model,
                  effort=params.get("effort"), profile=p.profile, budget_usd=p.budget_usd,
                  budget_tokens=p.budget_tokens, keep_work=bool(params.get("keepWork", False)),
                  resumed_from=params.get("resumedFrom"), timeout_ms=p.timeout_ms,
                  budget_warn_at=float(params.get("budgetWarnAt", caller.budgetWarnAt)),
                  script_comment=leading_comment(params["script"]), meta=p.meta.to_json() if p.meta else None,
                  token_target=params.get("tokenTarget"), description=params.get("description"),
                  repository=p.repository)
        run.history.append({"status": "queued", "at": iso(now)})
        old = self.runs.get(run.resumed_from) if run.resumed_from else None
        chains = RunChains.start(run.id, params["script"], resumed_from=run.resumed_from,
                                 resumed_end=old.end if old else None)
        run.link = chains.link
        try:
            self.store.create(run, params["script"])
            live = LiveRun(run=run, caller=caller, slots=RunSlots(self.cfg.perRunConcurrency), chains=chains,
                           meta=p.meta, max_agents=self.cfg.maxAgentsPerRun)
            live.declare_phases()
            carry = list({e["key"]: e for e in carried.lines if e.get("ok")}.values()) if carried else []
            live.journal = Journal(self.store.dir(run) / "journal.jsonl", run.id, live.args_digest, carry,
                                   chain=chains.journal, caller=caller.name)
        except OSError as e:
            fault = fsutil.disk_fault(e)
            if fault is not None:
                raise RunRefused(f"cannot start the run: {fsutil.describe_disk_fault(fault, self.cfg.state_dir)}") from None
            raise
        live.replay = dict(carried.entries) if carried else {}
        self.runs[run.id] = run
        self.live[run.id] = live
        if carried and carried.torn:
            self.record_log(run, f"resume: {carried.torn} torn journal line(s) of {run.resumed_from} skipped", "warning")
        self._nursery.start_soon(self._run, live)
        self.changed(run)
        self.notify("run_started", run)
        return run

    async def _run(self, live: LiveRun) -> None:
        run = live.run
        outcome = None
        error: str | None = None
        try:
            with live.scope:
                run.set_status("running", time.time())
                self.changed(run)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flush.loop, self, live)
                    with trio.move_on_after((run.timeout_ms or self.cfg.runTimeoutMs) / 1000) as deadline:
                        outcome = await run_live_script(self, live, ScriptHost(self, live))
                    if deadline.cancelled_caught:
                        live.stop_reason = live.stop_reason or "timeout"
                    nursery.cancel_scope.cancel()
        except Exception as e:  # a full disk, or a daemon bug: the run ends visibly either way
            outcome = None
            fault = fsutil.disk_fault(e)
            if fault is not None:
                error = fsutil.describe_disk_fault(fault, self.cfg.state_dir)
                log.error("run %s failed: %s", run.id, error)
            else:
                log.exception("run %s crashed", run.id)
                error = self.redact(f"internal error: {type(e).__name__}")
            live.stop_reason = live.stop_reason or "crash"
        finally:
            with trio.CancelScope(shield=True):
                await self._finish(live, outcome, error)

    async def _finish(self, live: LiveRun, outcome: Any, error: str | None) -> None:
        """Record the run's end. Never raises: whatever cannot be written stays in memory
        (and is saved again later); the notice is queued either way."""
        run = live.run
        now = time.time()
        run.spent_usd = live.usd.ledger.spent
        run.spent_tokens = int(live.tokens.ledger.spent)
        preview = None
        reason = live.stop_reason
        if reason == "cancel":
            run.error = "cancelled by " + live.cancelled_by
            run.set_status("cancelled", now)
        elif reason == "shutdown":
            run.error = "interrupted: the daemon was stopped while the run was in flight"
            run.set_status("interrupted", now, reason="daemon shutdown")
        elif reason == "timeout":
            run.error = f"the run exceeded its time limit of {run.timeout_ms} ms (timeoutMs / runTimeoutMs)"
            run.set_status("failed", now)
        elif reason == "limit":
            run.error = live.stop_detail or "the run exceeded a limit"
            run.set_status("failed", now)
        elif error is not None:
            run.error = error
            run.set_status("failed", now)
        elif outcome is not None and outcome.ok:
            value = redact_value(self.redact, outcome.value)
            try:
                await trio.to_thread.run_sync(self.store.save_result, run, value)
                preview = self.store.result_text(run)
                run.set_status("completed", now)
            except OSError as e:
                fault = fsutil.disk_fault(e) or e
                run.error = "the result could not be saved: " + fsutil.describe_disk_fault(fault, self.cfg.state_dir)
                run.set_status("failed", now)
        else:
            if outcome is not None:
                run.error = self.redact(outcome.error or "")
                run.error_line = outcome.line
            run.set_status("failed", now)
        if run.error and run.status != "completed":
            live.writes.log.append(self.store.log_entry(f"run {run.status}: {run.error}", "error"))
        # The notice is queued (durably) first and held until the final record is written:
        # a crash in between leaves the notice, from which the next boot completes the record
        # (boot.py); the other order could lose the notice for good.
        # Once the sealed end record is written, the held notice is amended to carry its
        # hash (a crash in between: boot amends it, boot.py); a record that could not be
        # written leaves the notice without one.
        notice = notices.build(run, preview, url=self.run_url(run.id))
        # Its place in the outbox log goes into run.json: a torn outbox line then cannot
        # lose it (boot queues it again).
        run.notice_ref = self.outbox.add(run.caller, notice, hold=True) or self.outbox.ref(notice["eventId"])
        try:
            if not await self.deferred.write_journal(run.id):
                raise OSError("its journal could not be written yet")     # sealed once it is
            await self._final_write(live)
        except OSError as e:
            log.error("run %s: its end could not be written (%s); kept in memory, retried", run.id, e)
            self.unsaved[run.id] = live
        self.outbox.release(notice["eventId"])
        if not self.keeps_work(run):
            self.store.delete_work(run)
        if preview is not None:
            self.events.publish(run.id, "result", {"text": preview[:100_000]})
        self.live.pop(run.id, None)
        live.finished.set()
        self.changed(run)
        self.notify("run_ended", run)

    def resume(self, caller: Caller, run_id: str, params: dict[str, Any]) -> Run:
        """A new run of the same script; agents whose keys succeeded in the old journal replay."""
        old = self.get(caller.name, run_id)
        if old.active:
            raise RunRefused(f"run {old.id} is still {old.status}; cancel it or let it end before resuming")
        if old.archived_at is not None:
            raise RunRefused(f"run {old.id} was archived by the daemon's retention policy; an archived run can be "
                             f"read (status, result, audit, the dashboard) but not resumed")
        waiting = self.deferred.journal_now(old.id)     # its paid results first, or they would run again
        if waiting is not None:
            raise RunRefused(f"cannot resume {old.id}: {waiting}; retry once the disk has space")
        try:
            loaded = journal_mod.load(self.store.dir(old) / "journal.jsonl")
            script = self.store.script(old)
        except journal_mod.JournalError as e:
            raise RunRefused(f"cannot resume {old.id}: {e}") from None
        except DamagedFile as e:
            raise RunRefused(f"cannot resume {old.id}: {e}") from None
        # A record rebuilt from damage lacks what only run.json held: those fall back to the
        # caller's defaults, and lost args are asked for rather than guessed (keys hash them).
        lost = set(old.rebuilt.get("lost") or []) if old.rebuilt else set()
        if "args" in lost and "args" not in params:
            raise RunRefused(f"cannot resume {old.id}: its record was rebuilt from a damaged run.json and its "
                             f"args were not recovered; call resume again with args")
        # An edited script (Claude Code's resumeFromRunId with a new script) replays the calls
        # it still makes the same way: the journal is keyed by content, not position.
        new_params = {"script": params.get("script", script), "args": params["args"] if "args" in params else old.args,
                      "label": old.label, "model": old.model, "effort": old.effort, "profile": old.profile,
                      "budgetUsd": old.budget_usd, "budgetTokens": old.budget_tokens, "keepWork": old.keep_work,
                      "resumedFrom": old.id, "timeoutMs": old.timeout_ms, "budgetWarnAt": old.budget_warn_at,
                      "tokenTarget": old.token_target, "description": old.description, "repository": old.repository}
        new_params = {k: v for k, v in new_params.items() if (v is not None or k == "args") and k not in lost - {"args"}}
        new_params.update({k: params[k] for k in RESUME_OVERRIDES if k in params and params[k] is not None})
        new = self.start(caller, new_params, carried=loaded)
        old.resumed_as = new.id
        try:
            if old.id not in self.unsaved:       # else its (sealed) final write carries it
                self.store.save(old)
        except OSError as e:
            log.warning("run %s: could not record resumedAs: %s", old.id, e)
        self.changed(old)
        return new

    # -- stop -------------------------------------------------------------
    def cancel(self, run: Run, by: str = "the caller") -> bool:
        live = self.live.get(run.id)
        if live is None or not run.active:
            return False
        live.stop_reason = live.stop_reason or "cancel"
        live.cancelled_by = by
        live.scope.cancel()
        return True

    def fail_run(self, live: LiveRun, why: str) -> None:
        """A limit was hit: end the run as failed with a message naming the limit."""
        if live.stop_reason is None:
            live.stop_reason = "limit"
            live.stop_detail = why
        live.scope.cancel()

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
        await self.deferred.last_chance(self._final_write)
