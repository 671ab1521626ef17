"""A first use, as a new user meets it: the real `python -m swarmbase` started for the first
time on a port chosen beforehand, on a machine without any agent CLI, driven with the
bundled client (`python -m swarmbase.client`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from swarmbase.client import connect

from .clidaemon import CliDaemon, cli_daemon
from .sockets import free_port


async def client(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([sys.executable, "-m", "swarmbase.client", "local", *argv], env=env,
                                  capture_stdout=True, capture_stderr=True, check=False)


@pytest.mark.timeout(150)
async def test_first_start_on_a_chosen_port_without_agent_clis(tmp_path: Path) -> None:
    port = free_port()
    cfg_path = tmp_path / "home" / "config.json"
    # No claude or codex on PATH (node and bubblewrap are in /usr/bin).
    env = dict(os.environ, SWARMBASE_CONFIG=str(cfg_path), PATH="/usr/bin:/bin")
    async with cli_daemon(cfg_path, env, [sys.executable, "-m", "swarmbase", "--port", str(port)]) as d:
        with trio.fail_after(120):
            await check_first_use(d, env, cfg_path, port)


async def check_first_use(d: CliDaemon, env: dict[str, str], cfg_path: Path, port: int) -> None:
    start = d.stderr.decode()
    assert f"ws://127.0.0.1:{port}/mcpl?token=" in start and f"listening on http://127.0.0.1:{port}" in start
    assert "engines found on PATH: none: install Claude Code (npm install -g @anthropic-ai/claude-code)" \
        in start
    assert json.loads(cfg_path.read_text())["port"] == port

    # Another start naming another port is refused before it touches anything.
    other = await trio.run_process([sys.executable, "-m", "swarmbase", "--port", str(port + 1)], env=env,
                                   capture_stderr=True, check=False)
    assert other.returncode == 2 and f"--port {port + 1} differs from the port in {cfg_path} ({port})" \
        in other.stderr.decode()

    # The first agent() says what is missing and what to do.
    started = await client(env, "run", json.dumps({"script": "// first try\nreturn await agent('hello')"}))
    assert started.returncode == 0, started.stderr.decode()
    run_id = json.loads(started.stdout)["runId"]
    while True:
        st = await client(env, "status", json.dumps({"runId": run_id, "logLines": 0}))
        status = json.loads(st.stdout)
        if status["status"] != "running" and status["status"] != "queued":
            break
        await trio.sleep(0.1)
    assert status["status"] == "failed"
    assert "no agent CLI was found on this daemon; install Claude Code (npm install -g " \
           "@anthropic-ai/claude-code), add \"engines\": {\"claude\": {}}" in status["error"], status

    # A one-shot `list` leaves the run's end notice queued for the caller's host...
    listed = await client(env, "list")
    assert listed.returncode == 0 and run_id in listed.stdout.decode()
    # ...and prints readable text for the guide, not escaped JSON.
    guide = await client(env, "guide", json.dumps({"topic": "determinism"}))
    text = guide.stdout.decode()
    assert guide.returncode == 0 and "Math.random()" in text and "\\n" not in text
    assert text.count("\n") > 3 and not text.lstrip().startswith("{")
    token = (cfg_path.parent / "mcpl-local.token").read_text().strip()
    async with connect(d.ws, token) as h:
        await h.handshake()
        notice = await h.wait_notice(f"{run_id}:end")
    assert 'Run "first try"' in notice["payload"]["content"][0]["text"]
