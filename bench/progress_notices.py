"""Notices per run with progress on (issue 24 #1), after coalescing, against what an
uncoalesced feed would send.

    python3 bench/progress_notices.py [--agents 200] [--fail-every 20]

Starts the real daemon (`python -m swarmbase`) with the fake claude CLI
(tests/fakes/fake_claude.py: `noop` succeeds, `noresult` fails) and runs, each with
`notify: ["phase", "failures"]`, a 200-agent script two ways: 8 phases of 25 agents in
parallel(), and one phase per agent (the chattiest a script can be), with one agent in
--fail-every failing. Each shape runs once for a host that is connected all along and once
for a host that connects only after the run ended. Uncoalesced, a run would send one
notice per event (every phase end but the last, and the first failure) plus the end
notice. The run's one budget warning (its agents' reservations cross budgetWarnAt) is a
notice of another kind, counted apart. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import start, state_dir, stop, write_config  # noqa: E402
from swarmbase.client import accept_all, connect  # noqa: E402
from tests.fakes import fake_claude  # noqa: E402

SCRIPT = r"""
const per = args.agents / args.phases;
for (let p = 0; p < args.phases; p++) {
  phase('phase ' + p);
  await parallel(Array.from({length: per}, (_, i) => () =>
    agent((p * per + i) % args.failEvery === args.failEvery - 1 ? 'noresult' : 'noop', {label: `p${p}a${i}`})));
}
return 'done'
"""


class Counter:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        self.ids.append(params["eventId"])
        return accept_all(params)


async def one(d: Any, phases: int, agents: int, fail_every: int, online: bool) -> dict[str, Any]:
    host = Counter()
    args = {"phases": phases, "agents": agents, "failEvery": fail_every}
    t = time.perf_counter()
    async with connect(d.ws, d.token, push_answer=host.answer) as h:
        await h.handshake(grant=online)                  # not granted: nothing is pushed yet
        res = await h.tool("run", {"script": SCRIPT, "args": args, "notify": ["phase", "failures"],
                                   "budgetUsd": 50})
        run_id = res["structuredContent"]["runId"]
        if online:
            await h.wait_notice(f"{run_id}:end")
        else:
            while (await h.tool("status", {"runId": run_id, "logLines": 0}))["structuredContent"]["status"] \
                    in ("queued", "running"):
                await trio.sleep(0.5)
    wall = time.perf_counter() - t
    if not online:
        async with connect(d.ws, d.token, push_answer=host.answer) as h:
            await h.handshake()
            await h.wait_notice(f"{run_id}:end")
    mine = [e for e in host.ids if e.startswith(run_id)]
    # Outbox lines written for the run's progress (adds and in-place updates; each fsync'd).
    writes = sum(1 for line in (d.state / "outbox.jsonl").read_text().splitlines()
                 if f'"eventId":"{run_id}:progress:' in line and '"op":"add"' in line)
    failures = 1 if agents >= fail_every else 0
    return {"progress": sum(1 for e in mine if ":progress:" in e), "total": len(mine),
            "warning": sum(1 for e in mine if e.endswith(":budget-warning")), "writes": writes,
            "uncoalesced": (phases - 1) + failures + 1, "wall": wall}


async def main(opts: argparse.Namespace) -> None:
    state = state_dir("swarmbase-bench-progress-")
    bin_dir = state_dir("swarmbase-bench-progress-bin-")     # outside the state dir, which agents never see
    cli = fake_claude.install(bin_dir)
    token = write_config(state, extra={"engines": {"claude": {"bin": str(cli)}}, "maxAgentsPerRun": 1000})
    async with trio.open_nursery() as nursery:
        d = await start(state, token, nursery)
        try:
            print(f"notices per {opts.agents}-agent run with notify [phase, failures], one agent in "
                  f"{opts.fail_every} failing (progress notices + the end notice):")
            for phases in (8, opts.agents):
                for online in (True, False):
                    r = await one(d, phases, opts.agents, opts.fail_every, online)
                    host = "connected all along" if online else "connected after the run ended"
                    print(f"  {phases:>4} phases, host {host:<30}: {r['progress'] + 1:>3} notices "
                          f"({r['progress']} progress + the end); uncoalesced {r['uncoalesced']:>3}; "
                          f"outbox writes for progress {r['writes']}; budget warnings besides: {r['warning']}; "
                          f"run wall {r['wall']:.1f} s")
        finally:
            await stop(d)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--fail-every", type=int, default=20)
    trio.run(main, p.parse_args())
