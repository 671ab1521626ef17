"""Reading run dirs for the audit, usage and spend views: read-only, never trusting a file
to parse (a damaged file reads as None and the caller says so)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import attrs


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def read_json(path: Path) -> Any:
    data = read_bytes(path)
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def agent_numbers(run_dir: Path) -> list[int]:
    d = run_dir / "agents"
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit() and p.is_dir())


def agent_records(run_dir: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(n, agent.json) for every agent whose record parses."""
    for n in agent_numbers(run_dir):
        rec = read_json(run_dir / "agents" / str(n) / "agent.json")
        if isinstance(rec, dict):
            yield n, rec


@attrs.define
class RunIndex:
    """Every run dir under <state>/runs by run id, with its run.json (None if unreadable)."""
    state_dir: Path
    dirs: dict[str, Path] = attrs.Factory(dict)
    runs: dict[str, dict[str, Any]] = attrs.Factory(dict)
    unreadable: list[Path] = attrs.Factory(list)
    # A folder read in place of an archive (audit/archived.py) -> how its paths are shown.
    shown: dict[str, str] = attrs.Factory(dict)

    @classmethod
    def scan(cls, state_dir: Path) -> "RunIndex":
        idx = cls(state_dir)
        root = state_dir / "runs"
        if not root.is_dir():
            return idx
        for d in sorted(root.iterdir()):
            if not d.is_dir():
                continue
            data = read_json(d / "run.json")
            if isinstance(data, dict) and isinstance(data.get("id"), str):
                idx.dirs[data["id"]] = d
                idx.runs[data["id"]] = data
            else:
                idx.unreadable.append(d)
        return idx

    @classmethod
    def around(cls, state_dir: Path, run_id: str) -> "RunIndex":
        """Only what verifying one run needs: it, the run it resumed and the run it is
        nested in (found by dir name, <stamp>-<runId>, without reading other runs)."""
        idx = cls(state_dir)
        todo = [run_id]
        while todo and len(idx.dirs) < 3:
            rid = todo.pop()
            if rid in idx.dirs or not rid.replace("_", "").isalnum():
                continue
            for d in sorted((state_dir / "runs").glob(f"*-{rid}")):
                data = read_json(d / "run.json")
                if isinstance(data, dict) and data.get("id") == rid:
                    idx.dirs[rid], idx.runs[rid] = d, data
                    if rid == run_id:
                        nested = data.get("nestedIn")
                        todo += [x for x in (data.get("resumedFrom"),
                                             nested.get("runId") if isinstance(nested, dict) else None)
                                 if isinstance(x, str)]
        return idx

    def rel(self, path: Path) -> str:
        """A path as shown to the user: relative to the state dir (inside an archive:
        `runs-archive/<dirName>.zip:<file>`)."""
        for folder, name in self.shown.items():
            if str(path).startswith(folder + "/") or str(path) == folder:
                return name + str(path)[len(folder) + 1:]
        try:
            return str(path.relative_to(self.state_dir))
        except ValueError:
            return str(path)

    def nested_children(self, run_id: str) -> list[str]:
        """Runs whose run.json says they are nested workflows of `run_id`, oldest first."""
        kids = [rid for rid, r in self.runs.items()
                if isinstance(r.get("nestedIn"), dict) and r["nestedIn"].get("runId") == run_id]
        return sorted(kids, key=lambda rid: self.runs[rid].get("createdAt") or 0)

    def resumed_chain(self, run_id: str) -> list[str]:
        """The runs `run_id` resumed, newest first (it, then what it resumed, ...); stops at
        a missing run or a cycle."""
        out: list[str] = []
        seen = {run_id}
        cur = self.runs.get(run_id, {}).get("resumedFrom")
        while isinstance(cur, str) and cur in self.runs and cur not in seen:
            out.append(cur)
            seen.add(cur)
            cur = self.runs[cur].get("resumedFrom")
        return out


def _digests(folder: Path, names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        data = read_bytes(folder / name)
        if data is not None:
            out[name] = hashlib.sha256(data).hexdigest()
    return out


def end_files(run_dir: Path) -> dict[str, str]:
    """The sha256 of the whole files a run's end record fixes: script.js and result.json
    (when the run returned a value)."""
    return _digests(run_dir, ("script.js", "result.json"))


def agent_files(agent_dir: Path) -> dict[str, str]:
    """The sha256 of an agent's prompt, options and transcript, for its final record."""
    return _digests(agent_dir, ("prompt.txt", "opts.json", "transcript.jsonl"))


def chains_from_disk(run_dir: Path, link: dict[str, Any]) -> Any:
    """The run's chains picked up from its files: to seal a run that a dead daemon left in
    flight (boot's recover) or to go on appending after a restart."""
    from .seal import RunChains
    agents = {n: data for n in agent_numbers(run_dir)
              if (data := read_bytes(run_dir / "agents" / str(n) / "agent.json")) is not None}
    return RunChains.resume(link, read_bytes(run_dir / "journal.jsonl") or b"",
                            read_bytes(run_dir / "log.jsonl") or b"", agents)
