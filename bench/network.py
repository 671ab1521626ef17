"""What the network allow-list adds to a sandboxed start (issue 20, item 4); the
privilege part of the sandbox is measured by bench/isolation.py.

    python3 bench/network.py [--n 50]

- process start: the local launcher running a trivial program (exit at once), median of
  n: without the sandbox; sandboxed on the host's network (the old agent set-up);
  sandboxed with `--unshare-net` (an empty namespace, what runners get); sandboxed with an
  allow-list of one door (what every agent gets now), made by the daemon (root) or by the
  netns_init helper (a daemon that is not root), with and without a user namespace;
- relay: 64 MB through one door (a connection from inside the namespace to a loopback
  sink, carried by the daemon's relay) against the same to the sink directly, MB/s;
- agent start: a real claude agent against the fake API (`run` → its end notice), n times
  in turn in a daemon with the sandbox, one without, and with `--before DIR` one running
  the code of that checkout (e.g. the main branch before this change) with the sandbox;
- runner start: a trivial run (`run` → end notice) with and without.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import trio

from common import CLAUDE, first_line_ms, start, state_dir, stop, summary, write_config  # noqa: E402
from swarmbase.client import connect
from swarmbase.launch.egress import Endpoint
from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


VARIANTS = {   # name -> (sandbox mode, LaunchSpec/launcher settings)
    "none": ("none", {}),
    "bwrap, host network (before)": ("bwrap", {}),
    "bwrap --unshare-net": ("bwrap", {"network": False}),
    "bwrap + allow-list (now)": ("bwrap", {"egress": (Endpoint("127.0.0.1", 9),), "kind": "thread"}),
    "bwrap + allow-list, helper (a daemon not root)": ("bwrap", {"egress": (Endpoint("127.0.0.1", 9),),
                                                                "kind": "helper"}),
    "bwrap + allow-list, helper + user namespace": ("bwrap", {"egress": (Endpoint("127.0.0.1", 9),),
                                                             "kind": "userns"}),
}


async def process_starts(n: int) -> dict[str, list[float]]:
    """Start to first line of a trivial program, every variant in turn n times (interleaved,
    so a load change on the machine hits them all alike)."""
    tmp = state_dir("sb-iso-")
    tmp.chmod(0o755)             # the cwd: readable by the sandbox user when the bench runs as root
    (tmp / "procs").mkdir()
    runs = []
    for name, (mode, kw) in VARIANTS.items():
        launcher = LocalLauncher(mode=mode, homes=tmp / "homes", procs=tmp / "procs", netns_kind=kw.get("kind"))
        spec = LaunchSpec(argv=("/bin/echo", "ready"), env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp), key="k",
                          files={"x": b"1"}, read=(str(tmp),), network=kw.get("network", True),
                          egress=kw.get("egress"))
        runs.append((name, launcher, spec))
    out: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(n):
        for name, launcher, spec in runs:
            out[name].append(await first_line_ms(launcher, spec))
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


async def through_daemons(api_url: str, n: int, nursery: trio.Nursery,
                          before: Path | None) -> dict[str, tuple[list[float], list[float]]]:
    """A trivial run and a one-agent run, n times each, in turn on every daemon: sandboxed,
    unsandboxed, and (with `before`) sandboxed running that checkout's code."""
    daemons = {}
    for name, mode, code in (("bwrap", "bwrap", None), ("none", "none", None), ("bwrap, before", "bwrap", before)):
        if name.endswith("before") and before is None:
            continue
        state = state_dir(f"sb-iso-{mode}-")
        token = write_config(state, {"sandbox": mode, "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api_url}}})
        daemons[name] = await start(state, token, nursery, code)
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in daemons}
    try:
        async with contextlib.AsyncExitStack() as stack:
            hosts = {}
            for name, d in daemons.items():
                hosts[name] = await stack.enter_async_context(connect(d.ws, d.token))
                await hosts[name].handshake()
            for _ in range(n):
                for name, h in hosts.items():
                    for script, into in (("return 1", out[name][1]), ("return await agent('hi')", out[name][0])):
                        t = time.perf_counter()
                        rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                        await h.wait_notice(f"{rid}:end")
                        into.append((time.perf_counter() - t) * 1000)
    finally:
        for d in daemons.values():
            await stop(d)
    return out


async def main(n: int, before: Path | None) -> None:
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeAnthropic().serve)
        starts = await process_starts(n)
        for name, values in starts.items():
            print(f"[{name}] process start to first line: {summary(values)}")
        base = statistics.median(starts["bwrap, host network (before)"])
        for name in [k for k in starts if "allow-list" in k]:
            print(f"{name}: {statistics.median(starts[name]) - base:+.1f} ms per process start (medians)")
        for door in (False, True):
            rates = [await relay_rate(door) for _ in range(5)]
            print(f"[{'through a door' if door else 'direct'}] 64 MB to a loopback sink: "
                  f"median {statistics.median(rates):.0f} MB/s (n=5)")
        res = await through_daemons(api.url, n, nursery, before)
        for mode, (agents, runs) in res.items():
            print(f"[{mode}] claude agent run (run → end notice, one agent): {summary(agents)}")
            print(f"[{mode}] trivial run (runner start included): {summary(runs)}")
        d_agent = statistics.median(res["bwrap"][0]) - statistics.median(res["none"][0])
        d_run = statistics.median(res["bwrap"][1]) - statistics.median(res["none"][1])
        print(f"sandbox cost: {d_agent:+.1f} ms per agent, {d_run:+.1f} ms per runner (medians)")
        if "bwrap, before" in res:
            d_net = statistics.median(res["bwrap"][0]) - statistics.median(res["bwrap, before"][0])
            print(f"this code vs {before}: {d_net:+.1f} ms per agent (medians)")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--before", type=Path, default=None,
                   help="a checkout of the code before a change: its daemon is measured beside this one")
    args = p.parse_args()
    trio.run(main, args.n, args.before)
