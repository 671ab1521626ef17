"""Crash-only figures (issue 9).

    python3 bench/crash_only.py [--trials 10] [--runs 2000]

1. kill -9 of the daemon with 8 real claude agents waiting on the (fake) model: how many
   of its processes are alive 2 s later, and whether any request reached the API after
   the kill, over `--trials` trials.
2. Daemon RSS after 10 trivial runs and after `--runs` (memory per finished run).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os

import trio

from common import CLAUDE, rss_mb, start, state_dir, stop, write_config  # noqa: E402  (bench/ on sys.path)
from swarmbase.client import connect
from swarmbase.launch.procs import process_start_time

from conftest import descendants, process_table  # noqa: E402
from fakes.anthropic_api import FakeAnthropic  # noqa: E402


def alive(pids: list[int], needle: bytes) -> list[int]:
    table = process_table()
    left = {p for p in pids if p in table and table[p][1] not in ("Z", "X") and process_start_time(p) is not None}
    left |= {p for p, (_, st, cmd) in table.items() if needle in cmd and st not in ("Z", "X") and p != os.getpid()}
    return sorted(left)


async def kill_trial(nursery: trio.Nursery, api: FakeAnthropic) -> tuple[int, int, float]:
    state = state_dir("sb-crash-")
    token = write_config(state, {"engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                                 "perRunConcurrency": 8, "maxConcurrentAgents": 8})
    d = await start(state, token, nursery)
    seen = len(api.requests)
    async with connect(d.ws, token) as h:
        await h.handshake()
        await h.tool("run", {"script": "return await parallel(Array.from({length: 8}, (_, i) => () => "
                                       "agent('[[sleep:120]] ' + i, {maxUsd: 1})))", "budgetUsd": 20})
    while len(api.requests) - seen < 8:
        await trio.sleep(0.05)
    tree = descendants(d.proc.pid)
    d.proc.kill()
    await d.proc.wait()
    killed = trio.current_time()
    t0 = trio.current_time()
    while alive(tree, str(state).encode()) and trio.current_time() - t0 < 2:
        await trio.sleep(0.01)
    gone_after = trio.current_time() - t0
    await trio.sleep(max(0.0, 2 - gone_after))
    left = alive(tree, str(state).encode())
    late = [r for r in api.requests if r["at"] > killed]
    return len(left), len(late), gone_after


async def rss_over_runs(nursery: trio.Nursery, runs: int) -> tuple[float, float, float]:
    state = state_dir("sb-rss-")
    token = write_config(state)
    d = await start(state, token, nursery)
    marks = {}
    try:
        async with connect(d.ws, token) as h:
            await h.handshake()
            for i in range(runs):
                rid = (await h.tool("run", {"script": f"log('run {i}'); return {i}"}))["structuredContent"]["runId"]
                await h.wait_notice(f"{rid}:end")
                if i + 1 in (10, runs // 2, runs):
                    await trio.sleep(1.0)
                    marks[i + 1] = rss_mb(d.proc.pid)
    finally:
        await stop(d)
    return marks[10], marks[runs // 2], marks[runs]


async def main(trials: int, runs: int) -> None:
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeAnthropic().serve)
        results = [await kill_trial(nursery, api) for _ in range(trials)]
        left = [r[0] for r in results]
        late = [r[1] for r in results]
        gone = [r[2] * 1000 for r in results]
        print(f"kill -9 with 8 agents, {trials} trials: processes alive 2 s after: {left} "
              f"(max {max(left)}); API requests after the kill: {sum(late)}; "
              f"all gone after median {sorted(gone)[len(gone) // 2]:.0f} ms, max {max(gone):.0f} ms")
        r10, rhalf, rall = await rss_over_runs(nursery, runs)
        print(f"daemon RSS after 10 runs {r10:.1f} MB, after {runs // 2} {rhalf:.1f} MB, after {runs} {rall:.1f} MB "
              f"(+{rall - r10:.1f} MB, {1024 * (rall - r10) / max(1, runs - 10):.1f} KB per run)")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--runs", type=int, default=2000)
    a = p.parse_args()
    trio.run(main, a.trials, a.runs)
