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
from typing import TYPE_CHECKING, Any

from .. import fsutil, notices
from ..audit.rundirs import agent_files, chains_from_disk, end_files
from ..prices import Tokens
from ..procs import reap_recorded_groups
from . import journal as journal_mod
from . import retention
from .model import TERMINAL, Run
from .records import ENDED, AgentRecord, finished
from .store import DamagedFile

if TYPE_CHECKING:
    from .supervisor import Supervisor

log = logging.getLogger("swarmbase.boot")

INTERRUPTED = "the daemon stopped while the run was in flight"


def report_damage(sup: "Supervisor", path: Path, fault: str) -> None:
    sup.store.report_damage(path, fault)


def recover(sup: "Supervisor") -> list[Run]:
    cfg = sup.cfg
    killed, unreadable = reap_recorded_groups(cfg.state_dir / "procs")
    for rec in unreadable:
        report_damage(sup, rec, "process record is not valid JSON")
    if killed:
        log.warning("reaped %d process groups left by an unclean stop", len(killed))
    # Throwaway private dirs of agents and runners that did not end cleanly.
    homes = cfg.homes_dir
    if homes.is_dir():
        for child in homes.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
    interrupted = []
    renotified = []
    retention.settle(cfg.state_dir)       # a retention pass a kill cut short: finished or undone
    for run in sup.store.load_all(lambda path, fault: report_damage(sup, path, fault)):
        sup.runs[run.id] = run
        if not run.active:
            _stamp_end_notice(sup, run)
        if run.active:
            _interrupt(sup, run)
            if run.status == "interrupted":
                interrupted.append(run)
        elif sup.outbox.lost_at_load(notices.event_id(run.id), run.notice_ref):
            _notify_again(sup, run)
            renotified.append(run.id)
        if not sup.keeps_work(run):
            sup.store.delete_work(run)
    retention.load_archived(cfg.state_dir, sup.runs)
    sup.outbox.boot_done()
    if renotified:
        log.warning("queued the end notice of %d run(s) again: outbox.jsonl had lost it (a torn or damaged "
                    "line): %s", len(renotified), ", ".join(renotified[:20]) + (" …" if len(renotified) > 20 else ""))
    _link_resumes(sup)
    return interrupted


def _notify_again(sup: "Supervisor", run: Run) -> None:
    """An ended run whose queued end notice the outbox log lost: the caller was never
    told, so the notice is built again from the record (same eventId, same text)."""
    preview = None
    if run.status == "completed":
        try:
            preview = sup.store.result_text(run)
        except DamagedFile:
            preview = None
    sup.outbox.add(run.caller, notices.build(run, preview, url=sup.run_url(run.id)))


def _interrupt(sup: "Supervisor", run: Run) -> None:
    """A run the dead daemon left in flight ends as interrupted — unless its end notice is
    already queued: then it had ended and only its final record was not written; the notice
    (the durable word on how it ended) completes the record."""
    now = time.time()
    queued = sup.outbox.notice(notices.event_id(run.id))
    ended = next((t.split(":", 1)[1] for t in (queued or {}).get("tags", [])
                  if t.startswith("swarmbase:") and t.split(":", 1)[1] in TERMINAL), None)
    d = sup.store.dir(run)
    chains = chains_from_disk(d, run.link) if run.link is not None else None
    if ended is not None:
        run.set_status(ended, now, reason="recorded at boot from its queued end notice")
        run.notice_ref = sup.outbox.ref(notices.event_id(run.id))
        try:
            if chains is not None:            # seal it as it is on disk
                run.end = chains.end_record(run.to_json(), end_files(d))
            sup.store.save(run)
        except OSError as e:
            log.error("run %s: could not record its end: %s", run.id, e)
            return
        _stamp_end_notice(sup, run)
        return
    run.set_status("interrupted", now, reason=INTERRUPTED)
    run.error = f"interrupted: {INTERRUPTED}"
    try:
        _interrupt_agents(sup, run, chains)
    except (DamagedFile, OSError) as e:
        log.warning("run %s: could not mark its agents interrupted: %s", run.id, e)
    # The notice first, as a run's end is always recorded: a crash before the record is
    # saved leaves a queued notice, from which the next boot completes the record.
    run.notice_ref = sup.outbox.add(run.caller, notices.build(run, None, url=sup.run_url(run.id)))
    try:
        sup.store.append_log(run, f"run interrupted: {INTERRUPTED}", "error", chains)
        if chains is not None:            # seal what the dead daemon left, as it is on disk
            run.end = chains.end_record(run.to_json(), end_files(d))
        sup.store.save(run)
    except OSError as e:
        log.error("run %s: could not record the interruption: %s", run.id, e)
    # Once sealed, the queued notice gets the end-record hash (as a live run's does).
    _stamp_end_notice(sup, run)


