"""The supervisor: the registry of runs and their lifecycle — start, resume, cancel,
skip, finish, shutdown. Built last, over what the daemon built before it (the RunEnv, the
agent service, the runners); nothing it hands down receives it.

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
from pathlib import Path
from typing import Mapping

import trio

from .. import fsutil
from ..config import Caller, key_file_problem
from ..jsonvalue import Json, JsonObject
from ..notify import notices
from ..script.host import ScriptOutcome
from . import boot, flush
from . import deferred as deferred_mod
from . import journal as journal_mod
from . import project_agents, run_opts
from .agent_opts import EFFORTS  # noqa: F401  (re-exported for the tool schemas)
from .agent_service import AgentService
from .ending import Stop, end_of, result_unsaved
from .env import RunEnv
from .journal import Journal
from .live import LiveRun, publish_row, summary
from .retention import RetentionPass
from .model import Run, iso, new_run_id
from .quota import QuotaBook, history_of
from .records import redact_value
from .run_opts import RunRefused
from .runners import Runners
from .script_host import ScriptHost
from .slots import RunSlots
from .store import DamagedFile, RunStore
from ..audit.seal import RunChains

log = logging.getLogger("swarmbase.supervisor")


class Supervisor:
    def __init__(self, env: RunEnv, agents: AgentService, runners: Runners, runs: dict[str, Run] | None = None) -> None:
        self.env = env
        self.agents = agents
        self.runners = runners
        # The registry: every run the daemon knows (handed in when a part built earlier,
        # the codex deny list, reads it).
        self.runs: dict[str, Run] = runs if runs is not None else {}
        self.live: dict[str, LiveRun] = {}
        # Ended runs whose final records a full disk refused: kept (status reads them
        # here) and written again when space returns.
        self.unsaved: dict[str, LiveRun] = {}
        self.quota = QuotaBook(history_of(self.runs, env.store.dir, env.cfg.state_dir))     # usdPerDay / usdPerMonth
        self.accepting = True
        self._nursery: trio.Nursery | None = None
        # Reads `retention` from the running Config at each pass; a reload wakes it (live_reload).
        self.retention = RetentionPass(lambda: self.env.cfg.retention, env.cfg.state_dir, self.runs, env.store.dir,
                                       changed=self.changed,
                                       busy=lambda r: r.active or r.id in self.live or r.id in self.unsaved)

    # -- boot -------------------------------------------------------------
    def recover(self) -> list[Run]:
        """Load every run (quarantining what cannot be read); runs left in flight by a dead
        daemon become interrupted (returned); ended runs' work dirs are swept unless kept."""
        found = boot.recover(self.env)
        self.runs.update(found.runs)
        return found.interrupted


    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED, resume: list[Run] | None = None) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._resave_loop)
            nursery.start_soon(self.retention.serve)
            for run in resume or []:
                self._resume_on_boot(run)
            task_status.started()
            await trio.sleep_forever()

    def _resume_on_boot(self, run: Run) -> None:
        caller = self.env.cfg.caller(run.caller)
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
            await self.env.deferred.retry(journal_lock, self.unsaved, self._final_write)

    async def _final_write(self, live: LiveRun) -> None:
        """An ended run's records, sealed (raises OSError, keeping them, on a disk fault);
        then its end notice, if still queued, carries the end record's hash (so a record
        written late, once the disk takes writes again, stamps its notice too)."""
        run, outbox = live.run, self.env.outbox
        await flush.write(self.env.store, live, final=True)
        end = run.end
        eid = notices.event_id(run.id)
        queued = outbox.notice(eid)
        if end is not None and queued is not None:
            outbox.amend(eid, notices.with_end_hash(queued, end["hash"]))
        run.stow_end(self.env.store.dir(run) / "run.json")

    # -- queries ----------------------------------------------------------
    def run_url(self, run_id: str) -> str:
        return self.env.links.run(run_id)

    def runs_of(self, caller: str) -> list[Run]:
        return sorted((r for r in self.runs.values() if r.caller == caller),
                      key=lambda r: r.created_at, reverse=True)

    def get(self, caller: str, run_id: str) -> Run:
        run = self.runs.get(run_id)
        # Another caller's run answers exactly like a missing one.
        if run is None or run.caller != caller:
            raise RunRefused(f"no run {run_id!r} for this caller")
        return run

    def phases(self, run: Run) -> list[JsonObject]:
        """Raises DamagedFile for an ended run whose phases.json cannot be read."""
        live = self.live.get(run.id) or self.unsaved.get(run.id)
        return live.phases_view() if live else self.env.store.phases(run)

    def recent_log(self, run: Run, n: int = 20) -> list[JsonObject]:
        lines = self.env.store.recent_log(run, n)
        live = self.live.get(run.id) or self.unsaved.get(run.id)
        if live is not None and live.writes.log:
            lines = (lines + list(live.writes.log))[-n:]
        return lines

    def budget(self, run: Run) -> JsonObject:
        live = self.live.get(run.id)
        if live is not None:
            return live.budget_view()
        return {"total": run.budget_usd, "spent": round(run.spent_usd, 6), "reserved": 0.0,
                "tokens": {"total": run.budget_tokens, "spent": run.spent_tokens, "reserved": 0}}

    def summary(self, run: Run) -> JsonObject:
        return summary(run, self.live.get(run.id), self.run_url(run.id))

    def changed(self, run: Run) -> None:
        """A run's row moved (a live run reports its own: LiveRun.changed)."""
        live = self.live.get(run.id)
        if live is not None:
            live.changed()
        else:
            publish_row(self.env, run, None)

    # -- start ------------------------------------------------------------
    def start(self, caller: Caller, params: Mapping[str, Json]) -> Run:
        """A new run from the `run` tool's parameters."""
        return self._start(caller, run_opts.asked(params))

    def _start(self, caller: Caller, asked: run_opts.Asked, carried: journal_mod.Loaded | None = None) -> Run:
        env, cfg = self.env, self.env.cfg
        if not self.accepting or self._nursery is None:
            raise RunRefused("the daemon is shutting down and accepts no new runs")
        problem = key_file_problem(caller.apiKeyFile)
        if problem is not None:
            raise RunRefused(f"this caller's runs are refused: {problem}. Fix the file; no restart is needed")
        opts = run_opts.resolve(caller, asked, cfg)
        if (over := self.quota.refusal(caller, opts.budget_usd)) is not None:
            raise RunRefused(over)
        active = [r for r in self.runs.values() if r.caller == caller.name and r.active]
        if len(active) >= caller.maxActiveRuns:
            raise RunRefused(f"this caller already has {len(active)} active runs (maxActiveRuns is "
                             f"{caller.maxActiveRuns}); wait for one to end or cancel one")
        now = time.time()
        run_id = new_run_id()
        run = opts.new_run(run_id, caller.name, RunStore.dir_name_for(run_id, now), now)
        run.history.append({"status": "queued", "at": iso(now)})
        old = self.runs.get(run.resumed_from) if run.resumed_from else None
        chains = RunChains.start(run.id, asked.script, resumed_from=run.resumed_from,
                                 resumed_end=old.end if old else None)
        run.link = chains.link
        try:
            env.store.create(run, asked.script)
            live = LiveRun(run=run, caller=caller, env=env, slots=RunSlots(cfg.perRunConcurrency), chains=chains,
                           meta=opts.meta, max_agents=cfg.maxAgentsPerRun)
            live.declare_phases()
            carry = list({e["key"]: e for e in carried.lines if e.get("ok")}.values()) if carried else []
            live.journal = Journal(env.store.dir(run) / "journal.jsonl", run.id, live.args_digest, carry,
                                   chain=chains.journal, caller=caller.name)
        except OSError as e:
            fault = fsutil.disk_fault(e)
            if fault is not None:
                raise RunRefused(f"cannot start the run: {fsutil.describe_disk_fault(fault, cfg.state_dir)}") from None
            raise
        live.replay = dict(carried.entries) if carried else {}
        self.runs[run.id] = run
        self.live[run.id] = live
        self.quota.admit(run, live.agents)
        if carried and carried.torn:
            live.record_log(f"resume: {carried.torn} torn journal line(s) of {run.resumed_from} skipped", "warning")
        self._nursery.start_soon(self._run, live, asked.script)
        live.changed()
        env.observers.run_started(run)
        return run

    async def _run(self, live: LiveRun, script: str) -> None:
        run, cfg = live.run, self.env.cfg
        outcome = None
        error: str | None = None
        try:
            with live.scope:
                run.set_status("running", time.time())
                live.changed()
                if run.repository is not None:
                    # Its agent types as they are now: the hashes pin what this run's agents saw.
                    live.project_agents = await trio.to_thread.run_sync(project_agents.scan, Path(run.repository))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flush.loop, live)
                    with trio.move_on_after((run.timeout_ms or cfg.runTimeoutMs) / 1000) as deadline:
                        outcome = await self.runners.run(ScriptHost(live, self.agents, self.runners), script,
                                                         run.args, key=f"{run.id}-runner", run_id=run.id)
                    if deadline.cancelled_caught:
                        live.note_stop(Stop.TIMEOUT)
                    nursery.cancel_scope.cancel()
        except Exception as e:  # a full disk, or a daemon bug: the run ends visibly either way
            outcome = None
            fault = fsutil.disk_fault(e)
            if fault is not None:
                error = fsutil.describe_disk_fault(fault, cfg.state_dir)
                log.error("run %s failed: %s", run.id, error)
            else:
                log.exception("run %s crashed", run.id)
                error = self.env.redact(f"internal error: {type(e).__name__}")
            live.note_stop(Stop.CRASH)
        finally:
            with trio.CancelScope(shield=True):
                await self._finish(live, outcome, error)

    async def _finish(self, live: LiveRun, outcome: ScriptOutcome | None, error: str | None) -> None:
        """Record the run's end. Never raises: whatever cannot be written stays in memory
        (and is saved again later); the notice is queued either way."""
        env, run = self.env, live.run
        now = time.time()
        run.spent_usd = live.usd.ledger.spent
        run.spent_tokens = int(live.tokens.ledger.spent)
        preview = None
        end = end_of(live.stopped, outcome, error=error, detail=live.stop_detail, cancelled_by=live.cancelled_by,
                     timeout_ms=run.timeout_ms, redact=env.redact, refused_worktrees=live.worktrees_all_refused())
        if end.has_result and outcome is not None:
            value = redact_value(env.redact, outcome.value)
            try:
                await trio.to_thread.run_sync(env.store.save_result, run, value)
                preview = env.store.result_text(run)
            except OSError as e:
                end = result_unsaved(fsutil.describe_disk_fault(fsutil.disk_fault(e) or e, env.cfg.state_dir))
        if end.error is not None:
            run.error = end.error
        if end.error_line is not None:
            run.error_line = end.error_line
        run.set_status(end.status, now, **({"reason": end.reason} if end.reason else {}))
        if run.error and run.status != "completed":
            live.writes.log.append(env.store.log_entry(f"run {run.status}: {run.error}", "error"))
        # The notice is queued (durably) first and held until the final record is written:
        # a crash in between leaves the notice, from which the next boot completes the record
        # (boot.py); the other order could lose the notice for good.
        # Once the sealed end record is written, the held notice is amended to carry its
        # hash (a crash in between: boot amends it, boot.py); a record that could not be
        # written leaves the notice without one.
        env.observers.run_ending(run)       # progress still waiting goes out ahead of the end notice
        notice = notices.build(run, preview, url=self.run_url(run.id))
        # Its place in the outbox log goes into run.json: a torn outbox line then cannot
        # lose it (boot queues it again).
        run.notice_ref = env.outbox.add(run.caller, notice, hold=True) or env.outbox.ref(notice["eventId"])
        try:
            if not await env.deferred.write_journal(run.id):
                raise OSError("its journal could not be written yet")     # sealed once it is
            await self._final_write(live)
        except OSError as e:
            log.error("run %s: its end could not be written (%s); kept in memory, retried", run.id, e)
            self.unsaved[run.id] = live
        env.outbox.release(notice["eventId"])
        if not env.keeps_work(run):
            env.store.delete_work(run)
        if preview is not None:
            env.events.publish(run.id, "result", {"text": preview[:100_000]})
        self.live.pop(run.id, None)
        live.finished.set()
        publish_row(env, run, None)
        env.observers.run_ended(run)

    def resume(self, caller: Caller, run_id: str, params: Mapping[str, Json]) -> Run:
        """A new run of the same script; agents whose keys succeeded in the old journal replay."""
        old = self.get(caller.name, run_id)
        if old.active:
            raise RunRefused(f"run {old.id} is still {old.status}; cancel it or let it end before resuming")
        again = self.live.get(old.resumed_as) if old.resumed_as else None
        if again is not None and again.run.active:
            # Two resumes at once would make two paying runs of one script (issue 31 #8).
            raise RunRefused(f"run {old.id} is already being resumed as {again.run.id} ({again.run.status}); "
                             f"one resume of a run at a time")
        if old.archived_at is not None:
            raise RunRefused(f"run {old.id} was archived by the daemon's retention policy; an archived run can be "
                             f"read (status, result, audit, the dashboard) but not resumed")
        waiting = self.env.deferred.journal_now(old.id)     # its paid results first, or they would run again
        if waiting is not None:
            raise RunRefused(f"cannot resume {old.id}: {waiting}; retry once the disk has space")
        try:
            loaded = journal_mod.load(self.env.store.dir(old) / "journal.jsonl")
            script = self.env.store.script(old)
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
        asked = run_opts.asked_again(old, params.get("script", script), params["args"] if "args" in params else old.args,
                                     lost, params)
        new = self._start(caller, asked, carried=loaded)
        old.resumed_as = new.id
        try:
            if old.id not in self.unsaved:       # else its (sealed) final write carries it
                self.env.store.save(old)
        except OSError as e:
            log.warning("run %s: could not record resumedAs: %s", old.id, e)
        self.changed(old)
        return new

    # -- stop -------------------------------------------------------------
    def cancel(self, run: Run, by: str = "the caller") -> bool:
        live = self.live.get(run.id)
        if live is None or not run.active:
            return False
        live.cancelled_by = by
        live.stop(Stop.CANCEL)
        return True

    def skip_agent(self, run: Run, n: int) -> bool:
        live = self.live.get(run.id)
        return live is not None and self.agents.skip(live, n)

    async def shutdown(self) -> None:
        """No new runs; every in-flight run is stopped and recorded as interrupted."""
        self.accepting = False
        pending = list(self.live.values())
        for live in pending:
            live.stop(Stop.SHUTDOWN)
        for live in pending:
            await live.finished.wait()
        await self.env.deferred.last_chance(self.unsaved, self._final_write, lambda live: live.run.status)
