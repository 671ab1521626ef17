"""What the sandbox costs at start-up (issue 13).

    python3 bench/isolation.py [--n 50]

- process start: the local launcher running a trivial program (exit at once), with the
  sandbox and without, median of n;
- agent start: a real claude agent against the fake API (`run` → its result), in a daemon
  with the sandbox and one without;
- runner start: a trivial run (`run` → end notice) with and without.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import trio

from common import CLAUDE, start, state_dir, stop, summary, write_config  # noqa: E402
from swarmbase.client import connect
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


async def process_starts(mode: str, n: int) -> list[float]:
    tmp = state_dir("sb-iso-")
    (tmp / "procs").mkdir()
    launcher = LocalLauncher(mode=mode, homes=tmp / "homes", procs=tmp / "procs")
    spec = LaunchSpec(argv=("/bin/echo", "ready"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="k",
                      files={"x": b"1"}, read=(str(tmp),))
    out = []
    for _ in range(n):
        t = time.perf_counter()
        first: list[float] = []

        def on_line(line: bytes) -> bool:
            first.append(time.perf_counter())
            return True
        await launcher.run(spec, on_line)
        out.append((first[0] - t) * 1000)
    return out


async def through_daemon(mode: str, api_url: str, n: int, nursery: trio.Nursery) -> tuple[list[float], list[float]]:
    state = state_dir(f"sb-iso-{mode}-")
    token = write_config(state, {"sandbox": mode, "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api_url}}})
    d = await start(state, token, nursery)
    agents, runs = [], []
    try:
        async with connect(d.ws, token) as h:
            await h.handshake()
            for script, into in (("return 1", runs), ("return await agent('hi')", agents)):
                for _ in range(n):
                    t = time.perf_counter()
                    rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                    await h.wait_notice(f"{rid}:end")
                    into.append((time.perf_counter() - t) * 1000)
    finally:
        await stop(d)
    return agents, runs


async def main(n: int) -> None:
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeAnthropic().serve)
        for mode in ("bwrap", "none"):
            print(f"[{mode}] process start to first line: {summary(await process_starts(mode, n))}")
        res = {mode: await through_daemon(mode, api.url, min(n, 20), nursery) for mode in ("bwrap", "none")}
        for mode, (agents, runs) in res.items():
            print(f"[{mode}] claude agent run (run → end notice, one agent): {summary(agents)}")
            print(f"[{mode}] trivial run (runner start included): {summary(runs)}")
        d_agent = statistics.median(res["bwrap"][0]) - statistics.median(res["none"][0])
        d_run = statistics.median(res["bwrap"][1]) - statistics.median(res["none"][1])
        print(f"sandbox cost: {d_agent:+.1f} ms per agent, {d_run:+.1f} ms per runner (medians)")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50)
    trio.run(main, p.parse_args().n)
