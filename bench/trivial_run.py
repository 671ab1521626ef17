"""Trivial-run latency and idle RSS.

    python3 bench/trivial_run.py [--runs 30]

Starts the real daemon (`python -m swarmbase`) on a throwaway state dir, measures its idle
RSS, then times `run` → end notice for a script that only returns a value, beside
`node -e 0` start-up (bare and in the runner's sandbox) measured in the same run, and the
daemon's CPU per run. Runs are --gap apart (a resident does not submit back to back).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.profile import Recorder  # noqa: E402
from swarmbase.client import connect  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def node_startup_ms(n: int, prefix: list[str] = ()) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([*prefix, "node", "-e", "0"], check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


def bwrap_prefix() -> list[str]:
    """The sandbox a runner starts in (no network, own PID namespace), as the daemon builds it."""
    from swarmbase.launch.sandbox import Confinement, HostLayout, bwrap_argv
    node_dir = os.path.dirname(os.path.realpath(shutil.which("node")))
    return bwrap_argv(HostLayout.probe(), Confinement(cwd="/tmp", read=(node_dir,), network=False))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(runs: int, gap: float, profile: str | None) -> None:
    state = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    token = secrets.token_hex(24)
    (state / "config.json").write_text(json.dumps({"port": 0, "callers": [
        {"name": "bench", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(), "maxActiveRuns": 1000}]}))
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    try:
        buf = b""
        while b"listening on" not in buf:
            buf += await proc.stderr.receive_some(4096)
        url = re.search(rb"listening on (http://[\d.:]+)", buf).group(1).decode()
        await trio.sleep(1.0)
        idle_rss = rss_mb(proc.pid)
        lat = []
        async with connect(url.replace("http", "ws") + "/mcpl", token) as h:
            await h.handshake()
            for _ in range(3):  # warm-up
                rid = (await h.tool("run", {"script": "return 1"}))["structuredContent"]["runId"]
                await h.wait_notice(f"{rid}:end")
            cpu0 = cpu_seconds(proc.pid)
            with Recorder(proc.pid, profile):
                for i in range(runs):
                    await trio.sleep(gap)      # a resident does not submit back to back: a spare has time to start
                    t = time.perf_counter()
                    rid = (await h.tool("run", {"script": f"return {i}"}))["structuredContent"]["runId"]
                    await h.wait_notice(f"{rid}:end")
                    lat.append((time.perf_counter() - t) * 1000)
            cpu1 = cpu_seconds(proc.pid)
        after_rss = rss_mb(proc.pid)
        node = node_startup_ms(runs)
        boxed = node_startup_ms(runs, bwrap_prefix())
        med_run, med_node = statistics.median(lat), statistics.median(node)
        print(f"trivial run → end notice: p50 {med_run:.1f} ms, p95 {pct(lat, 0.95):.1f} ms over {runs} runs "
              f"(target ≤ 12 ms p50, ≤ 20 ms p95); daemon CPU {(cpu1 - cpu0) / runs * 1000:.1f} ms per run")
        print(f"node -e 0 start-up:       p50 {med_node:.1f} ms; in the runner's sandbox (bwrap) "
              f"p50 {statistics.median(boxed):.1f} ms")
        print(f"overhead over node start: {med_run - med_node:+.1f} ms; run / node start "
              f"{med_run / med_node:.2f}×; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"daemon RSS: idle {idle_rss:.1f} MB (target < 80 MB), after {runs + 3} runs {after_rss:.1f} MB")
    finally:
        proc.terminate()
        await proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--gap", type=float, default=0.5, help="seconds between runs")
    p.add_argument("--profile", help="write py-spy stacks of the daemon here (see bench/profile.py)")
    a = p.parse_args()
    trio.run(main, a.runs, a.gap, a.profile)