def _stamp_end_notice(sup: "Supervisor", run: Run) -> None:
    """An ended run whose end notice is still queued without its end-record hash (the old
    daemon died between writing the record and amending the notice, or the record was
    written at boot): the notice gets the hash before it is pushed."""
    eid = notices.event_id(run.id)
    queued = sup.outbox.notice(eid)
    if queued is None or notices.end_hash_of(queued) is not None or not run.sealed:
        return
    try:
        end = run.end
    except OSError as e:                  # its run.json cannot be read back now
        log.warning("run %s: its end notice goes out without the end-record hash: %s", run.id, e)
        return
    if end is not None:
        sup.outbox.amend(eid, notices.with_end_hash(queued, end["hash"]))


def _interrupt_agents(sup: "Supervisor", run: Run, chains: Any = None) -> None:
    """Agents that were queued or running when the daemon died will never end: say so.
    One whose journal line was written finished: its final record (written after the
    journal line, on the run's flush) is completed from that line instead."""
    agents_dir = sup.store.dir(run) / "agents"
    journaled = _journaled(sup.store.dir(run) / "journal.jsonl", run.id)
    done = 0
    rows: dict[int, dict[str, Any]] = {}
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
    phases = sup.store.phases(run)
    for phase in phases:
        agents = phase.get("agents", [])
        for i, row in enumerate(agents):
            if isinstance(row, dict) and row.get("n") in rows:
                agents[i] = rows[row["n"]]
            elif isinstance(row, dict) and row.get("state") not in ENDED:
                row.update(state="interrupted", error=INTERRUPTED, endedAt=time.time())
    sup.store.save_phases(run, phases, durable=True)
    run.agents_done = max(run.agents_done, done)


def _journaled(path: Path, run_id: str) -> dict[int, dict[str, Any]]:
    """This run's own journal lines by agent number (not lines carried from a resumed run)."""
    try:
        loaded = journal_mod.load(path)
    except journal_mod.JournalError:
        return {}
    return {e["n"]: e for e in loaded.lines
            if e.get("runId") == run_id and isinstance(e.get("n"), int) and e.get("state") in ENDED}


def _finish_from_journal(rec: AgentRecord, entry: dict[str, Any]) -> None:
    t: dict[str, Any] = entry["tokens"] if isinstance(entry.get("tokens"), dict) else {}
    rec.cost_usd = float(entry.get("costUsd") or 0.0)
    rec.cost_estimated = bool(entry.get("estimated"))
    rec.tokens = Tokens(input=int(t.get("input", 0)), output=int(t.get("output", 0)),
                        cache_read=int(t.get("cacheRead", 0)), cache_write=int(t.get("cacheWrite", 0)))
    rec.set_state(str(entry["state"]), recordedAtBoot="from its journal line (the daemon died before its record)")


def _link_resumes(sup: "Supervisor") -> None:
    """resumedAs is derived from resumedFrom (older runs do not record it)."""
    for run in sup.runs.values():
        old: Any = sup.runs.get(run.resumed_from) if run.resumed_from else None
        if old is not None and not old.resumed_as:
            old.resumed_as = run.id
