"""200 no-op agents through the daemon vs a plain Trio loop spawning the same processes.

    python3 bench/agents_overhead.py [--agents 200] [--concurrency 8]

Both sides run the same fake `claude` executable (tests/fakes/fake_claude.py, which prints
a result at once), 8 at a time, in one process here. The daemon side is a real run: the
Node script runner, agent() over the bridge, budget, records, transcripts, process
groups. Prints wall times, the ratio (target ≤ 1.3×) and the per-agent overhead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import config, daemon  # noqa: E402
from tests.fakes import fake_claude  # noqa: E402


async def plain(cli: Path, prompt: Path, n: int, conc: int) -> float:
    sem = trio.Semaphore(conc)

    async def one() -> None:
        async with sem:
            with open(prompt, "rb") as stdin:
                await trio.run_process([str(cli)], stdin=stdin, stdout=subprocess.DEVNULL, start_new_session=True)

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return time.perf_counter() - t


async def through_daemon(state: Path, cli: Path, n: int, conc: int) -> tuple[float, int]:
    key = state / "bench.key"
    key.write_text("sk-bench-key-000000")
    key.chmod(0o600)
    token = secrets.token_hex(24)
    (state / "config.json").write_text(json.dumps({
        "port": 0, "perRunConcurrency": conc, "maxConcurrentAgents": conc, "maxAgentsPerRun": n,
        "engines": {"claude": {"bin": str(cli)}},
        "callers": [{"name": "bench", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                     "apiKeyFile": str(key), "runUsdMax": 1000}]}))
    cfg = config.load(state / "config.json")
    async with trio.open_nursery() as nursery:
        _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        sup = services.supervisor
        t = time.perf_counter()
        run = sup.start(cfg.caller("bench"), {"script": f"return (await parallel(Array.from({{length: {n}}}, "
                                                        f"() => () => agent('noop', {{maxUsd: 0.05}})))).length",
                                              "budgetUsd": 1000})
        await sup.live[run.id].finished.wait()
        elapsed = time.perf_counter() - t
        assert run.status == "completed", run.error
        spawned = sup.agents.spawned
        nursery.cancel_scope.cancel()
    return elapsed, spawned


async def main(n: int, conc: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-agents-"))
    (tmp / "bin").mkdir()
    cli = fake_claude.install(tmp / "bin")
    prompt = tmp / "prompt.txt"
    prompt.write_text("noop")
    await plain(cli, prompt, conc * 2, conc)                      # warm the page cache
    base = await plain(cli, prompt, n, conc)
    (tmp / "state").mkdir()
    d, spawned = await through_daemon(tmp / "state", cli, n, conc)
    print(f"{n} no-op agents, {conc} at a time")
    print(f"plain Trio loop:  {base:.2f} s ({base / n * 1000:.1f} ms per process)")
    print(f"through daemon:   {d:.2f} s ({spawned} processes spawned)")
    print(f"ratio:            {d / base:.2f}× (target ≤ 1.3×)")
    print(f"per-agent overhead: {(d - base) / n * 1000:.1f} ms wall, {(d - base) / n * conc * 1000:.1f} ms per agent slot")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    a = p.parse_args()
    trio.run(main, a.agents, a.concurrency)
