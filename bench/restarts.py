"""Notices per run across SIGTERM restarts (issue 25 #2).

    python3 bench/restarts.py [--restarts 10]

Each restart: a real daemon process, an acknowledging host connected, one run stopped by
SIGTERM (2 of its 4 fake-CLI agents finished) and one completed run whose push is on the
wire, its answer held until the daemon is draining; a `run` sent after the SIGTERM. A last
start delivers whatever is left (a barrier run). Prints how many times the host was sent
each run's end notice (target: exactly 1 for every run), how many late runs were refused
(target: all), and the interrupted runs' agentsDone (target: 2). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import common  # noqa: F401  (puts the repository and tests/ on sys.path)
import trio

from tests.restarts import run_dir, sigterm_cycles


async def main(restarts: int) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sb-bench-restarts-") as tmp:
        cycles, host, state, _ = await sigterm_cycles(Path(tmp), restarts)
        done = [json.loads((run_dir(state, c.interrupted) / "run.json").read_text())["agentsDone"] for c in cycles]
    per_run = Counter(host.pushes.values())
    refused = sum(1 for c in cycles if c.late.get("isError") and "accepts no new runs" in str(c.late))
    print(f"{restarts} SIGTERM restarts, {len(host.pushes)} runs, {time.monotonic() - started:.0f} s")
    print(f"  notices delivered per run: {dict(sorted(per_run.items()))} (deliveries: runs)")
    print(f"  held answers (push on the wire at SIGTERM) delivered once: "
          f"{sum(host.pushes[c.held + ':end'] == 1 for c in cycles)} of {len(cycles)}")
    print(f"  runs sent after SIGTERM refused: {refused} of {len(cycles)}")
    print(f"  interrupted runs' agentsDone (2 of 4 finished): {dict(sorted(Counter(done).items()))}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--restarts", type=int, default=10)
    trio.run(main, p.parse_args().restarts)
