"""Script language v2 figures (issue 12).

    python3 bench/script_v2.py [--trials 10]

1. race: time from the winner's end to the loser's process being gone (real claude CLI,
   fake API: a 1 s agent against a 60 s one), over `--trials` races.
2. resume of a 3-level tree of 60 agents (fake CLI): agent processes spawned on resume
   (target 0) and the resume's wall time.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import trio

from common import CLAUDE, state_dir, summary  # noqa: E402
from swarmbase import config, daemon

from conftest import descendants, process_table  # noqa: E402
from fakes import fake_claude  # noqa: E402
from fakes.anthropic_api import FakeAnthropic  # noqa: E402

TREE = """
const leaf = "return await parallel(Array.from({length: 8}, (_, i) => () => agent('noop ' + args.tag + ' ' + i)))";
const mid = `
  const own = await parallel(Array.from({length: 4}, (_, i) => () => agent('noop mid ' + args.tag + ' ' + i)));
  const deeper = await parallel([0, 1].map((j) => () => workflow(args.leaf, { tag: args.tag + '.' + j })));
  return [own, deeper];`;
return await parallel(['a', 'b', 'c'].map((t) => () => workflow(mid, { tag: t, leaf })));"""


def write(state: Path, engines: dict, extra: dict | None = None) -> config.Config:
    key = state / "k.key"
    key.write_text("sk-bench-0123456789abcdef")
    key.chmod(0o600)
    (state / "config.json").write_text(json.dumps({
        "port": 0, "engines": engines, "perRunConcurrency": 12, "maxConcurrentAgents": 12, **(extra or {}),
        "callers": [{"name": "b", "tokenSha256": "b" * 64, "apiKeyFile": str(key), "maxProfile": "write",
                     "runUsdMax": 1000, "runUsdDefault": 100}]}))
    return config.load(state / "config.json")


async def wait_end(sup, run) -> None:
    if run.id in sup.live:
        await sup.live[run.id].finished.wait()


async def race_trials(trials: int, nursery: trio.Nursery) -> list[float]:
    api = await nursery.start(FakeAnthropic().serve)
    cfg = write(state_dir("sb-race-"), {"claude": {"bin": str(CLAUDE), "baseUrl": api.url}})
    _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
    sup = services.supervisor
    out = []
    for _ in range(trials):
        run = sup.start(cfg.caller("b"), {"script": "return await race([() => agent('[[sleep:60]] slow'), "
                                                    "() => agent('[[sleep:1]] fast')])"})
        live = sup.live[run.id]
        while not (2 in live.agents and live.agents[2].state == "done"):
            await trio.sleep(0.001)
        won = time.time()
        me = os.getpid()
        while any(b"claude" in process_table().get(p, (0, "", b""))[2] for p in descendants(me)):
            await trio.sleep(0.001)
        out.append((time.time() - won) * 1000)
        await wait_end(sup, run)
    return out


async def tree_resume(nursery: trio.Nursery) -> tuple[int, int, float, float]:
    state = state_dir("sb-tree-")
    (state / "bin").mkdir()
    cli = fake_claude.install(state / "bin")
    cfg = write(state, {"claude": {"bin": str(cli)}}, {"sandbox": "none"})
    _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
    sup = services.supervisor
    spawns = state / "bin" / "spawns.log"
    t = time.perf_counter()
    first = sup.start(cfg.caller("b"), {"script": TREE})
    await wait_end(sup, first)
    first_s = time.perf_counter() - t
    before = len(spawns.read_text().splitlines())
    t = time.perf_counter()
    again = sup.resume(cfg.caller("b"), first.id, {})
    await wait_end(sup, again)
    resume_s = time.perf_counter() - t
    spawned = len(spawns.read_text().splitlines()) - before
    return first.agents_total, spawned, first_s, resume_s


async def main(trials: int) -> None:
    async with trio.open_nursery() as nursery:
        print(f"race: winner's end → loser's processes gone: {summary(await race_trials(trials, nursery))}")
        total, spawned, first_s, resume_s = await tree_resume(nursery)
        print(f"3-level tree of {total} agents: first run {first_s:.2f} s; resume {resume_s:.2f} s "
              f"with {spawned} agent processes spawned")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=10)
    trio.run(main, p.parse_args().trials)
