"""Shared by the benches: a real daemon process on a throwaway state dir, RSS, stats."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CLAUDE = ROOT / "tests" / ".tools" / "node_modules" / ".bin" / "claude"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


def summary(values: list[float], unit: str = "ms") -> str:
    return (f"median {statistics.median(values):.1f} {unit}, p95 {pct(values, 95):.1f} {unit}, "
            f"max {max(values):.1f} {unit} (n={len(values)})")


@attrs.define
class Daemon:
    proc: trio.Process
    ws: str
    url: str
    token: str
    state: Path
    stderr: bytearray


def state_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


def write_config(state: Path, extra: dict[str, Any] | None = None, caller: dict[str, Any] | None = None,
                 key: str = "sk-bench-0123456789abcdef") -> str:
    token = secrets.token_hex(24)
    (state / "bench.key").write_text(key)
    (state / "bench.key").chmod(0o600)
    cfg = {"port": 0, "callers": [{"name": "bench", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                                   "maxActiveRuns": 1000, "runUsdMax": 1000, "apiKeyFile": str(state / "bench.key"),
                                   "maxProfile": "write", **(caller or {})}], **(extra or {})}
    claude = (cfg.get("engines") or {}).get("claude")
    if isinstance(claude, dict):
        # These benches measure the CLI path of read agents; bench/peer_workflow.py's default
        # cases measure read agents inside the daemon (the default) and say so.
        claude.setdefault("inProcessRead", False)
    (state / "config.json").write_text(json.dumps(cfg))
    return token


async def start(state: Path, token: str, nursery: trio.Nursery, code: Path | None = None) -> Daemon:
    """`python -m swarmbase` on `state`; `code`: run that checkout's swarmbase instead."""
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    if code is not None:
        env["PYTHONPATH"] = str(code)
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    buf = bytearray()
    while b"listening on" not in buf:
        chunk = await proc.stderr.receive_some(4096)
        if not chunk:
            raise RuntimeError(buf.decode(errors="replace"))
        buf += chunk
    url = re.search(rb"listening on (http://[\d.:]+)", buf).group(1).decode()

    async def drain() -> None:
        while chunk := await proc.stderr.receive_some(65536):
            buf.extend(chunk)
    nursery.start_soon(drain)
    return Daemon(proc=proc, ws=url.replace("http", "ws") + "/mcpl", url=url, token=token, state=state, stderr=buf)


async def stop(d: Daemon) -> None:
    if d.proc.returncode is None:
        d.proc.terminate()
        with trio.move_on_after(15):
            await d.proc.wait()
        if d.proc.returncode is None:
            d.proc.kill()
            await d.proc.wait()


async def alternated_runs(daemons: dict[str, Daemon], script: str, n: int) -> dict[str, list[float]]:
    """`script` run → end notice on each daemon ("before", "now"), alternated run by run
    so that a loaded machine's drift hits both alike: n wall times (ms) each."""
    from swarmbase.client import connect
    out: dict[str, list[float]] = {"before": [], "now": []}
    async with connect(daemons["before"].ws, daemons["before"].token) as hb, \
            connect(daemons["now"].ws, daemons["now"].token) as hn:
        await hb.handshake()
        await hn.handshake()
        for i in range(n):
            for label, h in ((("before", hb), ("now", hn)) if i % 2 else (("now", hn), ("before", hb))):
                t = time.perf_counter()
                rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                await h.wait_notice(f"{rid}:end")
                out[label].append((time.perf_counter() - t) * 1000)
    return out


async def first_line_ms(launcher: Any, spec: Any) -> float:
    """Milliseconds from `launcher.run(spec, …)` to the child's first line of output (a
    sandbox's start, when the child prints at once)."""
    t = time.perf_counter()
    first: list[float] = []

    def on_line(line: bytes) -> bool:
        first.append(time.perf_counter())
        return True
    await launcher.run(spec, on_line)
    return (first[0] - t) * 1000
