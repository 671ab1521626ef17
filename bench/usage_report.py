"""Spend report cost: `usage` over many agent records, cold (first read) and warm (the
daemon's cache of ended runs).

    python3 bench/usage_report.py [--runs 100] [--agents 200]

Writes --runs ended runs of --agents agent records each (the real record writers), then
times usage.report over all of them: from disk without a cache (the CLI), a first call
with the daemon's cache, and a second call. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import usage  # noqa: E402
from tests.audit_runs import AgentSpec, write_run  # noqa: E402


def main(runs: int, agents: int) -> None:
    state = Path(tempfile.mkdtemp(prefix="sb-bench-usage-")) / "state"
    t = time.perf_counter()
    for _ in range(runs):
        write_run(state, [AgentSpec(f"a{i}") for i in range(agents)], log=[])
    print(f"wrote {runs} runs × {agents} agents in {time.perf_counter() - t:.1f} s")
    first, last = usage.date_range(None, None)
    dirs = usage.runs_on_disk(state, first, last, None)
    cache = usage.SpentCache()
    for name, c in (("no cache (CLI)", None), ("daemon, first call", cache), ("daemon, second call", cache)):
        t = time.perf_counter()
        rep = usage.report(dirs, first, last, c)
        s = time.perf_counter() - t
        print(f"  {name:<20} {s * 1000:8.1f} ms for {rep['totals']['agents']:,} agents "
              f"({s / max(1, rep['totals']['agents']) * 1e6:.1f} µs per agent)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--agents", type=int, default=200)
    a = p.parse_args()
    main(a.runs, a.agents)
