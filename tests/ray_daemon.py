"""The daemon (`python -m swarmbase`), a fake Anthropic API and MCPL clients, all inside a
RayCluster's network namespace, for the Ray placement tests and bench."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator

import hypercorn.config
import hypercorn.trio
import trio
import trio_websocket

from swarmbase.client import HostClient

from .conftest import CLAUDE
from .raycluster import LABELS, RESOURCE, RayCluster

REPO = Path(__file__).resolve().parent.parent
DAEMON_PORT = 17360
API_PORT = 18080
KEY = "sk-ant-raycanary-" + secrets.token_hex(12)


# Run by an agent's CLI (python3 -c, or base64 into `python3 -`): what the kernel says the
# agent is, then whether each loopback port given can be reached, and its first bytes.
STATUS_PROBE = """
import socket, sys
for line in open('/proc/self/status'):
    if line.split(':')[0] in ('Uid', 'CapEff', 'Seccomp', 'NoNewPrivs'):
        print(' '.join(line.split()[:2]))
for port in sys.argv[1:]:
    try:
        with socket.create_connection(('127.0.0.1', int(port)), timeout=10) as s:
            s.sendall(b'GET / HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n')
            print('port', port, 'open', s.recv(12).decode(errors='replace'))
    except OSError as e:
        print('port', port, 'closed', type(e).__name__)
"""


def write_config(root: Path, cluster: RayCluster, *, labels: dict[str, str] | None = None, **extra: Any) -> Path:
    """alice may place agents on Ray; her key file holds KEY (the canary)."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    shared = root / "shared"
    shared.mkdir(exist_ok=True)
    (state / "alice.key").write_text(KEY + "\n")
    (state / "alice.key").chmod(0o600)
    token = secrets.token_hex(24)
    (state / "mcpl-alice.token").write_text(token)
    # realpath: a worktree's tests/.tools is a symlink, which the sandbox mounts only resolved
    cfg = {"port": DAEMON_PORT, "engines": {"claude": {"bin": os.path.realpath(CLAUDE), "baseUrl": f"http://127.0.0.1:{API_PORT}",
                                        "inProcessThink": False, "inProcessRead": False}},
           "callers": [{"name": "alice", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                        "apiKeyFile": str(state / "alice.key"), "cwdRoots": [str(shared)], "maxProfile": "write",
                        "runUsdMax": 25}],
           "agentIdleTimeoutMs": 60_000,
           "placement": {"ray": {"address": cluster.address, "tokenFile": str(cluster.token_file),
                                 "resource": RESOURCE, "labels": LABELS if labels is None else labels,
                                 "sharedRoots": [str(shared)], "startTimeoutMs": 60_000}},
           **extra}
    (state / "config.json").write_text(json.dumps(cfg))
    return state / "config.json"


class Daemon:
    """`python -m swarmbase` in the namespace; stderr drained all along and kept."""

    def __init__(self, cluster: RayCluster, config: Path) -> None:
        self.cluster, self.config = cluster, config
        self.state = config.parent
        self.token = (self.state / "mcpl-alice.token").read_text()
        self.stderr = bytearray()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "Daemon":
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(SWARMBASE_CONFIG=str(self.config), PYTHONPATH=str(REPO))
        self.stderr = bytearray()
        self.proc = self.cluster.ns.popen([sys.executable, "-m", "swarmbase"], env=env, cwd=str(REPO),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while b"listening on" not in self.stderr:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {self.stderr.decode(errors='replace')[-3000:]}")
            time.sleep(0.05)
        return self

    def _drain(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        with proc.stderr:              # closed at EOF: a killed daemon's pipe must not leak
            while chunk := proc.stderr.read1(65536):
                self.stderr.extend(chunk)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- what it left on disk --------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        return next((self.state / "runs").glob(f"*-{run_id}"))

    def agent(self, run_id: str, n: int) -> dict[str, Any]:
        return json.loads((self.run_dir(run_id) / "agents" / str(n) / "agent.json").read_text())


async def serve_api(cluster: RayCluster, app: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve a fake API on 127.0.0.1:API_PORT inside the namespace."""
    sock = cluster.ns.listen("127.0.0.1", API_PORT)
    hc = hypercorn.config.Config()
    hc.bind = [f"fd://{sock.detach()}"]
    hc.accesslog = hc.errorlog = None
    hc.graceful_timeout = 0.1
    async with trio.open_nursery() as n:
        await n.start(partial(hypercorn.trio.serve, app, hc))
        task_status.started()


@asynccontextmanager
async def mcpl(cluster: RayCluster, token: str) -> AsyncIterator[HostClient]:
    """An MCPL host connected to the daemon inside the namespace, handshake done."""
    sock = await trio.to_thread.run_sync(cluster.ns.connect, "127.0.0.1", DAEMON_PORT)
    sock.setblocking(False)
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    async with trio.open_nursery() as n:
        ws = await trio_websocket.wrap_client_stream(n, stream, "127.0.0.1", f"/mcpl?token={token}",
                                                     max_message_size=64 * 1024 * 1024)
        host = HostClient(ws)
        n.start_soon(host._reader)
        try:
            await host.handshake()
            yield host
        finally:
            with trio.move_on_after(2, shield=True):
                await ws.aclose()
            n.cancel_scope.cancel()


async def start_run(host: HostClient, script: str, **params: Any) -> str:
    res = await host.tool("run", {"script": script, **params})
    assert not res.get("isError"), res
    return res["structuredContent"]["runId"]


async def wait_status(host: HostClient, run_id: str, done: Any, timeout: float = 90) -> dict[str, Any]:
    """Poll `status` until done(status) holds."""
    with trio.fail_after(timeout):
        while True:
            st = (await host.tool("status", {"runId": run_id, "logLines": 50}))["structuredContent"]
            if done(st):
                return st
            await trio.sleep(0.1)


def ended(st: dict[str, Any]) -> bool:
    return st["status"] not in ("queued", "running")


def rows(st: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for p in st.get("phases", []) for a in p["agents"]]


async def http_get(cluster: RayCluster, path: str) -> tuple[int, str]:
    """GET a dashboard path of the daemon inside the namespace."""
    import http.client

    def get() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", DAEMON_PORT, timeout=10)
        conn.sock = cluster.ns.connect("127.0.0.1", DAEMON_PORT)
        conn.request("GET", path, headers={"Host": "127.0.0.1"})
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        return resp.status, body
    return await trio.to_thread.run_sync(get)


def marked_processes(node_dir: Path | None = None) -> list[int]:
    """Live processes that carry an agent's node marker (SWARMBASE_NODE_AGENT)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"SWARMBASE_NODE_AGENT=" in env and state not in ("Z", "X"):
            out.append(int(d.name))
    return out
