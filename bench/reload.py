"""Reload time (issue 24 #2): from SIGHUP to the new config serving.

    python3 bench/reload.py [--reloads 20] [--callers 50] [--agents 16] [--busy 2]

A real daemon process (the fake claude CLI, `--callers` callers configured). Each
reload adds one caller with a new token, sends SIGHUP, and measures two things: until the
daemon's status file reports the reload (its own work: read, validate, swap, close), and
until a fresh WebSocket with the new token completes `initialize` + `tools/list` (what a
new resident sees; includes a connection set-up). `--agents N` keeps a run of N agents in
flight (and its caller's session open) during the reloads; `--busy N` runs N busy loops
beside the daemon (the "machine loaded" case). Prints medians, and the median of each step
the daemon reports in its status file (`phasesMs`); asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import trio

from swarmbase.client import RpcFailure, connect
from swarmbase.reload_cli import read_status
from tests.clidaemon import cli_daemon, fake_cli_config


async def serving(ws: str, token: str) -> bool:
    try:
        async with connect(ws, token) as h:
            await h.handshake()
            return bool((await h.request("tools/list"))["tools"])
    except (RpcFailure, ConnectionError, OSError):
        return False


async def hold_agents(ws: str, token: str, agents: int, started: trio.Event) -> None:
    async with connect(ws, token) as h:
        await h.handshake()
        await h.tool("run", {"script": f"return await parallel(Array.from({{length: {agents}}}, (_, i) => () => "
                                       "agent('[[sleep:600]] ' + i, {maxUsd: 1})))", "budgetUsd": 100})
        started.set()
        await trio.sleep_forever()


async def main(reloads: int, callers: int, agents: int, busy: int, via_cli: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="sb-bench-reload-") as tmp:
        path, tokens = fake_cli_config(Path(tmp), callers=tuple(f"c{i}" for i in range(callers)), sandbox="none",
                                       maxConcurrentAgents=max(agents, 1), perRunConcurrency=max(agents, 1))
        state = path.parent
        to_status: list[float] = []
        to_serving: list[float] = []
        phases: dict[str, list[float]] = {}
        commands: list[float] = []
        loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        async with cli_daemon(path) as d, trio.open_nursery() as n:
            if agents:
                started = trio.Event()
                n.start_soon(hold_agents, d.ws, tokens["c0"], agents, started)
                await started.wait()
                await trio.sleep(2)             # the agents' processes are up
            for i in range(reloads):
                token = secrets.token_hex(24)
                cfg = json.loads(path.read_text())
                cfg["callers"].append({**cfg["callers"][0], "name": f"new{i}",
                                       "tokenSha256": hashlib.sha256(token.encode()).hexdigest()})
                path.write_text(json.dumps(cfg))
                asked = time.monotonic()
                if via_cli:
                    # What an operator types: the command's own start-up counts.
                    await trio.run_process([sys.executable, "-m", "swarmbase", "reload"], capture_stderr=True,
                                           env={**os.environ, "SWARMBASE_CONFIG": str(path)})
                    commands.append((time.monotonic() - asked) * 1000)
                else:
                    d.proc.send_signal(signal.SIGHUP)
                while not ((st := read_status(state)) and st["readAt"] >= asked):
                    await trio.sleep(0.001)
                to_status.append((time.monotonic() - asked) * 1000)
                assert st["ok"], st
                for k, v in st.get("phasesMs", {}).items():
                    phases.setdefault(k, []).append(v)
                while not await serving(d.ws, token):
                    pass
                to_serving.append((time.monotonic() - asked) * 1000)
            n.cancel_scope.cancel()
        for p in loops:
            p.kill()
    print(f"{reloads} reloads, {callers}+ callers, {agents} agents in flight, {busy} busy loops, "
          f"load {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"  SIGHUP to the reload reported (status file): {common.summary(to_status)}")
    print(f"  SIGHUP to the new token served (initialize + tools/list on a new socket): {common.summary(to_serving)}")
    if commands:
        print(f"  `python -m swarmbase reload`, start to exit: {common.summary(commands)}")
    print("  the daemon's steps (median ms): " + ", ".join(f"{k} {statistics.median(v):g}" for k, v in phases.items()))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reloads", type=int, default=20)
    ap.add_argument("--callers", type=int, default=50)
    ap.add_argument("--agents", type=int, default=0)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--via-cli", action="store_true", help="reload with `python -m swarmbase reload`, not SIGHUP")
    a = ap.parse_args()
    trio.run(main, a.reloads, a.callers, a.agents, a.busy, a.via_cli)
