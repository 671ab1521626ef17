"""SSE figures: 50 viewers on a run with 200 agents, and a flood of clients that never read.

    python3 bench/dashboard_sse.py [--viewers 50] [--agents 200]
    python3 bench/dashboard_sse.py --flood 1500 [--path run|list|idle]

Flood mode: the daemon (`python -m swarmbase`) holds a live run whose event buffer is
full; N clients (spread over 127.0.0.2…) ask for its stream and never read. Prints the
daemon's RSS before, at its peak and after they leave, the most streams served at once,
and /healthz latency meanwhile.

The daemon runs as its own process (`python -m swarmbase`) with the fake CLI as its
claude engine. The viewers (lean SSE readers, in this process) watch the run's event stream
while its 200 agents go through queued → running → done. For every agent event each
viewer records arrival time minus the server's publish time (same clock, same machine).
Prints the median and p95 delay and the daemon's CPU while they watch.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.profile import Recorder  # noqa: E402
from swarmbase.client import connect  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
TS = re.compile(rb'"ts":([0-9.]+)')


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def main(viewers: int, agents: int, profile: str | None = None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-sse-"))
    (tmp / "bin").mkdir()
    state = tmp / "state"
    state.mkdir()
    # A shell fake CLI: the Python one costs ~25 ms of CPU per start, and 200 of them on
    # two cores would measure CPU contention rather than the event path.
    cli = tmp / "bin" / "claude"
    cli.write_text("#!/bin/sh\np=$(cat)\ncase \"$p\" in waitfile:*) f=${p#waitfile:}; f=${f%% *};\n"
                   "  while [ -e \"$f\" ]; do sleep 0.05; done;;\n  *) sleep 0.05;;\nesac\n"
                   "echo '{\"type\":\"system\",\"subtype\":\"init\",\"model\":\"m\"}'\n"
                   "echo '{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"ok\","
                   "\"total_cost_usd\":0.01}'\n")
    cli.chmod(0o755)
    key = state / "k.key"
    key.write_text("sk-bench-000000")
    key.chmod(0o600)
    token = secrets.token_hex(24)
    (state / "config.json").write_text(json.dumps({
        "port": 0, "perRunConcurrency": 8, "maxAgentsPerRun": agents, "engines": {"claude": {"bin": str(cli)}},
        "callers": [{"name": "b", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(), "apiKeyFile": str(key),
                     "runUsdMax": 1000}]}))
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    try:
        buf = b""
        while b"listening on" not in buf:
            buf += await proc.stderr.receive_some(4096)
        url = re.search(rb"listening on (http://[\d.:]+)", buf).group(1).decode()
        gate = tmp / "gate"
        gate.write_text("")
        script = (f"await agent('waitfile:{gate}', {{label: 'gate'}});\n"
                  f"return (await parallel(Array.from({{length: {agents - 1}}}, (_, i) => () => "
                  f"agent('work ' + i, {{maxUsd: 0.05}})))).length")
        async with connect(url.replace("http", "ws") + "/mcpl", token) as h:
            await h.handshake()
            run_id = (await h.tool("run", {"script": script, "budgetUsd": 100}))["structuredContent"]["runId"]
            delays: list[float] = []
            counts = [0] * viewers
            ready = trio.Semaphore(0)

            host, port = url.split("//")[1].split(":")

            async def viewer(i: int) -> None:
                # A lean SSE reader (HTTP/1.0, so the body is not chunked): 50 full HTTP
                # clients in one Python process would measure the clients, not the daemon.
                # Spread over loopback addresses: the daemon caps streams per client address.
                sock = trio.socket.socket()
                await sock.bind((f"127.0.0.{2 + i % 100}", 0))
                await sock.connect((host, int(port)))
                stream = trio.SocketStream(sock)
                async with stream:
                    await stream.send_all(f"GET /runs/{run_id}/events HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
                    ready.release()
                    buf = b""
                    while True:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            return
                        now = time.time()
                        buf += chunk
                        *frames, buf = buf.split(b"\n\n")
                        for f in frames:
                            if b"event: agent" in f:
                                delays.append(now - float(TS.search(f).group(1)))
                                counts[i] += 1
                            elif b"event: run" in f and b'"status":"completed"' in f:
                                return

            if True:
                async with trio.open_nursery() as n:
                    for i in range(viewers):
                        n.start_soon(viewer, i)
                    for _ in range(viewers):
                        await ready.acquire()
                    with Recorder(proc.pid, profile):
                        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
                        gate.unlink()
                        await h.wait_notice(f"{run_id}:end")
                        cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
        import httpx
        async with httpx.AsyncClient(base_url=url) as c:
            lag = (await c.get("/streams")).json().get("loopLag") or {}
        delays.sort()
        print(f"{viewers} viewers × {agents} agents: {len(delays)} agent events received "
              f"({min(counts)}–{max(counts)} per viewer)")
        print(f"delay state change → viewer: median {statistics.median(delays) * 1000:.1f} ms, "
              f"p95 {delays[int(len(delays) * 0.95)] * 1000:.1f} ms, max {delays[-1] * 1000:.1f} ms")
        print(f"daemon CPU while watched: {(cpu1 - cpu0) / (t1 - t0) * 100:.0f}% of one core over {t1 - t0:.1f} s "
              f"(runner, 200 agents and 50 streams); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if lag:
            print(f"daemon event-loop lag (its own probe, last {lag['samples']} ticks): p50 {lag['p50Ms']} ms, "
                  f"p99 {lag['p99Ms']} ms, max {lag['maxMs']} ms")
    finally:
        proc.terminate()
        await proc.wait()


async def flood_main(n: int, path: str) -> None:
    from tests import flood
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-flood-"))
    d = await flood.start_daemon(tmp)
    try:
        host, port = d.host_port
        run_id = await flood.start_backlog_run(d, tmp / "gate")
        await trio.sleep(1)
        paths = {"run": [f"/runs/{run_id}/events"], "list": ["/events"], "idle": ["/streams"]}[path]
        base = flood.rss_mb(d.proc.pid)
        t0 = time.perf_counter()
        clients = await flood.flood(host, port, paths, n)
        opened = time.perf_counter() - t0
        peak, most, lat = base, 0, []
        for _ in range(60):
            await trio.sleep(0.25)
            peak = max(peak, flood.rss_mb(d.proc.pid))
            lat.append(await flood.healthz_ms(host, port))
            most = max(most, (await flood.stream_stats(host, port))["streams"])
        statuses = [await flood.status_of(c) for c in clients]
        for c in clients:
            await c.aclose()
        lat_after = []
        for _ in range(48):                            # 12 s: the streams unwind, the heap is handed back
            await trio.sleep(0.25)
            lat_after.append(await flood.healthz_ms(host, port))
        after = flood.rss_mb(d.proc.pid)
        stats = await flood.stream_stats(host, port)
        print(f"{n} non-reading clients on {paths[0]} (opened in {opened:.1f} s): "
              f"{statuses.count(200)} answered 200, {statuses.count(429)} 429, {statuses.count(503)} 503, "
              f"{statuses.count(0)} dropped before answering; at most {most} streams at once; "
              f"{stats['dropped']} dropped by the daemon")
        print(f"daemon RSS: {base:.0f} MB before, {peak:.0f} MB at peak (+{peak - base:.0f} MB), "
              f"{after:.0f} MB 12 s after they left")
        print(f"/healthz meanwhile ({len(lat)} requests): {flood.summary(lat)}; "
              f"after they left ({len(lat_after)}): {flood.summary(lat_after)}")
    finally:
        d.proc.terminate()
        await d.proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--viewers", type=int, default=50)
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--flood", type=int, default=0, help="clients that never read (flood mode)")
    p.add_argument("--path", choices=["run", "list", "idle"], default="run")
    p.add_argument("--profile", help="write py-spy stacks of the daemon here (see bench/profile.py)")
    a = p.parse_args()
    if a.flood:
        trio.run(flood_main, a.flood, a.path)
    else:
        trio.run(main, a.viewers, a.agents, a.profile)
