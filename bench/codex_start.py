"""Codex agent start with 10 runs vs 10,000 runs in the store, side by side.

    python3 bench/codex_start.py [--runs 10,10000] [--agents 12] [--sandbox bwrap,none]

For each store size (ended runs generated on disk, as a busy daemon leaves them) and each
sandbox mode, an in-process daemon with the real Codex CLI (tests/.tools) against the fake
Responses API runs one script of `--agents` codex agents one after another. Per agent:
- daemon start: the engine is called → the CLI's process exists (options, meter bearer,
  deny list, config.toml, private dir, sandbox argv, fork);
- first request: the engine is called → the CLI's first request reaches the meter (the
  daemon's part plus the CLI reading its config, which holds the deny list without the
  sandbox).
Prints medians per size and the difference (target: within 5 ms of the 10-run figure).
With the sandbox on (the default) codex gets no deny list: nothing of the store exists in
its namespace. Without it the deny list names every run's records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import config, daemon  # noqa: E402
from tests.fakes.responses_api import FakeResponses  # noqa: E402
from tests.gen_runs import generate  # noqa: E402

# Through the real tools dir: a symlinked path under the temp dir does not exist in the sandbox.
CODEX = Path(os.path.realpath(ROOT / "tests" / ".tools")) / "node_modules" / ".bin" / "codex"


async def one_store(tmp: Path, api_url: str, n_runs: int, n_agents: int, sandbox: str) -> dict[str, Any]:
    state = tmp / f"state-{sandbox}-{n_runs}"
    state.mkdir()
    t = time.perf_counter()
    generate(state, n_runs)
    gen_s = time.perf_counter() - t
    key = state / "bench.key"
    key.write_text("gw-bench-000000")
    key.chmod(0o600)
    token = secrets.token_hex(24)
    homes = {}
    if sandbox == "none":    # codex refuses its PATH aliases under the temp dir
        homes = {"homesDir": str(Path.home() / ".cache" / f"sb-bench-homes-{os.getpid()}-{n_runs}")}
    cfg_path = state / "config.json"
    cfg_path.write_text(json.dumps({
        "port": 0, "sandbox": sandbox, **homes,
        "engines": {"codex": {"bin": str(CODEX), "baseUrl": api_url, "maxTokensDefault": 200_000,
                              "maxTokensMax": 300_000}},
        "callers": [{"name": "bench", "tokenSha256": hashlib.sha256(token.encode()).hexdigest(),
                     "apiKeyFile": str(key), "runUsdMax": 1000, "maxProfile": "write",
                     "defaultModels": {"codex": "gpt-5.5"}, "engines": ["codex"]}]}))
    cfg = config.load(cfg_path)
    spawned: dict[int, float] = {}
    called: dict[int, float] = {}
    first: dict[int, float] = {}
    try:
        async with trio.open_nursery() as nursery:
            _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
            sup = services.supervisor
            assert len(sup.runs) == n_runs
            engine = sup.agents.engines["codex"].cli
            original_run = engine.run

            async def timed_run(job: Any, io: Any) -> Any:
                called[job.n] = time.perf_counter()
                inner = io.started

                def started(where: Any) -> None:
                    spawned.setdefault(job.n, time.perf_counter())
                    inner(where)
                return await original_run(job, attrs.evolve(io, started=started))
            engine.run = timed_run
            meter = services.meter
            original_relay = meter._relay

            async def timed_relay(agent: Any, headers: Any, body: Any, send: Any) -> None:
                first.setdefault(agent.n, time.perf_counter())
                await original_relay(agent, headers, body, send)
            meter._relay = timed_relay
            script = (f"const out = []; for (let i = 0; i < {n_agents}; i++) "
                      f"out.push(await agent('hello ' + i, {{engine: 'codex', profile: 'read'}})); return out.length")
            run = sup.start(cfg.caller("bench"), {"script": script, "budgetUsd": 50})
            await sup.live[run.id].finished.wait()
            assert run.status == "completed", run.error
            nursery.cancel_scope.cancel()
    finally:
        if homes:
            shutil.rmtree(homes["homesDir"], ignore_errors=True)
    ns = sorted(called)[1:]                        # the first agent pays cold caches
    return {"gen_s": gen_s, "spawn": statistics.median((spawned[n] - called[n]) * 1000 for n in ns),
            "first": statistics.median((first[n] - called[n]) * 1000 for n in ns if n in first)}


async def main(sizes: list[int], n_agents: int, modes: list[str]) -> None:
    if not CODEX.exists():
        raise SystemExit(f"the Codex CLI is not installed at {CODEX}: run bash tests/install.sh")
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-codex-"))
    async with trio.open_nursery() as nursery:
        api = await nursery.start(FakeResponses().serve)
        for mode in modes:
            figures = {}
            for n in sizes:
                figures[n] = await one_store(tmp, api.url, n, n_agents, mode)
                f = figures[n]
                print(f"sandbox {mode}, {n:>6} runs in the store: daemon start (engine → process) "
                      f"p50 {f['spawn']:.1f} ms; engine → first request at the meter p50 {f['first']:.1f} ms",
                      flush=True)
            small, big = figures[sizes[0]], figures[sizes[-1]]
            print(f"sandbox {mode}: {sizes[-1]} vs {sizes[0]} runs: daemon start {big['spawn'] - small['spawn']:+.1f} ms, "
                  f"first request {big['first'] - small['first']:+.1f} ms (target within 5 ms)")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        nursery.cancel_scope.cancel()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default="10,10000")
    p.add_argument("--agents", type=int, default=12)
    p.add_argument("--sandbox", default="bwrap,none")
    a = p.parse_args()
    trio.run(main, [int(x) for x in a.runs.split(",")], a.agents, a.sandbox.split(","))
