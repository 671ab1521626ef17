"""A run's batched writes: agent records, phases.json, run.json and log lines are
collected on the event loop and written together in a worker thread, every
FLUSH_INTERVAL_S or at once when something urgent (an agent's end) asks for it.

Rewriting phases.json and run.json per change made a 200-agent run quadratic, and an
fsync per log() line let a chatty script stall the whole daemon; batched, neither does.
What a failed write held is put back, so a full disk loses nothing that was in memory.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio

from .. import fsutil
from ..audit.rundirs import agent_files, end_files
from ..jsonvalue import JsonObject
from .live import LiveRun
from .records import ENDED
from .store import RunStore

log = logging.getLogger("swarmbase.supervisor")

FLUSH_INTERVAL_S = 0.25
# phases.json holds every agent's row: rewritten at most every FLUSH_INTERVAL_S per
# PHASES_AGENTS_PER_INTERVAL agents (a 2,000-agent run: every 2.5 s, not 4 times a
# second). Viewers and tools read a live run's phases from memory; the file is for a
# crash, after which boot marks the run interrupted anyway, and for ended runs (the
# final write is always made).
PHASES_AGENTS_PER_INTERVAL = 200


async def loop(live: LiveRun) -> None:
    """A full disk does not stop the run here: what could not be written stays pending
    (write() puts it back) and goes out at a later flush, so agents whose replies are
    already paid for finish and are journaled rather than cancelled with the run (issue
    25 #6). The run fails where it must have the disk: a new agent's files, its result."""
    faulted = False
    while True:
        with trio.move_on_after(FLUSH_INTERVAL_S):
            await live.writes.urgent.wait()
        live.writes.urgent = trio.Event()
        try:
            await write(live.env.store, live)
        except OSError as e:
            fault = fsutil.disk_fault(e)
            if fault is None:
                raise
            if not faulted:
                log.error("run %s: %s; its records are kept in memory and written when space returns", live.run.id,
                          fsutil.describe_disk_fault(fault, live.env.cfg.state_dir))
            faulted = True
            continue
        if faulted:
            log.info("run %s: its records are written again", live.run.id)
            faulted = False


async def write(store: RunStore, live: LiveRun, final: bool = False) -> None:
    """Snapshot what is pending (on the loop), write it (in a thread). Raises OSError
    after putting back what was not written."""
    w = live.writes
    run = live.run
    d = store.dir(run)
    logs, w.log = w.log, []
    # An ended agent's record is made durable, except a replayed one's: the journal it was
    # replayed from is durable (its lines are carried into this run's), so a fsync each
    # bought nothing but time (a power loss can lose those records; the journal keeps them).
    agents = [(rec.dir / "agent.json", rec.to_json(), rec.state in ENDED, rec.state in ENDED and not rec.replayed)
              for rec in w.agents.values()]
    inputs, w.agents, w.inputs = w.inputs, {}, {}
    now = trio.current_time()
    phases_due = w.phases_dirty and now - w.phases_at >= FLUSH_INTERVAL_S * max(
        1.0, len(live.agents) / PHASES_AGENTS_PER_INTERVAL)
    phases = live.phases_view() if (phases_due or final) else None
    run_json = run.to_json() if (w.run_dirty or w.phases_dirty or final) else None
    if phases is not None:
        w.phases_dirty = False
        w.phases_at = now
    w.run_dirty = False
    if not (logs or agents or inputs or phases is not None or run_json is not None):
        return

    chains = live.chains

    def io() -> JsonObject | None:
        for agent_dir, prompt, opts in inputs.values():
            store.write_agent_inputs(agent_dir, prompt, opts)
        for path, data, ended, durable in agents:
            if ended and chains is not None:      # the agent's final record: sealed
                data = chains.agent_record(int(path.parent.name), data, agent_files(path.parent))
            fsutil.write_json(path, data, durable=durable)
        if phases is not None:
            fsutil.write_json(d / "phases.json", phases, durable=final)
        if logs:
            store.append_log_lines(run, logs, chains)
        end = None
        if run_json is not None:
            if final and chains is not None:      # seal the run: nothing is appended after this
                end = run_json["end"] = chains.end_record(run_json, end_files(d))
            fsutil.write_json(d / "run.json", run_json)
        return end

    try:
        end = await trio.to_thread.run_sync(io)
        if end is not None:
            run.end = end
    except OSError:
        w.log[:0] = logs
        w.phases_dirty = w.run_dirty = True
        for n, given in inputs.items():
            w.inputs.setdefault(n, given)
        for path, _, _, _ in agents:
            n = int(Path(path).parent.name)
            if n in live.agents:
                w.agents.setdefault(n, live.agents[n])
        raise
