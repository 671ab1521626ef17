"""Resume of a finished 200-agent run, and delivery of 1,000 pending notices.

    python3 bench/durability.py [--agents 200] [--notices 1000]

1. A run of 200 no-op fake-CLI agents ends; `resume` is called over MCPL and timed to its
   end notice; processes spawned by the resume are counted (target: 0, under 0.5 s).
2. 1,000 notices are added to the outbox of an offline caller (each an fsync'd append to
   outbox.jsonl, timed), then a host connects and the time until it has all of them
   (1,000 deliveries, each acknowledged by an appended ack line) is measured, with the size of
   the log before and after the background compaction.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import config, daemon  # noqa: E402
from swarmbase.notify import notices  # noqa: E402
from swarmbase.client import connect  # noqa: E402
from swarmbase.runs.model import Run  # noqa: E402
from tests.fakes import fake_claude  # noqa: E402


def write_cfg(state: Path, cli: Path, token: str, n: int) -> config.Config:
    key = state / "bench.key"
    key.write_text("sk-bench-key-000000")
    key.chmod(0o600)
    (state / "config.json").write_text(json.dumps({
        "port": 0, "perRunConcurrency": 8, "maxAgentsPerRun": n, "engines": {"claude": {"bin": str(cli)}},
        "callers": [{"name": "bench", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                     "apiKeyFile": str(key), "runUsdMax": 1000, "maxActiveRuns": 10}]}))
    return config.load(state / "config.json")


async def resume_bench(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-resume-"))
    (tmp / "bin").mkdir()
    (tmp / "state").mkdir()
    cli = fake_claude.install(tmp / "bin")
    token = secrets.token_hex(24)
    cfg = write_cfg(tmp / "state", cli, token, n)
    script = (f"return (await parallel(Array.from({{length: {n}}}, (_, i) => () => "
              f"agent('noop ' + i, {{maxUsd: 0.05}})))).length")
    async with trio.open_nursery() as nursery:
        url, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        ws = url.replace("http", "ws") + "/mcpl"
        async with connect(ws, token) as h:
            await h.handshake()
            t = time.perf_counter()
            rid = (await h.tool("run", {"script": script, "budgetUsd": 100}))["structuredContent"]["runId"]
            await h.wait_notice(f"{rid}:end")
            live_s = time.perf_counter() - t
            spawned_before = services.supervisor.agents.spawned
            t = time.perf_counter()
            new = (await h.tool("resume", {"runId": rid}))["structuredContent"]["runId"]
            note = await h.wait_notice(f"{new}:end")
            resume_s = time.perf_counter() - t
        spawned = services.supervisor.agents.spawned - spawned_before
        assert "swarmbase:completed" in note["tags"], note
        nursery.cancel_scope.cancel()
    print(f"live run of {n} agents: {live_s:.2f} s")
    print(f"resume → end notice:    {resume_s * 1000:.0f} ms, {spawned} agent processes spawned "
          f"(target 0, < 500 ms; includes the Node runner start)")


async def outbox_bench(count: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-outbox-"))
    (tmp / "bin").mkdir()
    (tmp / "state").mkdir()
    cli = fake_claude.install(tmp / "bin")
    token = secrets.token_hex(24)
    cfg = write_cfg(tmp / "state", cli, token, 10)
    log_path = tmp / "state" / "outbox.jsonl"
    async with trio.open_nursery() as nursery:
        url, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        runs = [Run(id=f"run_{i:012x}", caller="bench", dir_name="x", created_at=0, status="completed")
                for i in range(count)]
        built = [notices.build(run, str(i), url=f"{url}/runs/{run.id}") for i, run in enumerate(runs)]
        t = time.perf_counter()
        for n in built:
            services.outbox.add("bench", n)
        add_s = time.perf_counter() - t
        size_full = log_path.stat().st_size
        async with connect(url.replace("http", "ws") + "/mcpl", token) as h:
            t = time.perf_counter()
            await h.handshake()
            for _ in range(count):
                await h.notices.receive()
            deliver_s = time.perf_counter() - t
            while services.outbox.pending("bench"):
                await trio.sleep(0.01)
            drained_s = time.perf_counter() - t
            while log_path.stat().st_size > size_full // 2:     # the background compaction
                await trio.sleep(0.01)
            compacted_s = time.perf_counter() - t
        nursery.cancel_scope.cancel()
    print(f"outbox: {count} adds in {add_s * 1000:.0f} ms ({add_s / count * 1e6:.0f} µs each, an fsync'd append; "
          f"log {size_full / 1024:.0f} KiB)")
    print(f"outbox: {count} deliveries on reconnect in {deliver_s * 1000:.0f} ms ({count / deliver_s:.0f}/s), "
          f"all acknowledged after {drained_s * 1000:.0f} ms; log compacted to "
          f"{log_path.stat().st_size} bytes after {compacted_s * 1000:.0f} ms")


async def main(agents: int, count: int) -> None:
    await resume_bench(agents)
    await outbox_bench(count)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--notices", type=int, default=1000)
    a = p.parse_args()
    trio.run(main, a.agents, a.notices)
