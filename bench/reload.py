"""Reload time (issue 24 #2): from SIGHUP to the new config serving.

    python3 bench/reload.py [--reloads 20] [--callers 50]

A real daemon process (the fake claude CLI, `--callers` callers configured). Each
reload adds one caller with a new token, sends SIGHUP, and measures two things: until the
daemon's status file reports the reload (its own work: read, validate, swap, close), and
until a fresh WebSocket with the new token completes `initialize` + `tools/list` (what a
new resident sees; includes a connection set-up). Prints medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import signal
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


async def main(reloads: int, callers: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sb-bench-reload-") as tmp:
        path, _ = fake_cli_config(Path(tmp), callers=tuple(f"c{i}" for i in range(callers)), sandbox="none")
        state = path.parent
        to_status: list[float] = []
        to_serving: list[float] = []
        async with cli_daemon(path) as d:
            for i in range(reloads):
                token = secrets.token_hex(24)
                cfg = json.loads(path.read_text())
                cfg["callers"].append({**cfg["callers"][0], "name": f"new{i}",
                                       "tokenSha256": hashlib.sha256(token.encode()).hexdigest()})
                path.write_text(json.dumps(cfg))
                asked = time.monotonic()
                d.proc.send_signal(signal.SIGHUP)
                while not ((st := read_status(state)) and st["readAt"] >= asked):
                    await trio.sleep(0.001)
                to_status.append((time.monotonic() - asked) * 1000)
                assert st["ok"], st
                while not await serving(d.ws, token):
                    pass
                to_serving.append((time.monotonic() - asked) * 1000)
    print(f"{reloads} reloads, {callers}+ callers, load {Path('/proc/loadavg').read_text().split()[0]}")
    print(f"  SIGHUP to the reload reported (status file): {common.summary(to_status)}")
    print(f"  SIGHUP to the new token served (initialize + tools/list on a new socket): {common.summary(to_serving)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--reloads", type=int, default=20)
    ap.add_argument("--callers", type=int, default=50)
    a = ap.parse_args()
    trio.run(main, a.reloads, a.callers)
