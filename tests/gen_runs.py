"""Generated run dirs for the run list at scale (tests and bench/dashboard_pages.py):
what a busy daemon leaves on disk, written without fsyncs so 10,000 take seconds."""

from __future__ import annotations

import random
from pathlib import Path

from swarmbase import fsutil
from swarmbase.runs.model import Run, iso
from swarmbase.runs.store import RunStore

CALLERS = ("alice", "bob", "carol")
STATUSES = ("completed",) * 6 + ("failed", "failed", "cancelled", "interrupted")
T0 = 1_780_000_000.0        # 2026-05-28


def generate(state: Path, n: int, seed: int = 3) -> list[Run]:
    """n ended runs, one a minute from T0; a third labelled, a third with meta.name, a third
    with neither (named after the script's leading comment, read from script.js: their
    records are as old ones were, without scriptComment)."""
    rng = random.Random(seed)
    root = state / "runs"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    runs = []
    for i in range(n):
        created = T0 + i * 60.0 + rng.random()
        run_id = f"run_{rng.getrandbits(48):012x}"
        kind = i % 3
        run = Run(id=run_id, caller=CALLERS[(i // 3) % 3], dir_name=RunStore.dir_name_for(run_id, created),
                  created_at=created, label=f"nightly build {i}" if kind == 0 else None,
                  meta={"name": f"review batch {i}"} if kind == 1 else None, status=rng.choice(STATUSES),
                  budget_usd=5.0, spent_usd=round(rng.random() * 2, 6), agents_total=8, agents_done=8,
                  ended_at=created + 30)
        if run.status != "completed":
            run.error = f"{run.status}: generated"
        run.history = [{"status": "queued", "at": iso(created)}, {"status": run.status, "at": iso(created + 30)}]
        d = root / run.dir_name
        d.mkdir(mode=0o700)
        fsutil.write_json(d / "run.json", run.to_json(), durable=False)
        fsutil.write_atomic(d / "script.js", f"// triage issue {i}\nreturn await agent('x')\n".encode(), durable=False)
        runs.append(run)
    return runs


def expected_label(run: Run, i: int) -> str:
    return run.label or (run.meta or {}).get("name") or f"triage issue {i}"
