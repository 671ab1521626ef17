"""The run store on disk: runs/<stamp>-<runId>/ with run.json, script.js, log.jsonl,
phases.json, result.json and work/. Whole files are written atomically, logs appended
with fsync, so a crash at any instant leaves every file readable."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

from .. import fsutil
from .model import Run, iso, stamp


class RunStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "runs"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def dir(self, run: Run) -> Path:
        return self.root / run.dir_name

    def work_dir(self, run: Run) -> Path:
        return self.dir(run) / "work"

    def create(self, run: Run, script: str) -> None:
        d = self.root / run.dir_name
        d.mkdir(mode=0o700)
        (d / "work").mkdir(mode=0o700)
        (d / "agents").mkdir(mode=0o700)
        fsutil.write_atomic(d / "script.js", script.encode())
        self.save(run)

    @staticmethod
    def dir_name_for(run_id: str, created_at: float) -> str:
        return f"{stamp(created_at)}-{run_id}"

    def save(self, run: Run) -> None:
        fsutil.write_json(self.dir(run) / "run.json", run.to_json())

    def script(self, run: Run) -> str:
        return (self.dir(run) / "script.js").read_text()

    def append_log(self, run: Run, message: str, level: str = "info") -> dict[str, Any]:
        entry = {"at": iso(time.time()), "level": level, "message": message}
        fsutil.append_line(self.dir(run) / "log.jsonl", entry)
        return entry

    def recent_log(self, run: Run, n: int = 20) -> list[dict[str, Any]]:
        return fsutil.tail_lines(self.dir(run) / "log.jsonl", n)

    def save_phases(self, run: Run, phases: list[dict[str, Any]]) -> None:
        fsutil.write_json(self.dir(run) / "phases.json", phases)

    def phases(self, run: Run) -> list[dict[str, Any]]:
        return fsutil.read_json(self.dir(run) / "phases.json", []) or []

    def save_result(self, run: Run, value: Any) -> None:
        fsutil.write_json(self.dir(run) / "result.json", {"value": value})

    def result_text(self, run: Run) -> str | None:
        """The return value as JSON text, or None if the run returned nothing yet."""
        data = fsutil.read_json(self.dir(run) / "result.json")
        if data is None:
            return None
        return json.dumps(data.get("value"), ensure_ascii=False, indent=1)

    def delete_work(self, run: Run) -> None:
        shutil.rmtree(self.work_dir(run), ignore_errors=True)

    def load_all(self) -> Iterator[Run]:
        """Every run on disk; a run.json that cannot be read is skipped (and reported)."""
        for d in fsutil.iter_dirs(self.root):
            data = fsutil.read_json(d / "run.json")
            if data is None:
                continue
            yield Run.from_json(data)
