"""Hostile-input figures (issue 10): another caller's `status` latency while one caller
floods `phase()` and `log()`.

    python3 bench/hostile.py [--seconds 10]

Two callers on a real daemon process; `flood` runs scripts that call log() and phase() as
fast as they can (yielding through failing agent() calls so the watchdog does not stop
them), while `quiet` asks `status` of its own run over MCPL in a loop. Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import time

import trio

from common import rss_mb, start, state_dir, stop, summary  # noqa: E402
from swarmbase.client import connect

FLOOD = """
for (let i = 0; ; i++) {
  log('flood line ' + i + ' ' + 'x'.repeat(200));
  if (i % 10 === 0 && i < 9000) phase('p' + i);
  try { await agent('x'); } catch (e) {}
}"""


async def main(seconds: float) -> None:
    state = state_dir("sb-hostile-")
    tokens = {n: secrets.token_hex(24) for n in ("flood", "quiet")}
    (state / "config.json").write_text(json.dumps({
        "port": 0, "maxPhasesPerRun": 10_000, "maxLogBytesPerRun": 1 << 30,
        "callers": [{"name": n, "tokenSha256": hashlib.sha256(t.encode()).hexdigest(), "maxActiveRuns": 10}
                    for n, t in tokens.items()]}))
    async with trio.open_nursery() as nursery:
        d = await start(state, tokens["flood"], nursery)
        try:
            async with connect(d.ws, tokens["quiet"]) as q, connect(d.ws, tokens["flood"]) as f:
                await q.handshake()
                await f.handshake()
                own = (await q.tool("run", {"script": "log('hello'); return 1"}))["structuredContent"]["runId"]
                await q.wait_notice(f"{own}:end")
                idle = []
                for _ in range(50):
                    t = time.perf_counter()
                    await q.tool("status", {"runId": own})
                    idle.append((time.perf_counter() - t) * 1000)
                floods = [(await f.tool("run", {"script": FLOOD}))["structuredContent"]["runId"] for _ in range(2)]
                await trio.sleep(1.0)
                busy = []
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline:
                    t = time.perf_counter()
                    await q.tool("status", {"runId": own})
                    busy.append((time.perf_counter() - t) * 1000)
                    await trio.sleep(0.02)
                lines = []
                for rid in floods:
                    st = (await f.tool("status", {"runId": rid, "logLines": 1}))["structuredContent"]
                    lines.append(st["log"][-1]["message"].split()[2] if st["log"] else "?")
                    await f.tool("cancel", {"runId": rid})
                print(f"quiet caller's status, idle daemon: {summary(idle)}")
                print(f"quiet caller's status during 2 flooding runs ({seconds:.0f} s): {summary(busy)}")
                print(f"the floods reached log line {', '.join(lines)}; daemon RSS {rss_mb(d.proc.pid):.1f} MB")
        finally:
            await stop(d)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10)
    trio.run(main, p.parse_args().seconds)
