"""Trivial-run latency and idle RSS.

    python3 bench/trivial_run.py [--runs 30]

Starts the real daemon (`python -m swarmbase`) on a throwaway state dir, measures its idle
RSS, then times `run` → end notice for a script that only returns a value, beside
`node -e 0` start-up measured in the same run. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
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

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from swarmbase.client import connect  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def node_startup_ms(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["node", "-e", "0"], check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main(runs: int) -> None:
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
            for i in range(runs):
                t = time.perf_counter()
                rid = (await h.tool("run", {"script": f"return {i}"}))["structuredContent"]["runId"]
                await h.wait_notice(f"{rid}:end")
                lat.append((time.perf_counter() - t) * 1000)
        after_rss = rss_mb(proc.pid)
        node = node_startup_ms(runs)
        med_run, med_node = statistics.median(lat), statistics.median(node)
        print(f"trivial run → end notice: median {med_run:.1f} ms, p90 {sorted(lat)[int(len(lat) * 0.9) - 1]:.1f} ms "
              f"over {runs} runs")
        print(f"node -e 0 start-up:       median {med_node:.1f} ms")
        print(f"overhead over node start: {med_run - med_node:+.1f} ms (target ≤ +50 ms)")
        print(f"daemon RSS: idle {idle_rss:.1f} MB (target < 80 MB), after {runs + 3} runs {after_rss:.1f} MB")
    finally:
        proc.terminate()
        await proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=30)
    trio.run(main, p.parse_args().runs)
