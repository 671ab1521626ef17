"""What the sandbox costs at start-up (issue 13) and what the network allow-list adds
(issue 20).

    python3 bench/isolation.py [--n 50]

- process start: the local launcher running a trivial program (exit at once), median of
  n: without the sandbox; sandboxed on the host's network (the old agent set-up);
  sandboxed with `--unshare-net` (an empty namespace, what runners get); sandboxed with an
  allow-list of one door (what every agent gets now: netns_init, then bubblewrap);
- relay: 64 MB through one door (a connection from inside the namespace to a loopback
  sink, carried by the daemon's relay) against the same to the sink directly, MB/s;
- agent start: a real claude agent against the fake API (`run` → its result), in a daemon
  with the sandbox and one without, n runs each (run it on the code before a change for
  the "before" figure: the script's daemon part is the same);
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
from swarmbase.launch.egress import Endpoint
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


async def process_starts(mode: str, n: int, network: bool = True,
                         egress: tuple[Endpoint, ...] | None = None) -> list[float]:
    tmp = state_dir("sb-iso-")
    (tmp / "procs").mkdir()
    launcher = LocalLauncher(mode=mode, homes=tmp / "homes", procs=tmp / "procs")
    spec = LaunchSpec(argv=("/bin/echo", "ready"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="k",
                      files={"x": b"1"}, read=(str(tmp),), network=network, egress=egress)
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


async def sink(lsock: trio.socket.SocketType, counts: list[int]) -> None:
    while True:
        conn, _ = await lsock.accept()
        with conn:
            got = 0
            while chunk := await conn.recv(1 << 16):
                got += len(chunk)
            counts.append(got)


async def relay_rate(through_door: bool, mb: int = 64) -> float:
    """MB/s of `mb` MB written by a Python client to a loopback sink: from inside an
    agent-like namespace through its one door, or directly from the host."""
    tmp = state_dir("sb-relay-")
    (tmp / "procs").mkdir()
    lsock = trio.socket.socket()
    await lsock.bind(("127.0.0.1", 0))
    lsock.listen()
    port = lsock.getsockname()[1]
    sender = ("import socket,sys; s=socket.create_connection(('127.0.0.1', %d)); b=bytes(1<<20)\n"
              "for _ in range(%d): s.sendall(b)\ns.close()" % (port, mb))
    python = "/usr/bin/python3"
    counts: list[int] = []
    async with trio.open_nursery() as n:
        n.start_soon(sink, lsock, counts)
        t = time.perf_counter()
        if through_door:
            launcher = LocalLauncher(mode="bwrap", homes=tmp / "homes", procs=tmp / "procs")
            spec = LaunchSpec(argv=(python, "-c", sender), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="r",
                              read=(str(tmp),), egress=(Endpoint("127.0.0.1", port),))
            await launcher.run(spec, lambda line: False)
        else:
            await trio.run_process([python, "-c", sender])
        while not counts:
            await trio.sleep(0.001)
        elapsed = time.perf_counter() - t
        n.cancel_scope.cancel()
    assert counts[0] == mb << 20, counts
    return mb / elapsed


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
        starts = {
            "none": await process_starts("none", n),
            "bwrap, host network (before)": await process_starts("bwrap", n),
            "bwrap --unshare-net": await process_starts("bwrap", n, network=False),
            "bwrap + allow-list (now)": await process_starts("bwrap", n, egress=(Endpoint("127.0.0.1", 9),)),
        }
        for name, values in starts.items():
            print(f"[{name}] process start to first line: {summary(values)}")
        d_net = statistics.median(starts["bwrap + allow-list (now)"]) - statistics.median(
            starts["bwrap, host network (before)"])
        print(f"allow-list cost: {d_net:+.1f} ms per process start (medians)")
        for door in (False, True):
            rates = [await relay_rate(door) for _ in range(5)]
            print(f"[{'through a door' if door else 'direct'}] 64 MB to a loopback sink: "
                  f"median {statistics.median(rates):.0f} MB/s (n=5)")
        res = {mode: await through_daemon(mode, api.url, n, nursery) for mode in ("bwrap", "none")}
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
