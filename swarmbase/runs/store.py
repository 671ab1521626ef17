"""The run store on disk: runs/<stamp>-<runId>/ with run.json, script.js, log.jsonl,
phases.json, result.json, agents/ and work/. Whole files are written atomically, logs
appended with fsync, so a crash at any instant leaves every file readable.

Boot never trusts a file it cannot parse. A run whose run.json is unreadable or missing is
rebuilt from its other files (runs/rebuild.py), the damaged bytes kept as
`run.json.damaged-<utc>`; only when nothing names its caller is the whole dir renamed to
`<name>.damaged-<utc>`, as is an entry that is not a run dir. A damaged phases.json is
rebuilt from the agent records the same way when it is read. Each is reported (`damaged`,
shown by the dashboard) and everything else is served. Another damaged file read later
(result, log, script) raises DamagedFile naming it, which tools turn into an error the
caller can read.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

from .. import fsutil
from ..audit import rundirs
from ..audit.rundirs import chains_from_disk
from ..audit.seal import RunChains
from ..jsonvalue import Json, JsonObject
from . import archive, rebuild
from .model import Run, iso, stamp
from .records import AgentRecord

log = logging.getLogger("swarmbase.store")
RUN_DIR = re.compile(r"^\d{8}T\d{6}Z-run_[0-9a-f]{12}$")


class DamagedFile(Exception):
    """A run file that cannot be read; str() names it relative to the state dir."""

    def __init__(self, path: Path, fault: str, root: Path | None = None) -> None:
        name = str(path)
        if root is not None:
            try:
                name = str(path.relative_to(root))
            except ValueError:
                pass
        super().__init__(f"{name} is damaged ({fault})")
        self.path = path
        self.fault = fault


def quarantine_name(path: Path) -> Path:
    """A free `<name>.damaged-<utc>` beside `path`."""
    utc = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{utc}")
    i = 1
    while target.exists():
        target = path.with_name(f"{path.name}.damaged-{utc}-{i}")
        i += 1
    return target


def quarantine(path: Path) -> Path:
    """Rename a damaged file or dir out of the way, keeping its bytes."""
    target = quarantine_name(path)
    path.rename(target)
    return target


class RunStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.root = state_dir / "runs"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.damaged: list[JsonObject] = []     # what was found damaged: {path, fault, at}

    # -- damage ------------------------------------------------------------------------
    def report_damage(self, path: Path, fault: str) -> Path:
        """Rename a damaged file or dir out of the way (bytes kept), note it and log it."""
        try:
            moved = quarantine(path)
        except OSError as e:
            moved = path
            fault = f"{fault}; could not rename it: {e.strerror}"
        self.damaged.append({"path": str(moved), "fault": fault, "at": time.time()})
        log.warning("quarantined %s: %s (moved to %s)", path, fault, moved.name)
        return moved

    def _keep_damaged(self, path: Path, raw: bytes, fault: str) -> Path | None:
        """A damaged file about to be replaced by a rebuilt one: its bytes kept beside it
        (copied, so a crash in between leaves the damaged file where it was, to be rebuilt
        again), noted."""
        copy: Path | None = None
        try:
            fsutil.write_atomic(name := quarantine_name(path), raw)
            copy = name
        except OSError as e:
            log.error("could not keep a copy of the damaged %s: %s", path, e.strerror)
        self.damaged.append({"path": str(copy or path), "fault": f"{fault}; rebuilt from the run's other files",
                             "at": time.time()})
        return copy

    def dir(self, run: Run) -> Path:
        if run.archived_at is not None:      # readable once opened (open_archived)
            return archive.open_dir(self.state_dir, run.dir_name)
        return self.root / run.dir_name

    def open_archived(self, run: Run) -> Run:
        """An archived run's files opened for reading, and its whole record (args and
        history too) from them; a run that is not archived as it is. Blocking: call it in
        a worker thread where the loop must not wait."""
        if run.archived_at is None:
            return run
        data = archive.full_record(self.state_dir, run.dir_name)
        try:
            archive.open_run(self.state_dir, run.dir_name)
            full = Run.from_json(data) if data is not None else None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise self._damaged(archive.zip_path(self.state_dir, run.dir_name), f"cannot be opened: {e}") from None
        if full is None:
            raise self._damaged(archive.zip_path(self.state_dir, run.dir_name), "its run.json cannot be read")
        full.archived_at, full.resumed_as = run.archived_at, full.resumed_as or run.resumed_as
        return full

    def work_dir(self, run: Run) -> Path:
        return self.dir(run) / "work"

    def _damaged(self, path: Path, fault: str) -> DamagedFile:
        return DamagedFile(path, fault, self.state_dir)

    def create(self, run: Run, script: str) -> None:
        d = self.root / run.dir_name
        d.mkdir(mode=0o700)
        try:
            (d / "work").mkdir(mode=0o700)
            (d / "agents").mkdir(mode=0o700)
            fsutil.write_atomic(d / "script.js", script.encode())
            self.save(run)
        except BaseException:
            shutil.rmtree(d, ignore_errors=True)
            raise

    @staticmethod
    def dir_name_for(run_id: str, created_at: float) -> str:
        return f"{stamp(created_at)}-{run_id}"

    def save(self, run: Run) -> None:
        fsutil.write_json(self.dir(run) / "run.json", run.to_json())

    def script(self, run: Run) -> str:
        path = self.dir(run) / "script.js"
        try:
            return path.read_text()
        except FileNotFoundError:
            raise self._damaged(path, "missing") from None
        except (OSError, UnicodeDecodeError) as e:
            raise self._damaged(path, type(e).__name__) from None

    # -- the log: appended in batches (one write, one fsync), read from the tail -----
    @staticmethod
    def log_entry(message: str, level: str = "info", at: float | None = None) -> JsonObject:
        return {"at": iso(time.time() if at is None else at), "level": level, "message": message}

    def append_log(self, run: Run, message: str, level: str = "info", chains: RunChains | None = None) -> JsonObject:
        entry = self.log_entry(message, level)
        self.append_log_lines(run, [entry], chains)
        return entry

    def append_log_lines(self, run: Run, entries: list[JsonObject], chains: RunChains | None = None) -> None:
        """Log lines, sealed in the run's chain when it has one. `chains`: the run's
        RunChains if the caller holds it (a live run, boot); else picked up from the files."""
        if not entries:
            return
        if run.sealed:
            # Sealed: a line after the end record reads as tampering to `audit`.
            log.warning("run %s has ended; %d log line(s) not appended", run.id, len(entries))
            return
        if run.link is None:
            fsutil.append_lines(self.dir(run) / "log.jsonl", entries)
            return
        chains = chains or chains_from_disk(self.dir(run), run.link)
        mark = chains.log.mark()
        try:
            fsutil.append_bytes(self.dir(run) / "log.jsonl", b"".join(chains.log.seal_line(e) for e in entries))
        except BaseException:
            chains.log.rollback(mark)
            raise

    def recent_log(self, run: Run, n: int = 20) -> list[JsonObject]:
        path = self.dir(run) / "log.jsonl"
        try:
            return fsutil.tail_lines(path, n)
        except OSError as e:
            raise self._damaged(path, e.strerror or type(e).__name__) from None

    # -- phases and result ---------------------------------------------------------
    def save_phases(self, run: Run, phases: list[JsonObject], durable: bool = False) -> None:
        fsutil.write_json(self.dir(run) / "phases.json", phases, durable=durable)

    def phases(self, run: Run) -> list[JsonObject]:
        """A damaged phases.json is rebuilt from the agent records (and written back); one
        that cannot be read at all (a directory, EIO) raises DamagedFile."""
        path = self.dir(run) / "phases.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise self._damaged(path, e.strerror or type(e).__name__) from None
        try:
            data = json.loads(raw)
            fault = None if isinstance(data, list) and all(isinstance(p, dict) for p in data) else "not a list of phases"
        except (ValueError, RecursionError):
            fault = "not valid JSON"
        if fault is None:
            return data
        phases = rebuild.phases_from_agents(self.agent_records(run))
        self._keep_damaged(path, raw, f"{path} is damaged ({fault})")
        try:
            fsutil.write_json(path, phases)
        except OSError as e:
            log.error("run %s: the rebuilt phases.json could not be written: %s", run.id, e.strerror)
        log.warning("run %s: phases.json was damaged (%s); rebuilt from %d agent records", run.id, fault,
                    sum(len(p["agents"]) for p in phases))
        return phases

    def agent_records(self, run: Run) -> list[AgentRecord]:
        """Every agent record of the run that can be read (the rest are skipped)."""
        return _agent_records(self.dir(run))

    def save_result(self, run: Run, value: Json) -> None:
        fsutil.write_json(self.dir(run) / "result.json", {"value": value})

    def result_text(self, run: Run) -> str | None:
        """The return value as JSON text, or None if the run returned nothing yet."""
        path = self.dir(run) / "result.json"
        try:
            data = fsutil.read_json(path)
        except (ValueError, OSError) as e:
            raise self._damaged(path, "not valid JSON" if isinstance(e, ValueError) else type(e).__name__) from None
        if data is None:
            return None
        if not isinstance(data, dict) or "value" not in data:
            raise self._damaged(path, "no value")
        return json.dumps(data.get("value"), ensure_ascii=False, indent=1)

    # -- agents --------------------------------------------------------------------
    def create_agent(self, rec: AgentRecord, prompt: str, opts: JsonObject) -> None:
        self.write_agent_inputs(rec.dir, prompt, opts)
        fsutil.write_json(rec.dir / "agent.json", rec.to_json(), durable=False)

    @staticmethod
    def write_agent_inputs(agent_dir: Path, prompt: str, opts: JsonObject) -> None:
        """An agent's dir with what it was asked (its record is written beside it)."""
        agent_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fsutil.write_atomic(agent_dir / "prompt.txt", prompt.encode(), durable=False)
        fsutil.write_json(agent_dir / "opts.json", opts, durable=False)

    def delete_work(self, run: Run) -> None:
        shutil.rmtree(self.work_dir(run), ignore_errors=True)

    # -- boot ------------------------------------------------------------------------
    def load_all(self, damaged: Callable[[Path, str], object]) -> Iterator[Run]:
        """Every readable run on disk; whatever cannot be read is quarantined and reported
        through `damaged(path, fault)`."""
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if ".damaged-" in name or name.startswith("."):
                continue
            if not RUN_DIR.fullmatch(name):
                if entry.is_dir():
                    continue          # not ours (and not a run): leave it alone
                damaged(entry, "not a run directory")
                continue
            if not entry.is_dir():
                damaged(entry, "a file where a run directory should be")
                continue
            try:
                data = fsutil.read_json(entry / "run.json")
                if data is None:
                    raise ValueError("run.json is missing")
                if not isinstance(data, dict):
                    raise ValueError("run.json is not an object")
                run = Run.from_json(data)
            except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
                fault = str(e) if isinstance(e, ValueError) and "run.json" in str(e) else \
                    f"run.json unreadable ({type(e).__name__}: {str(e)[:120]})"
                rebuilt = self._rebuild_run(entry, fault)
                if rebuilt is None:
                    damaged(entry, fault)
                    continue
                run = rebuilt
            if run.dir_name != name:
                damaged(entry, "run.json belongs to another run dir")
                continue
            run.stow_end(entry / "run.json")      # an ended run's seal stays on disk until needed
            yield run

    def _rebuild_run(self, d: Path, fault: str) -> Run | None:
        """A run whose run.json cannot be read, rebuilt from its other files and written
        back (the damaged bytes kept beside it); None when nothing names its caller."""
        raw = rundirs.read_bytes(d / "run.json") or b""
        lines, _ = fsutil.read_lines(d / "journal.jsonl")
        head = lines[0] if lines and isinstance(lines[0], dict) else None
        try:
            script = (d / "script.js").read_text()
        except (OSError, UnicodeDecodeError):
            script = None
        result = rundirs.read_json(d / "result.json")
        has_result = (isinstance(result, dict) and "value" in result, _mtime(d / "result.json"))
        last_log = next(iter(fsutil.tail_lines(d / "log.jsonl", 1)), None) if (d / "log.jsonl").is_file() else None
        now = time.time()
        copy_name = quarantine_name(d / "run.json").name if raw else None
        run = rebuild.run_from_parts(d.name, rebuild.salvage_object(raw), journal_head=head,
                                     agents=_agent_records(d), script=script, result=has_result,
                                     last_log=last_log, log_at=_mtime(d / "log.jsonl"), fault=fault,
                                     damaged_copy=copy_name, now=now)
        if run is None:
            return None
        if raw:
            copy = self._keep_damaged(d / "run.json", raw, f"{d / 'run.json'}: {fault}")
            if run.rebuilt is not None:
                run.rebuilt["damagedCopy"] = copy.name if copy else None
        else:
            self.damaged.append({"path": str(d / "run.json"), "fault": f"{fault}; rebuilt from the run's other files",
                                 "at": now})
        try:
            self.save(run)
        except OSError as e:
            log.error("run %s: its rebuilt run.json could not be written (%s); served from memory", run.id, e.strerror)
        log.warning("run %s: %s; rebuilt from its journal, agents, log and result (%s; not recovered: %s)",
                    run.id, fault, run.status, ", ".join(run.rebuilt["lost"]) if run.rebuilt else "-")
        return run


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _agent_records(run_dir: Path) -> list[AgentRecord]:
    out = []
    for n, data in rundirs.agent_records(run_dir):
        try:
            out.append(AgentRecord.from_json(data, run_dir / "agents" / str(n)))
        except (ValueError, KeyError, TypeError):
            continue
    return out
