"""What a per-caller uid costs at agent start (issue 31 item 1), as root.

    python3 bench/identities.py [--n 50] [--agents 10]

- sandbox start: the local launcher starting a child the way an agent starts (a private
  dir with a file, handed to the child's uid; outer bwrap, setpriv, inner bwrap, seccomp;
  until its first line), as the old shared `sandboxUser` ("nobody") and as a caller's own
  uid from `sandboxUids`; alternated start by start, median of n each;
- agent start: a real claude agent (profile read: its CLI, not an in-daemon think call)
  against the fake API (`run` → its result) on a daemon with `sandboxUser: "nobody"` and
  one with the default per-caller uids, alternated run by run (0 skips it).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import trio

from common import CLAUDE, first_line_ms, start, state_dir, stop, summary, write_config  # noqa: E402
from swarmbase import identity
from swarmbase.client import connect
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


async def sandbox_starts(n: int) -> dict[str, list[float]]:
    tmp = state_dir("sb-ids-")
    tmp.chmod(0o755)             # the cwd: readable by either uid
    launchers = {}
    for name, user in (("shared nobody", "nobody"), ("per-caller uid", None)):
        (tmp / name / "procs").mkdir(parents=True)
        launchers[name] = LocalLauncher(mode="bwrap", homes=tmp / name / "homes", procs=tmp / name / "procs",
                                        sandbox_user=user)
    spec = LaunchSpec(argv=("/bin/echo", "ready"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="k",
                      files={"prompt.txt": b"hi"}, read=(str(tmp),), owner="alice")
    out: dict[str, list[float]] = {name: [] for name in launchers}
    for _ in range(n):
        for name, launcher in launchers.items():
            out[name].append(await first_line_ms(launcher, spec))
    return out


async def agent_starts(n: int, nursery: trio.Nursery) -> dict[str, list[float]]:
    api = await nursery.start(FakeAnthropic().serve)
    daemons = {}
    for name, extra in (("shared nobody", {"sandboxUser": "nobody"}), ("per-caller uid", {})):
        state = state_dir("sb-ids-d-")
        token = write_config(state, {"engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api.url}}, **extra})
        daemons[name] = (await start(state, token, nursery), token)
    out: dict[str, list[float]] = {name: [] for name in daemons}
    try:
        for _ in range(n):
            for name, (d, token) in daemons.items():
                async with connect(d.ws, token) as h:
                    await h.handshake()
                    t = time.perf_counter()
                    rid = (await h.tool("run", {"script": "return await agent('hi', {profile: 'read'})"}))["structuredContent"]["runId"]
                    await h.wait_notice(f"{rid}:end")
                    out[name].append((time.perf_counter() - t) * 1000)
    finally:
        for d, _ in daemons.values():
            await stop(d)
    return out


def report(title: str, figures: dict[str, list[float]]) -> None:
    print(title)
    for name, values in figures.items():
        print(f"  {name}: {summary(values)}")
    old, new = (statistics.median(v) for v in figures.values())
    print(f"  per-caller - shared: {new - old:+.1f} ms ({(new - old) / old * 100:+.1f} %)")


async def main(n: int, agents: int) -> None:
    if os.geteuid() != 0:
        raise SystemExit("run it as root: per-caller uids are a root daemon's")
    print(f"sandboxUids {identity.DEFAULT_UIDS}; load {os.getloadavg()[0]:.2f}")
    report(f"sandbox start to first line, alternated, n={n} each:", await sandbox_starts(n))
    if agents:
        async with trio.open_nursery() as nursery:
            report(f"claude agent run (run -> end notice), alternated, n={agents} each:",
                   await agent_starts(agents, nursery))
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--agents", type=int, default=10)
    a = ap.parse_args()
    trio.run(main, a.n, a.agents)
