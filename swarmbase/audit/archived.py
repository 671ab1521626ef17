"""Archived runs for the audit: a run retention archived (runs-archive/<dirName>.zip, see
swarmbase/runs/archive.py), and the runs it resumed, extracted to a private temp dir for
as long as the audit reads them, so every check runs on the very bytes that were
archived. Paths in breaks read `runs-archive/<dirName>.zip:<file>`. Read-only on the
state dir, like the rest of the audit."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..runs.archive import extract, root
from .rundirs import RunIndex, read_json

MAX_CHAIN = 1_000


def find(state_dir: Path, run_id: str) -> Path | None:
    """The archive of `run_id` (named <stamp>-<runId>.zip), if there is one."""
    if not run_id.replace("_", "").isalnum():
        return None
    found = sorted(root(state_dir).glob(f"*-{run_id}.zip"))
    return found[0] if found else None


@contextmanager
def opened(idx: RunIndex, run_id: str) -> Iterator[RunIndex]:
    """`idx` with the archived ones among `run_id` and the runs it resumed added."""
    tmp: Path | None = None
    try:
        rid: Any = run_id
        seen: set[str] = set()
        while isinstance(rid, str) and rid not in seen and len(seen) < MAX_CHAIN:
            seen.add(rid)
            if rid not in idx.dirs:
                z = find(idx.state_dir, rid)
                if z is None:
                    break
                tmp = tmp or Path(tempfile.mkdtemp(prefix="swarmbase-audit-"))
                d = tmp / z.name[: -len(".zip")]
                extract(z, d)
                data = read_json(d / "run.json")
                if not isinstance(data, dict) or data.get("id") != rid:
                    idx.unreadable.append(d)
                    break
                idx.dirs[rid], idx.runs[rid] = d, data
                idx.shown[str(d)] = f"{root(idx.state_dir).name}/{z.name}:"
            rid = idx.runs[rid].get("resumedFrom")
        yield idx
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
