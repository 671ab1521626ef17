"""The meter relaying a 100 MB SSE response: RSS growth and throughput vs a direct read.

    python3 bench/meter_relay.py [--mb 100]

Three processes: an upstream that streams `--mb` MB of `response.output_text.delta`
events (1 KB each) then a `response.completed` with usage; the meter (the daemon's own
module, in a child process so its RSS is its own); and this client, which reads the
response once directly and once through the meter. Prints throughput of both and the
meter's RSS before and at its peak (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.profile import Recorder  # noqa: E402

UPSTREAM = textwrap.dedent("""
    import json, sys, trio, hypercorn.config, hypercorn.trio
    from functools import partial
    MB = int(sys.argv[1])
    delta = ("event: response.output_text.delta\\ndata: " + json.dumps({"type": "response.output_text.delta",
             "delta": "x" * 1000}) + "\\n\\n").encode()
    batch = delta * 64
    done = ("event: response.completed\\ndata: " + json.dumps({"type": "response.completed", "response": {
            "id": "r", "status": "completed", "output": [], "usage": {"input_tokens": 10, "output_tokens":
            MB * 250_000, "total_tokens": 10 + MB * 250_000}}}) + "\\n\\n").encode()
    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        sent = 0
        while sent < MB * 1024 * 1024:
            await send({"type": "http.response.body", "body": batch, "more_body": True})
            sent += len(batch)
        await send({"type": "http.response.body", "body": done, "more_body": False})
    async def main():
        cfg = hypercorn.config.Config(); cfg.bind = ["127.0.0.1:0"]; cfg.accesslog = None; cfg.errorlog = None
        async with trio.open_nursery() as n:
            binds = await n.start(partial(hypercorn.trio.serve, app, cfg))
            print(binds[0], flush=True)
    trio.run(main)
""")

METER = textwrap.dedent("""
    import sys, trio
    sys.path.insert(0, sys.argv[2])
    from swarmbase.engines.meter import Meter
    from swarmbase.daemon import serve_relay
    async def main():
        m = Meter()
        async with trio.open_nursery() as n:
            await n.start(serve_relay, m)
            a = m.register(run_id="run_bench", n=1, label="b", gateway_token="gw", upstream=sys.argv[1],
                           max_tokens=10**12, max_usd=None, price=None, kill=lambda r: None)
            print(m.url, a.bearer, flush=True)
            await trio.sleep_forever()
    trio.run(main)
""")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


async def read_all(url: str, headers: dict[str, str]) -> tuple[int, float]:
    total = 0
    t = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=None)) as c:
        async with c.stream("POST", url, headers=headers, content=json.dumps({"input": []})) as r:
            async for chunk in r.aiter_raw():
                total += len(chunk)
    return total, time.perf_counter() - t


async def main(mb: int, profile: str | None = None) -> None:
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(mb)], stdout=subprocess.PIPE, text=True)
    upstream = up.stdout.readline().strip()
    meter = subprocess.Popen([sys.executable, "-c", METER, upstream, str(ROOT)], stdout=subprocess.PIPE, text=True)
    meter_url, bearer = meter.stdout.readline().split()
    try:
        rss_start = status_kb(meter.pid, "VmRSS")
        await read_all(upstream + "/responses", {})                          # warm both paths
        await read_all(meter_url + "/responses", {"Authorization": f"Bearer {bearer}"})
        rss0 = status_kb(meter.pid, "VmRSS")
        direct_bytes, direct_s = await read_all(upstream + "/responses", {})
        cpu0, up0 = cpu_seconds(meter.pid), cpu_seconds(up.pid)
        with Recorder(meter.pid, profile, idle=bool(os.environ.get("BENCH_IDLE")), gil=not os.environ.get("BENCH_IDLE")):
            relayed_bytes, relayed_s = await read_all(meter_url + "/responses", {"Authorization": f"Bearer {bearer}"})
        meter_cpu, up_cpu = cpu_seconds(meter.pid) - cpu0, cpu_seconds(up.pid) - up0
        hwm = status_kb(meter.pid, "VmHWM")
        rss1 = status_kb(meter.pid, "VmRSS")
    finally:
        meter.terminate()
        up.terminate()
    mib = direct_bytes / 2**20
    print(f"response: {mib:.0f} MiB of SSE ({direct_bytes // 1060:,} events)")
    print(f"direct:        {direct_s:.2f} s, {mib / direct_s:.0f} MiB/s")
    print(f"through meter: {relayed_s:.2f} s, {relayed_bytes / 2**20 / relayed_s:.0f} MiB/s "
          f"({relayed_s / direct_s:.2f}× the direct time)")
    print(f"meter RSS: {rss_start / 1024:.1f} MiB at start, {rss0 / 1024:.1f} MiB after a warm-up relay, "
          f"{rss1 / 1024:.1f} MiB after the measured one, peak {hwm / 1024:.1f} MiB "
          f"(growth over the start {(max(hwm, rss1) - rss_start) / 1024:.1f} MiB; target < 10 MB)")
    print(f"relay / direct throughput: {direct_s / relayed_s:.2f}× (target ≥ 0.8×); during the relay the meter "
          f"used {meter_cpu:.2f} s of CPU, the upstream {up_cpu:.2f} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--profile", help="write py-spy stacks of the meter here (see bench/profile.py)")
    a = p.parse_args()
    trio.run(main, a.mb, a.profile)
