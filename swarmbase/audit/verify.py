"""Verify every chain of one run dir against its end record and its link.

Order of checks (the first break found in this order is the one reported): run.json's end
record and facts, the link (script, the run it resumed, its parent workflow),
journal.jsonl, log.jsonl, each agent record in number order, the files the records hash
(script.js, result.json, an agent's prompt/opts/transcript).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from ..jsonvalue import object_at
from . import chain, seal
from .chain import NOT_SEALED, Break, ChainResult
from .rundirs import RunIndex, agent_numbers, read_bytes

ENDED_STATUSES = ("completed", "failed", "cancelled", "interrupted")


@attrs.frozen
class RunVerdict:
    run_id: str
    status: chain.Status
    chains: list[ChainResult]
    brk: Break | None
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"runId": self.run_id, "status": self.status,
                "break": attrs.asdict(self.brk) if self.brk else None, "notes": self.notes,
                "chains": [{"name": c.name, "status": c.status, "entries": c.entries, "torn": c.torn}
                           for c in self.chains]}


def _file_break(idx: RunIndex, folder: Path, name: Any, want: Any, what: str) -> Break | None:
    """The file `name` in `folder` must hash to `want`. Names are plain file names: a record
    naming anything else was not written by the daemon."""
    if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
        return Break(idx.rel(folder), 1, f"{what} names {name!r}, which is not a file of this run: it was edited")
    path = folder / name
    data = read_bytes(path)
    if data is None:
        return Break(idx.rel(path), 1, f"missing: {what} holds its hash")
    if seal.file_sha256(data) != want:
        return Break(idx.rel(path), 1, f"differs from the hash in {what}: the file was edited or replaced")
    return None


def _link_break(idx: RunIndex, d: Path, run: dict[str, Any], link: dict[str, Any], notes: list[str]) -> Break | None:
    rj = idx.rel(d / "run.json")
    if link.get("run") != run["id"]:
        return Break(rj, 1, "the run's link names another run")
    script = read_bytes(d / "script.js")
    if link.get("script") is not None and (script is None or seal.file_sha256(script) != link["script"]):
        return Break(idx.rel(d / "script.js"), 1, "differs from the hash in the run's link: the script was edited")
    if run.get("resumedFrom") != link.get("resumedFrom"):
        return Break(rj, 1, "resumedFrom differs from the run's link")
    old_id = link.get("resumedFrom")
    if old_id is not None:
        old = idx.runs.get(old_id)
        if old is None:
            notes.append(f"resumed from {old_id}, which is not on disk")
        else:
            old_end = old.get("end")
            old_hash = old_end.get("hash") if isinstance(old_end, dict) else None
            if old_hash != link.get("after"):
                return Break(idx.rel(idx.dirs[old_id] / "run.json"), 1,
                             f"its end record is not the one {run['id']} linked to when it resumed it: it was edited")
    nested = link.get("nestedIn")
    if isinstance(nested, dict):
        parent = idx.runs.get(str(nested.get("runId")))
        parent_link = parent.get("link") if parent else None
        if parent is None:
            notes.append(f"nested in {nested.get('runId')}, which is not on disk")
        elif not isinstance(parent_link, dict) or chain.link_hash(parent_link) != nested.get("after"):
            return Break(idx.rel(idx.dirs[nested["runId"]] / "run.json"), 1,
                         f"its link is not the one nested workflow {run['id']} linked to: it was edited")
    return None


def _end_break(idx: RunIndex, d: Path, run: dict[str, Any], end: Any, link: dict[str, Any] | None) -> Break | None:
    rj = idx.rel(d / "run.json")
    end_link = end.get("link") if isinstance(end, dict) else None
    if not isinstance(end_link, dict):
        return Break(rj, 1, "the end record has no link: it was edited")
    brk = chain.verify_end(rj, end, chain.chain_start(chain.link_hash(end_link), chain.END))
    if brk:
        return brk
    if link is not None and link != end_link:
        return Break(rj, 1, "the run's link differs from the one in its end record: run.json was edited")
    for k in seal.END_FACTS:
        if k in end and run.get(k) != end[k]:
            return Break(rj, 1, f"{k} is {run.get(k)!r} but the end record says {end[k]!r}: run.json was edited")
    return None


def verify_run(idx: RunIndex, run_id: str) -> RunVerdict:
    d = idx.dirs[run_id]
    run = idx.runs[run_id]
    notes: list[str] = []
    end = run.get("end")
    link = run.get("link") if isinstance(run.get("link"), dict) else None
    if end is None and link is None:
        results = [chain.verify_lines(idx.rel(d / n), n, read_bytes(d / n) or b"", None)
                   for n in (seal.JOURNAL, seal.LOG)]
        results += [chain.verify_record(idx.rel(d / name), name, read_bytes(d / name), None)
                    for name in map(chain.agent_chain, agent_numbers(d))]
        chained = next((r for r in results if r.status != "unchained"), None)
        if chained is not None:
            edited = Break(idx.rel(d / "run.json"), 1, f"the run has no link but {chained.name} is chained: "
                                                          f"run.json was edited")
            return RunVerdict(run_id, "broken", results, edited, notes)
        return RunVerdict(run_id, "unchained", results, None, ["written before hash chains: nothing to verify"])

    brk = _end_break(idx, d, run, end, link) if end is not None else None
    if end is None and run.get("status") in ENDED_STATUSES:
        brk = Break(idx.rel(d / "run.json"), 1, f"the run {run.get('status')} but has no end record: "
                                                   f"run.json was edited")
    if end is not None:
        link = end.get("link") if isinstance(end, dict) and isinstance(end.get("link"), dict) else link
    if brk is None and link is not None:
        brk = _link_break(idx, d, run, link, notes)
    if brk is not None or link is None:
        return RunVerdict(run_id, "broken", [], brk or Break(idx.rel(d / "run.json"), 1, "no link"), notes)

    lh = chain.link_hash(link)
    sealed: dict[str, Any] = (end.get("chains") or {}) if end is not None else {}

    def sealed_for(name: str) -> Any:
        return sealed.get(name) if end is not None else NOT_SEALED

    results = [chain.verify_lines(idx.rel(d / n), n, read_bytes(d / n) or b"", chain.chain_start(lh, n), sealed_for(n))
               for n in (seal.JOURNAL, seal.LOG)]
    numbers = set(agent_numbers(d))
    numbers |= {int(k.split("/")[1]) for k in sealed if k.startswith("agents/") and k.split("/")[1].isdigit()}
    unsealed = 0
    for n in sorted(numbers):
        name = chain.agent_chain(n)
        r = chain.verify_record(idx.rel(d / name), name, read_bytes(d / name), chain.chain_start(lh, name),
                                sealed_for(name) if end is None or name in sealed else None)
        if r.status == "unchained":
            unsealed += 1
        results.append(r)
    if unsealed:
        notes.append(f"{unsealed} agent record(s) never reached a final state (in flight when the run stopped)")
    brk = chain.first_break(results)
    if brk is None:
        brk = _files_break(idx, d, end, results)
    status: chain.Status = "broken" if brk else ("intact" if end is not None else "open")
    if end is None:
        notes.append("no end record yet (in flight, or stopped uncleanly and not yet recovered): "
                     "a removed tail cannot be told from a short file")
    for r in results:
        if r.torn:
            notes.append(f"{r.name}: an unfinished last line (a crash mid-write) was ignored")
    return RunVerdict(run_id, status, results, brk, notes)


def _files_break(idx: RunIndex, d: Path, end: Any, results: list[ChainResult]) -> Break | None:
    if isinstance(end, dict):
        files = object_at(end, "files")
        for name, want in sorted(files.items()):
            brk = _file_break(idx, d, name, want, "the run's end record")
            if brk:
                return brk
    for r in results:
        if not r.name.startswith("agents/") or r.last is None:
            continue
        rec = json.loads((d / r.name).read_bytes())
        files = object_at(rec, "files")
        for name, want in sorted(files.items()):
            brk = _file_break(idx, d / Path(r.name).parent, name, want, r.name)
            if brk:
                return brk
    return None
