"""Think agents inside the daemon against the same agents as `claude -p` each (issue 23).

    python3 bench/think_inproc.py [--agents 40] [--rounds 3]

Two real daemon processes (`python -m swarmbase`, perRunConcurrency 8), one with
`engines.claude.inProcessThink` on (the default) and one with it off, each in a cgroup of
its own (bench/tree_cgroup.py), against one fake Messages API on loopback (the peer
bench's CountedModel). Each round runs one fan-out of --agents no-op think agents on both,
alternating which goes first. Printed per path (medians over the rounds): wall, the
daemon process's own CPU, the rest of its tree's CPU (the CLIs with their sandboxes, and
the script runner), per agent, and the requests the model got. Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peer_measure import Figures, loadavg, measure  # noqa: E402
from bench.tree_cgroup import CgroupUnavailable, TreeCgroup  # noqa: E402
from tests.peer.counted_model import CountedModel  # noqa: E402
from tests.peer.daemon_side import swarmbase_daemon  # noqa: E402

SCRIPT = ("export const meta = { name: 'think-bench', description: 'no-op think agents' }\n"
          "const r = await parallel(Array.from({length: args.n}, (_, i) => () => agent(`no-op ${i}`)));\n"
          "return r.filter((x) => x !== null).length;\n")
PATHS = ("in-daemon", "cli")


def row(name: str, figs: list[Figures], n: int) -> str:
    wall = statistics.median(f.wall_s for f in figs)
    own = statistics.median(f.own_s or 0.0 for f in figs)
    tree = statistics.median(f.cpu_s for f in figs)
    rest = max(tree - own, 0.0)
    reqs = statistics.median(f.requests["total"] for f in figs)
    return (f"| {name} | {wall:.2f} s | {1000 * wall / n:.1f} ms | {1000 * own / n:.1f} ms | {1000 * rest / n:.1f} ms | "
            f"{1000 * tree / n:.1f} ms | {reqs:.0f} |")


async def main(args: argparse.Namespace) -> None:
    TreeCgroup.sweep_stale()
    try:
        trees = {p: TreeCgroup.create(f"think-{p}") for p in PATHS}
    except CgroupUnavailable as e:
        raise SystemExit(f"no cgroup for the process trees: {e}") from None
    base = Path(tempfile.mkdtemp(prefix="think-bench-"))
    base.chmod(0o755)
    print(f"{args.agents} think agents per run, {args.rounds} rounds; state under {base}; loadavg {loadavg()}")
    figures: dict[str, list[Figures]] = {p: [] for p in PATHS}
    try:
        async with trio.open_nursery() as n, AsyncExitStack() as stack:
            model = await n.start(CountedModel().serve)
            daemons = {p: await stack.enter_async_context(swarmbase_daemon(
                base / p, model.url, launcher=trees[p].launcher(), in_process_think=p == "in-daemon",
                perRunConcurrency=8)) for p in PATHS}
            call = {"script": SCRIPT, "args": {"n": args.agents}, "profile": "think"}
            for rnd in range(1, args.rounds + 1):
                for p in PATHS if rnd % 2 else tuple(reversed(PATHS)):
                    sb = daemons[p]
                    run, fig = await measure(tuple(trees.values()), trees[p], model,
                                             lambda sb=sb: sb.run(call, timeout=3600), sample_s=0.25,
                                             daemon_pid=sb.pid)
                    ok = run.status == "completed" and run.result == args.agents
                    print(f"round {rnd} {p:<9} wall {fig.wall_s:.2f} s, tree CPU {fig.cpu_s:.2f} s, daemon "
                          f"{fig.own_s or 0:.2f} s, requests {fig.requests['total']}"
                          + ("" if ok else f"  PROBLEM: {run.status} {run.result} {run.error}"), flush=True)
                    figures[p].append(fig)
            n.cancel_scope.cancel()
    finally:
        for t in trees.values():
            t.remove()
    print("\n| path | wall | wall per agent | daemon CPU per agent | rest of the tree per agent "
          "(CLIs, sandboxes, runner) | tree CPU per agent | requests |")
    print("|---|---|---|---|---|---|---|")
    for p in PATHS:
        print(row(p, figures[p], args.agents))
    print(f"\nloadavg at the end: {loadavg()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    trio.run(main, ap.parse_args())
