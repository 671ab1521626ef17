"""`python -m swarmbase.stdio_relay`: a stdio-only host build (agent-framework main, which
only spawns servers) talks to the real daemon process through it, as that build does:
one JSON-RPC message per line on the relay's stdin and stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import stdio_relay

from .clidaemon import cli_daemon
from .conftest import write_config


class StdioHost:
    """The host's end of a spawned server: lines in, lines out."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buf = b""
        self.next_id = 0

    async def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(json.dumps(msg).encode() + b"\n")

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while b"\n" not in self.buf:
            chunk = await self.proc.stdout.receive_some(65536)
            assert chunk, "the relay closed its stdout"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = self.next_id
        self.next_id += 1
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        while True:
            msg = await self.line()
            if msg.get("id") == rid and "method" not in msg:
                return msg
            await self.answer(msg)

    async def answer(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Answer a push the daemon sent (accept it); return its params."""
        if msg.get("method") == "push/event":
            await self.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"accepted": True, "inferenceId": "x"}})
            params: dict[str, Any] = msg["params"]
            return params
        return None


async def open_relay(url: str, token: str, tmp_path: Path) -> trio.Process:
    env = dict(os.environ, SWARMBASE_TOKEN=token, SWARMBASE_CONFIG=str(tmp_path / "no-config.json"))
    return await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase.stdio_relay", "--url", url],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            env=env)


async def read_all(stream: trio.abc.ReceiveStream | None) -> bytes:
    assert stream is not None
    out = b""
    while chunk := await stream.receive_some(65536):
        out += chunk
    return out


@pytest.mark.timeout(120)
async def test_a_stdio_host_runs_a_script_and_gets_its_notice_through_the_relay(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cfg_path, tokens = write_config(state, callers=["alice"])
    async with cli_daemon(cfg_path) as d:
        with trio.fail_after(90):
            proc = await open_relay(d.ws, tokens["alice"], tmp_path)
            host = StdioHost(proc)
            init = await host.request("initialize", {
                "protocolVersion": "2024-11-05",
                "capabilities": {"experimental": {"mcpl": {"version": "0.4", "pushEvents": True}}},
                "clientInfo": {"name": "agent-framework", "version": "1.0.0"}})
            assert init["result"]["serverInfo"]["name"] == "swarmbase"
            await host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            await host.send({"jsonrpc": "2.0", "method": "featureSets/update",
                             "params": {"enabled": ["swarmbase", "swarmbase.notify"], "disabled": []}})
            res = await host.request("tools/call", {"name": "run", "arguments": {"script": "return 6 * 7"}})
            run_id = res["result"]["structuredContent"]["runId"]
            notice = None
            while notice is None or notice["eventId"] != f"{run_id}:end":
                notice = await host.answer(await host.line())
            assert "swarmbase:completed" in notice["tags"]
            # The token is not in the relay's argv (world-readable in /proc).
            assert tokens["alice"].encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            # End of stdin (the host stopped it): the session ends, the relay exits 0.
            assert proc.stdin is not None
            await proc.stdin.aclose()
            assert await proc.wait() == 0


@pytest.mark.timeout(120)
async def test_a_refused_token_reaches_the_host_as_its_error_and_the_relay_says_why(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    cfg_path, _ = write_config(state, callers=["alice"])
    async with cli_daemon(cfg_path) as d:
        with trio.fail_after(90):
            proc = await open_relay(d.ws, "not-a-token", tmp_path)
            host = StdioHost(proc)
            reply = await host.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {},
                                                      "clientInfo": {"name": "x", "version": "0"}})
            assert reply["error"]["code"] == -32001
            err = await read_all(proc.stderr)
            assert await proc.wait() == 1
            assert b"the daemon ended the session (close code 4001" in err


def test_framing_lines_both_ways() -> None:
    done, rest = stdio_relay.lines_of(b'{"a":1}\n\n{"b":2}\r\n{"c"')
    assert done == [b'{"a":1}', b'{"b":2}'] and rest == b'{"c"'
    assert stdio_relay.frame_lines('{"x":1}\n{"y":2}\n') == [b'{"x":1}\n', b'{"y":2}\n']
    assert stdio_relay.frame_lines(b'{"z":3}') == [b'{"z":3}\n']
