"""Boot: what the daemon does with the state a previous daemon left, before it serves.

Crash-only: nothing here trusts a file it cannot parse. Leftover process groups are
reaped (the sandbox's PID namespaces already died with the old daemon; this is the
backstop for sandbox "none"), private dirs are deleted, every readable run is loaded and
every unreadable thing quarantined and reported, runs left in flight become
`interrupted` (their agents too, and their callers get a notice), and ended runs' work
dirs are swept unless kept.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import attrs

from .. import fsutil, usage
from ..audit.rundirs import agent_files, chains_from_disk, end_files
from ..audit.seal import RunChains
from ..jsonvalue import JsonObject
from ..launch.procs import reap_recorded_groups
from ..notify import notices
from ..prices import Tokens
from . import journal as journal_mod
from . import retention, stop_note
from .env import RunEnv
from .model import TERMINAL, Run
from .records import ENDED, AgentRecord, finished
from .store import DamagedFile, RunStore

log = logging.getLogger("swarmbase.boot")

INTERRUPTED = "the daemon stopped while the run was in flight"


@attrs.frozen
class Recovered:
    """What boot found: every readable run by id, and those it marked interrupted."""
    runs: dict[str, Run]
    interrupted: list[Run]


def recover(env: RunEnv) -> Recovered:
    cfg, store = env.cfg, env.store
    killed, unreadable = reap_recorded_groups(cfg.state_dir / "procs")
    for rec in unreadable:
        store.report_damage(rec, "process record is not valid JSON")
    if killed:
        log.warning("reaped %d process groups left by an unclean stop", len(killed))
    # Throwaway private dirs of agents and runners that did not end cleanly.
    homes = cfg.homes_dir
    if homes.is_dir():
        for child in homes.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
    runs: dict[str, Run] = {}
    interrupted = []
    renotified = []
    retention.settle(env.cfg.state_dir)       # a retention pass a kill cut short: finished or undone
    lost_at_stop = stop_note.take(env.cfg.state_dir)
    for run in store.load_all(store.report_damage):
        runs[run.id] = run
        if not run.active:
            _stamp_end_notice(env, run)
        if run.active:
            _interrupt(env, run, lost_at_stop.get(run.id))
            if run.status == "interrupted":
                interrupted.append(run)
        elif env.outbox.lost_at_load(end_id(run), run.notice_ref):
            _notify_again(env, run)
            renotified.append(run.id)
        if not env.keeps_work(run):
            store.delete_work(run)
    retention.load_archived(env.cfg.state_dir, runs)
    env.outbox.boot_done()
    if renotified:
        log.warning("queued the end notice of %d run(s) again: outbox.jsonl had lost it (a torn or damaged "
                    "line): %s", len(renotified), ", ".join(renotified[:20]) + (" …" if len(renotified) > 20 else ""))
    _link_resumes(runs)
    stop_note.hold(env.cfg.state_dir)     # room for the next stop's last words, now space is here
    return Recovered(runs=runs, interrupted=interrupted)


def _notify_again(env: RunEnv, run: Run) -> None:
    """An ended run whose queued end notice the outbox log lost: the caller was never
    told, so the notice is built again from the record (same eventId, same text)."""
    preview = None
    if run.status == "completed":
        try:
            preview = env.store.result_text(run)
        except DamagedFile:
            preview = None
    notice = notices.build(run, preview, url=env.links.run(run.id))
    env.outbox.add(run.caller, {**notice, "eventId": end_id(run)})


def end_id(run: Run) -> str:
    """The eventId of the run's end notice: the usual one, or its second notice's."""
    return run.notice_id or notices.event_id(run.id)


def _interrupt(env: RunEnv, run: Run, lost_at_stop: JsonObject | None = None) -> None:
    """A run the dead daemon left in flight ends as interrupted — unless its end notice is
    already queued: then it had ended and only its final record was not written; the notice
    (the durable word on how it ended) completes the record. `lost_at_stop`: what the last
    stop could not write for this run (stop_note.py), said in its log and its notice."""
    now = time.time()
    store, outbox = env.store, env.outbox
    queued = outbox.notice(notices.event_id(run.id))
    ended = next((t.split(":", 1)[1] for t in (queued or {}).get("tags", [])
                  if t.startswith("swarmbase:") and t.split(":", 1)[1] in TERMINAL), None)
    d = store.dir(run)
    chains = chains_from_disk(d, run.link) if run.link is not None else None
    if ended is not None:
        run.set_status(ended, now, reason="recorded at boot from its queued end notice")
        run.notice_ref = outbox.ref(notices.event_id(run.id))
        if lost_at_stop is not None:      # logged before the record is sealed over the log
            _say_lost(env, run, lost_at_stop, chains)
        try:
            if chains is not None:            # seal it as it is on disk
                run.end = chains.end_record(run.to_json(), end_files(d))
            store.save(run)
        except OSError as e:
            log.error("run %s: could not record its end: %s", run.id, e)
            return
        _stamp_end_notice(env, run)
        return
    run.set_status("interrupted", now, reason=INTERRUPTED)
    run.error = f"interrupted: {INTERRUPTED}"
    torn: str | None = None
    try:
        torn = _interrupt_agents(store, run, chains)
    except (DamagedFile, OSError) as e:
        log.warning("run %s: could not mark its agents interrupted: %s", run.id, e)
    if torn is not None:
        log.warning("run %s: %s", run.id, torn)
        run.history[-1]["journal"] = torn
    _spend_from_records(run, d)
    # The notice first, as a run's end is always recorded: a crash before the record is
    # saved leaves a queued notice, from which the next boot completes the record.
    notice = notices.build(run, None, url=env.links.run(run.id))
    if lost_at_stop is not None:
        # The stopped daemon may have told the host how the run ended (the notice went out
        # from memory) under the usual eventId: this one must not be dropped as a repeat.
        ended = lost_at_stop.get("endedAs")
        run.notice_id = f"{notices.event_id(run.id)}:after-stop"
        notice = notices.restated(notice, run.notice_id, (
            f"When the daemon stopped, the disk still refused to write: {stop_note.unwritten_words(lost_at_stop)}."
            + (f" An earlier notice ({notices.event_id(run.id)}) may have said it {ended}; this one replaces it."
               if isinstance(ended, str) else "")))
    run.notice_ref = outbox.add(run.caller, notice)
    if lost_at_stop is not None:
        _say_lost(env, run, lost_at_stop, chains)
    try:
        if torn is not None:
            store.append_log(run, torn, "warning", chains)
        store.append_log(run, f"run interrupted: {INTERRUPTED}", "error", chains)
        if chains is not None:            # seal what the dead daemon left, as it is on disk
            run.end = chains.end_record(run.to_json(), end_files(d))
        store.save(run)
    except OSError as e:
        log.error("run %s: could not record the interruption: %s", run.id, e)
    # Once sealed, the queued notice gets the end-record hash (as a live run's does).
    _stamp_end_notice(env, run)


def _say_lost(env: RunEnv, run: Run, lost_at_stop: JsonObject, chains: RunChains | None) -> None:
    words = f"when the daemon stopped, the disk still refused to write: {stop_note.unwritten_words(lost_at_stop)}"
    log.error("run %s: %s", run.id, words)
    try:
        env.store.append_log(run, words, "error", chains)
    except OSError as e:
        log.error("run %s: could not log it: %s", run.id, e)


def _spend_from_records(run: Run, d: Path) -> None:
    """The run's spend becomes the sum of its agent records (what `usage` and the quota
    charge): the dead daemon's ledger only held agents that had ended, while a record cut
    mid-stream holds what streamed (estimated). Read before the notice is built, so the
    record, status, list, run page and end notice all say one sum."""
    spent = usage.spent_in(d)
    if not spent:
        return
    run.spent_usd = sum(s.cost for s in spent)
    run.spent_estimated = run.spent_estimated or any(s.estimated for s in spent)
    run.spent_tokens = max(run.spent_tokens, sum(s.tokens for s in spent if s.engine == "codex"))


def _stamp_end_notice(env: RunEnv, run: Run) -> None:
    """An ended run whose end notice is still queued without its end-record hash (the old
    daemon died between writing the record and amending the notice, or the record was
    written at boot): the notice gets the hash before it is pushed."""
    eid = end_id(run)
    queued = env.outbox.notice(eid)
    if queued is None or notices.end_hash_of(queued) is not None or not run.sealed:
        return
    try:
        end = run.end
    except OSError as e:                  # its run.json cannot be read back now
        log.warning("run %s: its end notice goes out without the end-record hash: %s", run.id, e)
        return
    if end is not None:
        env.outbox.amend(eid, notices.with_end_hash(queued, end["hash"]))


def _interrupt_agents(store: RunStore, run: Run, chains: RunChains | None = None) -> str | None:
    """Agents that were queued or running when the daemon died will never end: say so.
    One whose journal line was written finished: its final record (written after the
    journal line, on the run's flush) is completed from that line instead. Returns what a
    torn journal line (the daemon died writing it) costs, or None."""
    agents_dir = store.dir(run) / "agents"
    journaled, torn = _journaled(store.dir(run) / "journal.jsonl", run.id)
    unjournaled: list[int] = []
    done = 0
    rows: dict[int, JsonObject] = {}
    if agents_dir.is_dir():
        for d in agents_dir.iterdir():
            try:
                data = fsutil.read_json(d / "agent.json")
                rec = AgentRecord.from_json(data, d) if isinstance(data, dict) else None
            except (ValueError, KeyError, TypeError, OSError):
                continue
            if rec is None:
                continue
            if rec.state not in ENDED:
                entry = journaled.get(rec.n)
                if entry is not None:
                    _finish_from_journal(rec, entry)
                else:
                    rec.error = INTERRUPTED
                    rec.set_state("interrupted", error=INTERRUPTED)
                data = rec.to_json()
                if chains is not None:    # now final: sealed like any ended agent's record
                    data = chains.agent_record(rec.n, data, agent_files(d))
                fsutil.write_json(d / "agent.json", data, durable=False)
                rows[rec.n] = rec.row()
            if finished(rec):             # it had finished before the daemon died
                done += 1
            if rec.state == "done" and not rec.replayed and rec.n not in journaled:
                unjournaled.append(rec.n)
    phases = store.phases(run)
    for phase in phases:
        agents = phase.get("agents", [])
        for i, row in enumerate(agents):
            if isinstance(row, dict) and row.get("n") in rows:
                agents[i] = rows[row["n"]]
            elif isinstance(row, dict) and row.get("state") not in ENDED:
                row.update(state="interrupted", error=INTERRUPTED, endedAt=time.time())
    store.save_phases(run, phases, durable=True)
    run.agents_done = max(run.agents_done, done)
    if not torn:
        return None
    lost = (f"agent{'s' if len(unjournaled) > 1 else ''} {', '.join(map(str, sorted(unjournaled)))} finished "
            "but its result is not journaled, so a resume runs it again (and pays for it again)"
            if unjournaled else "no finished agent's result was lost with it")
    return f"{torn} torn journal line(s) skipped (the daemon died while writing): {lost}"


def _journaled(path: Path, run_id: str) -> tuple[dict[int, JsonObject], int]:
    """This run's own journal lines by agent number (not lines carried from a resumed run),
    and how many lines were torn."""
    try:
        loaded = journal_mod.load(path)
    except journal_mod.JournalError:
        return {}, 0
    return ({e["n"]: e for e in loaded.lines
             if e.get("runId") == run_id and isinstance(e.get("n"), int) and e.get("state") in ENDED}, loaded.torn)


def _finish_from_journal(rec: AgentRecord, entry: JsonObject) -> None:
    t: JsonObject = entry["tokens"] if isinstance(entry.get("tokens"), dict) else {}
    rec.cost_usd = float(entry.get("costUsd") or 0.0)
    rec.cost_estimated = bool(entry.get("estimated"))
    rec.tokens = Tokens(input=int(t.get("input", 0)), output=int(t.get("output", 0)),
                        cache_read=int(t.get("cacheRead", 0)), cache_write=int(t.get("cacheWrite", 0)))
    rec.set_state(str(entry["state"]), recordedAtBoot="from its journal line (the daemon died before its record)")


def _link_resumes(runs: dict[str, Run]) -> None:
    """resumedAs is derived from resumedFrom (older runs do not record it)."""
    for run in runs.values():
        old = runs.get(run.resumed_from) if run.resumed_from else None
        if old is not None and not old.resumed_as:
            old.resumed_as = run.id
