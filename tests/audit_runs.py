"""Run dirs written the way the core writes them once chains are wired in (the integration
plan in docs/audit-integration.md): the real RunStore, Run, AgentRecord, records and
fsutil writers, with each entry sealed by swarmbase.audit.seal.RunChains."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs

from swarmbase import fsutil
from swarmbase.audit.rundirs import agent_files
from swarmbase.audit.seal import RunChains, file_sha256
from swarmbase.prices import Tokens
from swarmbase.runs import journal as journal_mod
from swarmbase.runs import records
from swarmbase.runs.model import Run, iso, new_run_id
from swarmbase.runs.records import AgentRecord
from swarmbase.runs.store import RunStore


@attrs.define
class AgentSpec:
    label: str
    engine: str = "claude"
    model: str | None = "claude-sonnet-5-5"
    cost: float = 0.01
    tokens: Tokens = Tokens(input=1000, output=200)
    state: str = "done"
    ended_at: float | None = None      # default: now
    duration: float = 2.0
    workflow: str = ""
    replayed: bool = False
    cwd: str | None = None
    estimated: bool = False
    priced: bool = True


def _save_run(store: RunStore, run: Run, extra: dict[str, Any]) -> None:
    fsutil.write_json(store.dir(run) / "run.json", {**run.to_json(), **extra})


def write_run(state: Path, agents: list[AgentSpec], *, caller: str = "alice", script: str = "return 1",
              resumed_from: Run | None = None, chained: bool = True, log: list[str] = ("started", "phase: main"),
              result: Any = {"ok": True}, created_at: float | None = None, status: str = "completed",
              nested_in: tuple[Run, str] | None = None, sealed: bool = True) -> Run:
    store = RunStore(state)
    now = created_at if created_at is not None else time.time()
    run_id = new_run_id()
    run = Run(id=run_id, caller=caller, dir_name=RunStore.dir_name_for(run_id, now), created_at=now,
              label=f"test {run_id}", resumed_from=resumed_from.id if resumed_from else None)
    run.history.append({"status": "queued", "at": iso(now)})
    store.create(run, script)
    d = store.dir(run)
    extra: dict[str, Any] = {}
    chains = None
    if chained:
        old_end = None
        if resumed_from is not None:
            old_end = json.loads((store.dir(resumed_from) / "run.json").read_text()).get("end")
        nested = None
        if nested_in is not None:
            parent, path = nested_in
            parent_link = json.loads((store.dir(parent) / "run.json").read_text())["link"]
            from swarmbase.audit import chain
            nested = {"runId": parent.id, "workflow": path, "after": chain.link_hash(parent_link)}
            extra["nestedIn"] = {"runId": parent.id, "workflow": path}
        chains = RunChains.start(run.id, script, resumed_from=run.resumed_from, resumed_end=old_end,
                                 nested_in=nested)
        extra["link"] = chains.link
    _save_run(store, run, extra)

    def append(path: Path, entry: dict[str, Any], writer: Any) -> None:
        fsutil.append_line(path, writer.seal(entry) if chains else entry)

    append(d / "journal.jsonl", journal_mod.header(run.id, journal_mod.args_hash(None)),
           chains.journal if chains else None)
    for message in log:
        append(d / "log.jsonl", {"at": iso(time.time()), "level": "info", "message": message},
               chains.log if chains else None)
    latest = now
    for n, spec in enumerate(agents, start=1):
        rec = AgentRecord(n=n, dir=d / "agents" / str(n), label=spec.label, engine=spec.engine, model=spec.model,
                          profile="read", replayed=spec.replayed)
        rec.set_state("queued")
        records.create(rec.dir, rec, f"prompt {n}", {"resolved": {"engine": spec.engine, "model": spec.model,
                                                                 "profile": "read", "cwd": spec.cwd}})
        rec.set_state("running")
        rec.set_state(spec.state, **({"error": "boom"} if spec.state == "failed" else {}))
        end = spec.ended_at if spec.ended_at is not None else time.time()
        rec.ended_at, rec.started_at = end, end - spec.duration
        latest = max(latest, end)
        rec.cost_usd, rec.tokens, rec.cost_estimated = spec.cost, spec.tokens, spec.estimated
        rec.error = "boom" if spec.state == "failed" else None
        body = {**rec.to_json(), "workflow": spec.workflow, "priced": spec.priced}
        if chains:
            files = agent_files(rec.dir)
            fsutil.write_json(rec.dir / "agent.json", chains.agent_record(n, body, files))
        else:
            fsutil.write_json(rec.dir / "agent.json", body)
        append(d / "journal.jsonl", {"key": f"k{n}:0", "n": n, "label": spec.label, "ok": spec.state == "done",
                                     "state": spec.state, "result": f"r{n}", "costUsd": spec.cost,
                                     "tokens": spec.tokens.to_json()}, chains.journal if chains else None)
        run.agents_total += 1
        run.agents_done += 1
        run.spent_usd += spec.cost
    if status == "completed" and result is not None:
        store.save_result(run, result)
    if status in ("completed", "failed", "cancelled", "interrupted") and sealed:
        run.set_status(status, latest + 5)
        if chains:
            data = run.to_json()
            files = {"script.js": file_sha256((d / "script.js").read_bytes())}
            if (d / "result.json").exists():
                files["result.json"] = file_sha256((d / "result.json").read_bytes())
            extra["end"] = chains.end_record(data, files)
    _save_run(store, run, extra)
    return run


def run_dir(state: Path, run: Run) -> Path:
    return state / "runs" / run.dir_name


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, rows: list[bytes]) -> None:
    path.write_bytes(b"".join(rows))
