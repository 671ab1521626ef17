"""The real daemon process at three edges (issue 25 #7, #8, #9): one caller's unusable key
file stops nobody else; an HTTP client that says `Connection: close` (or speaks HTTP/1.0)
gets EOF after its response; `python -m swarmbase.client … --wait` says one line, never a
traceback, when the daemon dies under it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from swarmbase.client import connect

from .clidaemon import cli_daemon, fake_cli_config
from .sockets import free_port


def read_to_eof(port: int, request: bytes) -> bytes:
    """Everything the server sends until it closes; socket.timeout if it never does."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(20)
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def whole_response(data: bytes) -> tuple[int, bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    assert length is not None and int(length.group(1)) == len(body), head
    return int(head.split()[1]), body


@pytest.mark.timeout(180)
async def test_bad_key_file_closing_clients_and_a_dead_daemon_under_wait(tmp_path: Path) -> None:
    port = free_port()
    path, tokens = fake_cli_config(tmp_path, ("alice", "bob", "carol"), {"alice": 0o644, "carol": None}, port=port)
    keys = {name: path.parent / f"{name}.key" for name in ("alice", "bob", "carol")}

    with trio.fail_after(150):
        async with cli_daemon(path) as d:
            # 7: start-up says once which callers are refused and why; the daemon serves.
            # (Each caller's uid is said too, one line each: not a refusal.)
            log = "\n".join(ln for ln in d.stderr.decode().splitlines() if "children run as uid" not in ln)
            assert log.count("caller alice:") == 1 and f"the key file {keys['alice']} must be mode 0600" in log
            assert log.count("caller carol:") == 1 and f"the key file {keys['carol']} does not exist" in log
            assert "caller bob:" not in log
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                refused = await h.tool("run", {"script": "return 1"})
                assert refused["isError"]
                assert f"the key file {keys['alice']} must be mode 0600 (it is 0644)" in refused["content"][0]["text"]
            async with connect(d.ws, tokens["bob"]) as h:
                await h.handshake()
                rid = (await h.tool("run", {"script": "return await agent('noop')"}))["structuredContent"]["runId"]
                assert "swarmbase:completed" in (await h.wait_notice(f"{rid}:end"))["tags"]
            keys["alice"].chmod(0o600)                  # fixed while the daemon runs: no restart
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                fixed = (await h.tool("run", {"script": "return await agent('noop')"}))["structuredContent"]["runId"]
                assert "swarmbase:completed" in (await h.wait_notice(f"{fixed}:end"))["tags"]

            # 8: every kind of page ends with EOF when the client asks the server to close.
            for target in ("/", "/healthz", f"/runs/{rid}", f"/runs/{rid}/agents/1", "/static/app.css",
                           "/runs/run_000000000000", "/mcpl"):
                data = await trio.to_thread.run_sync(read_to_eof, port, (
                    f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").encode())
                status, _ = whole_response(data)
                assert status == {"/runs/run_000000000000": 404, "/mcpl": 426}.get(target, 200), (target, data[:200])
            status, body = whole_response(await trio.to_thread.run_sync(
                read_to_eof, port, b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"))
            assert (status, body) == (200, b"ok\n")

            # 9: a client waiting on a run when the daemon is killed prints one line.
            client = await trio.lowlevel.open_process(
                [sys.executable, "-m", "swarmbase.client", "bob", "run",
                 json.dumps({"script": "return await agent('sleep:120')"}), "--wait"],
                env=dict(os.environ, SWARMBASE_CONFIG=str(path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out = b""
            while b"1 running" not in out:          # its progress line: the agent runs
                chunk = await client.stdout.receive_some(65536)
                assert chunk, out.decode()
                out += chunk
            waited = json.loads(out[:out.index(b"}") + 1])["runId"]
            d.proc.send_signal(signal.SIGKILL)
            err = b""
            while chunk := await client.stderr.receive_some(65536):
                err += chunk
            assert await client.wait() == 1
    lines = err.decode().strip().splitlines()
    assert lines == [(f"swarmbase.client: lost the connection to the daemon (close code 1006, abnormal closure) "
                      f"while waiting for {waited}; its end notice stays queued for this caller")], err.decode()
