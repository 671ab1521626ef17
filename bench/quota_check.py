"""The spend quota's cost per run start with many records (issue 24 #3).

    python3 bench/quota_check.py [--runs 3000] [--agents 20] [--active 3] [--live-agents 1000]

Writes `--runs` ended runs of one caller this month, each with `--agents` agent records
(agents/<n>/agent.json, as the daemon writes them), and measures with runs/quota.py:
  - prime: reading them once (what boot does in a worker thread, once per caller);
  - a check (QuotaBook.refusal, what `run`/`resume` add to a start) with `--active`
    active runs of `--live-agents` in-memory agent records each, median of 200;
  - for comparison, what a check would cost re-reading every record (usage.report over
    the month's runs, uncached), median of 5.
Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import attrs
import common  # noqa: F401  (puts the repository on sys.path)

from swarmbase import config, usage
from swarmbase.runs import quota


@attrs.define
class Rec:
    ended_at: float | None
    cost_usd: float
    replayed: bool = False


@attrs.define
class LiveRunStandIn:
    id: str
    caller: str
    budget_usd: float
    active: bool = True


def write_runs(root: Path, runs: int, agents: int, lo: float, now: float) -> list[tuple[str, Path]]:
    out = []
    span = max(1.0, now - lo - 60)
    for i in range(runs):
        d = root / f"run-{i:06d}"
        ended = lo + span * i / runs
        for n in range(1, agents + 1):
            a = d / "agents" / str(n)
            a.mkdir(parents=True)
            (a / "agent.json").write_text(json.dumps({
                "n": n, "state": "done", "engine": "claude", "model": "claude-sonnet-5-5", "costUsd": 0.0123,
                "endedAt": ended, "tokens": {"input": 1000, "output": 100, "total": 1100}}))
        out.append((f"r{i}", d))
    return out


def main(runs: int, agents: int, active: int, live_agents: int) -> None:
    now = time.time()
    lo, _ = quota.bounds("month", now)
    alice = config.Caller(name="alice", tokenSha256="a" * 64, usdPerDay=1e6, usdPerMonth=1e7)
    with tempfile.TemporaryDirectory(prefix="sb-bench-quota-") as tmp:
        dirs = write_runs(Path(tmp), runs, agents, lo, now)
        book = quota.QuotaBook(lambda c, a, b: dirs, read=usage.spent_in)
        t = time.perf_counter()
        book.prime("alice")
        prime_s = time.perf_counter() - t
        for j in range(active):
            book.admit(LiveRunStandIn(f"live{j}", "alice", 5.0),
                       {n: Rec(now - n, 0.001) for n in range(1, live_agents + 1)})
        checks = []
        for _ in range(200):
            t = time.perf_counter()
            assert book.refusal(alice, 5.0) is None
            checks.append((time.perf_counter() - t) * 1000)
        rereads = []
        for _ in range(5):
            t = time.perf_counter()
            usage.report([("alice", d, True) for _, d in dirs], dt_day(lo), dt_day(now))
            rereads.append((time.perf_counter() - t) * 1000)
    print(f"{runs} ended runs x {agents} agent records ({runs * agents:,} records) this month, "
          f"{active} active runs x {live_agents} live agents; load {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"  prime (once per caller, boot, worker thread): {prime_s * 1000:.0f} ms")
    print(f"  check per run start: median {statistics.median(checks):.2f} ms, max {max(checks):.2f} ms (n=200)")
    print(f"  re-reading every record instead: median {statistics.median(rereads):.0f} ms (n=5)")


def dt_day(t: float):  # type: ignore[no-untyped-def]
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).date()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--active", type=int, default=3)
    ap.add_argument("--live-agents", type=int, default=1000)
    a = ap.parse_args()
    main(a.runs, a.agents, a.active, a.live_agents)
