"""A real two-node Ray cluster for tests and benches, inside a network namespace that
holds only `lo` (see netns.py): a head without agent slots and one worker node with the
`swarmbase_agents` resource and the `swarmbase/cli=claude` label, token auth on.

Both nodes run `ray start --block` (so every node process is a descendant of one known
pid) with pinned ports and their own worker-port ranges. Nothing is ever stopped by name
(`ray stop` kills every Ray on the machine): the worker node dies by SIGKILL of its own
process tree, the cluster by SIGKILL of every member of the namespace.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .netns import NetNS

RESOURCE = "swarmbase_agents"
LABELS = {"swarmbase/cli": "claude"}
HEAD_PORT = 17460


def ray_bin() -> str:
    found = shutil.which("ray") or os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(found):
        raise RuntimeError("the `ray` command is missing: pip install 'swarmbase[ray]' (tests/install.sh does)")
    return found


def tree(root: int) -> list[int]:
    """root and every live process below it (by parent pid)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if rest[0] not in ("Z", "X"):
            kids.setdefault(int(rest[1]), []).append(int(d.name))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack += kids.get(pid, [])
    return out


class RayCluster:
    def __init__(self, root: Path | None = None, slots: int = 4, worker_env: dict[str, str] | None = None) -> None:
        # Ray's unix sockets live under its temp dir (108-byte path limit, and Ray adds ~70):
        # the system's temp dir if its path is short, else /tmp.
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 24 else "/tmp"
        self.temp = Path(tempfile.mkdtemp(prefix="sbray-", dir=base))
        self.root = root or self.temp
        self.token_file = self.root / "ray-token"
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        self.node_dir = self.root / "node-w1"          # the worker node's SWARMBASE_NODE_DIR
        self.ns = NetNS()
        self.address = f"127.0.0.1:{HEAD_PORT}"
        self.slots = slots
        self.worker_env = worker_env or {}
        self.head: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.logs = self.root / "ray-start-logs"
        self.logs.mkdir(exist_ok=True)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), RAY_USAGE_STATS_ENABLED="0",
                   PYTHONPATH=str(Path(__file__).resolve().parent.parent),
                   **(extra or {}))
        return env

    def _ports(self, base: int) -> list[str]:
        return [f"--node-manager-port={base}", f"--object-manager-port={base + 1}",
                f"--runtime-env-agent-port={base + 2}", f"--dashboard-agent-grpc-port={base + 3}",
                f"--dashboard-agent-listen-port={base + 4}", f"--metrics-export-port={base + 5}",
                f"--min-worker-port={base + 10}", f"--max-worker-port={base + 99}"]

    def start(self, attempts: int = 2) -> "RayCluster":
        """Up, or RuntimeError. A node that gives up (Ray waits 30 s, hard-coded, for a
        raylet to register: on a loaded 2-core machine that can pass) is retried once from
        scratch."""
        for attempt in range(attempts):
            try:
                self._start_once()
                return self
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                self.ns.kill_members()
                for p in (self.head, self.worker):
                    if p is not None:
                        p.wait()
        return self

    def _start_once(self) -> None:
        common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", f"--temp-dir={self.temp}",
                  "--object-store-memory=80000000"]
        head_log = open(self.logs / "head.log", "wb")     # (re)started: a fresh log
        self.head = self.ns.popen([ray_bin(), "start", "--head", f"--port={HEAD_PORT}", "--include-dashboard=false",
                                   "--num-cpus=1", "--resources={}", *self._ports(17500), *common,
                                   # a dead node is marked dead in ~1.5 s, not the default ~15 s
                                   '--system-config={"health_check_period_ms": 500, "health_check_failure_threshold": 3}'],
                                  env=self.env(), stdout=head_log, stderr=subprocess.STDOUT)
        head_log.close()                                  # the node has its own copy of the fd
        self.node_dir.mkdir(exist_ok=True)
        # The worker after the head is up: started together on a loaded machine, the
        # worker's `ray start` gave up waiting for the head's node info.
        self._wait_started(self.head, "head.log")
        self.start_worker()

    def start_worker(self) -> None:
        (self.logs / "worker.log").write_bytes(b"")
        log = open(self.logs / "worker.log", "ab")
        labels = ",".join(f"{k}={v}" for k, v in {**LABELS, "swarmbase/name": "w1"}.items())
        self.worker = self.ns.popen([ray_bin(), "start", f"--address={self.address}", "--num-cpus=2",
                                     f"--resources={json.dumps({RESOURCE: self.slots})}", f"--labels={labels}",
                                     *self._ports(17700), "--block", "--node-ip-address=127.0.0.1",
                                     "--disable-usage-stats", f"--temp-dir={self.temp}",
                                     "--object-store-memory=80000000"],
                                    env=self.env({"SWARMBASE_NODE_DIR": str(self.node_dir), **self.worker_env}),
                                    stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_started(self.worker, "worker.log")

    def _wait_started(self, node: subprocess.Popen, log: str, timeout: float = 90) -> None:
        """Until `ray start --block` says the node is up (it prints this once its raylet
        registered with the head)."""
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in (self.logs / log).read_bytes():
            if node.poll() is not None:
                raise RuntimeError(f"a Ray node exited with {node.returncode}: {(self.logs / log).read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray node did not start in {timeout} s; see {self.logs / log}")
            time.sleep(0.05)

    def worker_pids(self) -> list[int]:
        return tree(self.worker.pid) if self.worker is not None else []

    def raylet_pid(self, node: subprocess.Popen) -> int | None:
        for pid in tree(node.pid):
            try:
                if b"/raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
                    return pid
            except OSError:
                pass
        return None

    def kill_worker_node(self) -> None:
        """Node death: the worker node's raylet and its `ray start`, SIGKILLed; the Ray
        workers on it lose their raylet and exit."""
        assert self.worker is not None
        raylet = self.raylet_pid(self.worker)
        for pid in ([raylet] if raylet else []) + [self.worker.pid]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.worker.wait()

    def session_logs(self) -> list[Path]:
        return [p for p in self.temp.rglob("*") if p.is_file() and p.suffix in (".log", ".out", ".err", ".txt")]

    def close(self) -> None:
        self.ns.close()
        for p in (self.head, self.worker):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)
