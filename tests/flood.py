"""An SSE flood against a real daemon process: clients that connect, ask for a stream and
never read. Shared by tests/test_dashboard_sse.py and bench/dashboard_sse.py. Loopback
only; connections are spread over source addresses 127.0.0.2… so the per-client cap does
not hide the global one."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from swarmbase.client import connect

from .fakes import fake_claude

# A backlog of long log lines, so a replay from the start is big.
BACKLOG_SCRIPT = ("for (let i = 0; i < {lines}; i++) log('backlog line ' + i + ' ' + 'x'.repeat(900));\n"
                  "return await agent('waitfile:{gate}', {{label: 'held'}});")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@attrs.define
class Daemon:
    proc: trio.Process
    url: str
    token: str
    state: Path

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.url.split("//")[1].split(":")
        return host, int(port)


async def start_daemon(tmp: Path, extra: dict[str, Any] | None = None) -> Daemon:
    """`python -m swarmbase` with the fake claude CLI, one caller `alice`."""
    state = tmp / "state"
    (tmp / "bin").mkdir(parents=True)
    state.mkdir()
    cli = fake_claude.install(tmp / "bin")
    key = state / "alice.key"
    key.write_text("sk-flood-000000000000")
    key.chmod(0o600)
    token = secrets.token_hex(24)
    # Without the sandbox: the fake agent waits on a gate file on the host.
    (state / "config.json").write_text(json.dumps({
        "port": 0, "sandbox": "none", "engines": {"claude": {"bin": str(cli), "baseUrl": "http://127.0.0.1:9/gw", "inProcessThink": False,
                                                                    "inProcessRead": False}},
        "callers": [{"name": "alice", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                     "apiKeyFile": str(key), "runUsdMax": 100}], **(extra or {})}))
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    buf = b""
    with trio.fail_after(60):
        while b"listening on" not in buf:
            chunk = await proc.stderr.receive_some(4096)
            assert chunk, buf.decode()
            buf += chunk
    url = buf.split(b"listening on ", 1)[1].split(b" ", 1)[0].decode()
    return Daemon(proc=proc, url=url, token=token, state=state)


async def stop_daemon(d: Daemon) -> None:
    d.proc.terminate()
    with trio.move_on_after(10):
        await d.proc.wait()
    if d.proc.returncode is None:
        d.proc.kill()


async def start_backlog_run(d: Daemon, gate: Path, lines: int = 500) -> str:
    """A live run whose event buffer is full: many log lines, then an agent held on `gate`."""
    gate.write_text("")
    spawns = gate.parent / "bin" / "spawns.log"
    async with connect(d.url.replace("http", "ws") + "/mcpl", d.token) as h:
        await h.handshake()
        res = await h.tool("run", {"script": BACKLOG_SCRIPT.format(lines=lines, gate=gate), "budgetUsd": 5})
        run_id = res["structuredContent"]["runId"]
        with trio.fail_after(180):
            while not (spawns.exists() and "waitfile" in spawns.read_text()):
                await trio.sleep(0.5)
                st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
                assert st["status"] == "running", st
    return run_id


async def open_stream(host: str, port: int, path: str, source: str = "127.0.0.1",
                      headers: str = "", host_header: str | None = None) -> trio.SocketStream:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    await sock.bind((source, 0))
    await sock.connect((host, port))
    stream = trio.SocketStream(sock)
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: {host_header or f'{host}:{port}'}\r\n"
                          f"Accept: text/event-stream\r\n{headers}\r\n".encode())
    return stream


# Streams opened by another local account: a root helper process that creates each socket
# under `uid` (the kernel records the creator's uid on the socket: what sock_diag reports),
# asks for the stream, reports the statuses it got, and holds the streams until its stdin
# closes. Single-threaded, so switching its effective uid is safe.
FOREIGN_FLOOD = r"""
import json, os, socket, sys
host, port, path, n, uid = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
headers = json.loads(sys.argv[6])
socks, statuses = [], []
for i in range(n):
    os.seteuid(uid)
    s = socket.socket()
    os.seteuid(0)
    s.connect((host, port))
    extra = "".join(f"{k}: {v.format(i=i)}\r\n" for k, v in headers.items())
    host_line = "" if "Host" in headers else f"Host: {host}:{port}\r\n"
    s.sendall(f"GET {path} HTTP/1.1\r\n{host_line}Accept: text/event-stream\r\n{extra}\r\n".encode())
    socks.append(s)
for s in socks:
    s.settimeout(10)
    try:
        statuses.append(int(s.recv(64).split(b" ", 2)[1]))
    except (OSError, IndexError, ValueError):
        statuses.append(0)
print(json.dumps(statuses), flush=True)
sys.stdin.read()
"""


async def foreign_flood(host: str, port: int, path: str, n: int, uid: int,
                        headers: dict[str, str]) -> tuple[trio.Process, list[int]]:
    """n streams held by a process whose sockets belong to `uid`; `{i}` in a header value
    is the stream's number. Returns the helper (close its stdin to end it) and the statuses."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", FOREIGN_FLOOD, host, str(port), path, str(n), str(uid), json.dumps(headers)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out = b""
    while not out.endswith(b"\n"):
        chunk = await proc.stdout.receive_some(65536)
        assert chunk, "the flood helper died"
        out += chunk
    return proc, json.loads(out)


async def flood(host: str, port: int, paths: list[str], n: int, sources: int = 100) -> list[trio.SocketStream]:
    """n clients that ask for a stream and never read."""
    out = []
    for i in range(n):
        out.append(await open_stream(host, port, paths[i % len(paths)], f"127.0.0.{2 + i % sources}"))
    return out


async def status_of(stream: trio.SocketStream) -> int:
    """The HTTP status a flood client got (reads only its first bytes)."""
    buf = b""
    with trio.move_on_after(5):
        while b"\r\n" not in buf:
            chunk = await stream.receive_some(64)
            if not chunk:
                break
            buf += chunk
    try:
        return int(buf.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0      # dropped by the daemon before (or while) answering


async def healthz_ms(host: str, port: int) -> float:
    t0 = time.perf_counter()
    s = await trio.open_tcp_stream(host, port)
    async with s:
        await s.send_all(f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        buf = b""
        while b"ok" not in buf:
            chunk = await s.receive_some(4096)
            if not chunk:
                break
            buf += chunk
    assert b" 200 " in buf.split(b"\r\n", 1)[0], buf[:100]
    return (time.perf_counter() - t0) * 1000


async def stream_stats(host: str, port: int) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as c:
        return (await c.get("/streams")).json()


async def read_frames(stream: trio.SocketStream, want: int, limit_s: float = 20) -> list[bytes]:
    """Read until `want` SSE frames with an event name arrived (a viewer that reads)."""
    frames: list[bytes] = []
    buf = b""
    with trio.move_on_after(limit_s):
        while len(frames) < want:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            buf += chunk
            *done, buf = buf.split(b"\n\n")
            frames += [f for f in done if b"event: " in f]
    return frames


def summary(samples: list[float]) -> str:
    s = sorted(samples)
    return (f"median {statistics.median(s):.1f} ms, p95 {s[int(len(s) * 0.95) - 1 if len(s) > 1 else 0]:.1f} ms, "
            f"max {s[-1]:.1f} ms")


def loopback_ok() -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return True
    except OSError:
        return False
