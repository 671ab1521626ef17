"""The run store on disk: runs/<stamp>-<runId>/ with run.json, script.js, log.jsonl,
phases.json, result.json, agents/ and work/. Whole files are written atomically, logs
appended with fsync, so a crash at any instant leaves every file readable.

Boot never trusts a file it cannot parse: a run whose run.json is unreadable, or an
entry that is not a run dir, is renamed to `<name>.damaged-<utc>` (bytes kept), reported,
and everything else is served. A damaged file read later (phases, result, log, script)
raises DamagedFile naming it, which tools turn into an error the caller can read.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .. import fsutil
from ..audit.rundirs import chains_from_disk
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


def quarantine(path: Path) -> Path:
    """Rename a damaged file or dir out of the way, keeping its bytes."""
    utc = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{utc}")
    i = 1
    while target.exists():
        target = path.with_name(f"{path.name}.damaged-{utc}-{i}")
        i += 1
    path.rename(target)
    return target


class RunStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.root = state_dir / "runs"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def dir(self, run: Run) -> Path:
        return self.root / run.dir_name

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
    def log_entry(message: str, level: str = "info", at: float | None = None) -> dict[str, Any]:
        return {"at": iso(time.time() if at is None else at), "level": level, "message": message}

    def append_log(self, run: Run, message: str, level: str = "info", chains: Any = None) -> dict[str, Any]:
        entry = self.log_entry(message, level)
        self.append_log_lines(run, [entry], chains)
        return entry

    def append_log_lines(self, run: Run, entries: list[dict[str, Any]], chains: Any = None) -> None:
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

    def recent_log(self, run: Run, n: int = 20) -> list[dict[str, Any]]:
        path = self.dir(run) / "log.jsonl"
        try:
            return fsutil.tail_lines(path, n)
        except OSError as e:
            raise self._damaged(path, e.strerror or type(e).__name__) from None

    # -- phases and result ---------------------------------------------------------
    def save_phases(self, run: Run, phases: list[dict[str, Any]], durable: bool = False) -> None:
        fsutil.write_json(self.dir(run) / "phases.json", phases, durable=durable)

    def phases(self, run: Run) -> list[dict[str, Any]]:
        path = self.dir(run) / "phases.json"
        try:
            data = fsutil.read_json(path, [])
        except (ValueError, OSError) as e:
            raise self._damaged(path, "not valid JSON" if isinstance(e, ValueError) else type(e).__name__) from None
        if not isinstance(data, list) or not all(isinstance(p, dict) for p in data):
            raise self._damaged(path, "not a list of phases")
        return data

    def save_result(self, run: Run, value: Any) -> None:
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
    def create_agent(self, rec: AgentRecord, prompt: str, opts: dict[str, Any]) -> None:
        rec.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fsutil.write_atomic(rec.dir / "prompt.txt", prompt.encode(), durable=False)
        fsutil.write_json(rec.dir / "opts.json", opts, durable=False)
        fsutil.write_json(rec.dir / "agent.json", rec.to_json(), durable=False)

    def delete_work(self, run: Run) -> None:
        shutil.rmtree(self.work_dir(run), ignore_errors=True)

    # -- boot ------------------------------------------------------------------------
    def load_all(self, damaged: Callable[[Path, str], None]) -> Iterator[Run]:
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
                if run.dir_name != name:
                    raise ValueError("run.json belongs to another run dir")
            except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
                fault = str(e) if isinstance(e, ValueError) and "run.json" in str(e) else \
                    f"run.json unreadable ({type(e).__name__}: {str(e)[:120]})"
                damaged(entry, fault)
                continue
            run.stow_end(entry / "run.json")      # an ended run's seal stays on disk until needed
            yield run
