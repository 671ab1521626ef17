"""What the key door costs (issue 31 #3): agent start, and throughput through the door.

    python3 bench/key_door.py [--n 50] [--mb 200] [--before TREE]

- door throughput: a `--mb` MB streamed response read by curl (its own process) through
  one agent door as the daemon runs it (launch/egress.Relay, on this process's event
  loop), carried as today's relay carries a claude agent's connection (straight to the
  upstream, bytes only) and with the swap (door → key door → upstream: HTTP parsed,
  the bearer swapped for the key, a new upstream connection); the upstream is another
  process (bench/meter_relay.py's). Median of 5, alternated; direct for reference.
- agent start (`--before TREE`, a checkout before the key door, e.g.
  `git archive 99e6e79 swarmbase | tar -x -C /tmp/before`): a claude `read` agent (a CLI
  process; `think` agents run in the daemon) run → end notice on a daemon from that tree
  and on one from this tree, alternated run by run, median of n each.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from common import CLAUDE, ROOT, alternated_runs, start, state_dir, stop, summary, write_config  # noqa: E402
from meter_relay import UPSTREAM  # noqa: E402
from swarmbase.daemon import serve_relay
from swarmbase.engines.key_door import KeyDoor
from swarmbase.launch.egress import Door, Endpoint, Relay

from fakes.anthropic_api import FakeAnthropic  # noqa: E402


def _listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


async def curl(url: str, headers: list[str]) -> tuple[int, float]:
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", "-X", "POST", "-d", "{}"]
    for h in headers:
        argv += ["-H", h]
    t = time.perf_counter()
    out = await trio.run_process([*argv, url], capture_stdout=True)
    return int(out.stdout), time.perf_counter() - t


def start_upstream(mb: int) -> tuple[subprocess.Popen[str], str]:
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(mb)], stdout=subprocess.PIPE, text=True)
    assert up.stdout is not None
    return up, up.stdout.readline().strip()


async def throughput(mb: int, rounds: int) -> dict[str, list[float]]:
    up, upstream = await trio.to_thread.run_sync(start_upstream, mb)
    host, port = upstream.removeprefix("http://").split(":")
    out: dict[str, list[float]] = {"direct": [], "relay (today)": [], "relay + key door": []}
    try:
        async with trio.open_nursery() as n:
            door = KeyDoor()
            await n.start(serve_relay, door)
            agent = door.register("sk-bench-real-key", upstream)
            dhost, dport = door.url.removeprefix("http://").split(":")
            plain_l, plain_p = _listener()
            swap_l, swap_p = _listener()
            relay = Relay("bench", [Door(inside="x", to=Endpoint(host, int(port))),
                                    Door(inside="y", to=Endpoint(dhost, int(dport)))])
            relay.start(n, [plain_l, swap_l])
            paths = {"direct": (upstream, []),
                     "relay (today)": (f"http://127.0.0.1:{plain_p}", []),
                     "relay + key door": (f"http://127.0.0.1:{swap_p}", [f"x-api-key: {agent.bearer}"])}
            for base, hs in paths.values():                          # warm every path once
                await curl(base + "/v1/messages", hs)
            for i in range(rounds):
                order = list(paths) if i % 2 == 0 else list(reversed(paths))
                for name in order:
                    base, hs = paths[name]
                    size, secs = await curl(base + "/v1/messages", hs)
                    out[name].append(size / 2**20 / secs)
            n.cancel_scope.cancel()
    finally:
        up.terminate()
    return out


async def agent_starts(tree: str, n: int) -> dict[str, list[float]]:
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeAnthropic().serve)
        daemons = {}
        for label, code in (("before", Path(tree)), ("now", ROOT)):
            state = state_dir(f"sb-door-{label}-")
            state.chmod(0o755)
            token = write_config(state, {"sandbox": "bwrap",
                                         "engines": {"claude": {"bin": str(CLAUDE), "baseUrl": api.url}}})
            daemons[label] = await start(state, token, nursery, code=code)
        try:
            out = await alternated_runs(daemons, "return await agent('hi', {profile: 'read'})", n)
        finally:
            for d in daemons.values():
                await stop(d)
        nursery.cancel_scope.cancel()
    return out


async def main(n: int, mb: int, before: str | None) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    tp = await throughput(mb, 5)
    for name, rates in tp.items():
        print(f"{mb} MiB response, {name}: median {statistics.median(rates):.0f} MiB/s "
              f"(min {min(rates):.0f}, max {max(rates):.0f}; 5 reads)")
    if before is not None:
        ab = await agent_starts(before, n)
        print(f"claude read agent run → end notice, before the key door: {summary(ab['before'])}")
        print(f"claude read agent run → end notice, with the key door:   {summary(ab['now'])}")
        print(f"key door cost: {statistics.median(ab['now']) - statistics.median(ab['before']):+.1f} ms per agent "
              "(medians, alternated)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--before", help="a checkout of swarmbase before the key door")
    a = p.parse_args()
    trio.run(main, a.n, a.mb, a.before)
