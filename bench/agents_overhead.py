"""No-op agents through the daemon vs a plain Trio loop spawning the same processes.

    python3 bench/agents_overhead.py [--agents 200] [--concurrency 8]
    python3 bench/agents_overhead.py --agents 200,2000      # scale: both sizes side by side

Both sides run the same fake `claude` executable (tests/fakes/fake_claude.py, which prints
a result at once), 8 at a time, in one process here. The daemon side is a real run with
the sandbox on (bubblewrap, as configured by default): the Node script runner, agent()
over the bridge, budget, records, transcripts, process groups. The plain loop is measured
twice, right before the daemon: spawning the bare CLI, and spawning it inside the same
bubblewrap sandbox the daemon uses (the same processes the daemon starts).

For each size it prints wall times, the ratios, the per-agent overhead, the event-loop
lag while the agents run (a probe task sleeping 5 ms at a time in the daemon's loop:
how late it wakes), and the daemon's memory: RSS growth over the run and what stays per
finished agent while the run is still live (Python heap, tracemalloc-free: RSS).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import config, daemon  # noqa: E402
from swarmbase.launch.sandbox import Confinement, HostLayout, bwrap_argv, interpreter_paths  # noqa: E402
from bench.common import write_config  # noqa: E402
from tests.fakes import fake_claude  # noqa: E402

PROBE_S = 0.005


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class LongSteps(trio.abc.Instrument):
    """Which task steps hold the loop longest (the profile of the lag): by the code the
    task was at when its step began, summed over steps of 2 ms and more."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.where = ""
        self.total: dict[str, list[float]] = {}

    @staticmethod
    def _where(task: trio.lowlevel.Task) -> str:
        """The innermost daemon frame (swarmbase/, dashboard/) of the task's await chain."""
        coro, ours = task.coro, None
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None) \
                or getattr(coro, "gi_frame", None)
            if frame is None:
                break
            if "swarmbase/" in frame.f_code.co_filename or "dashboard/" in frame.f_code.co_filename:
                ours = frame
            coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None) or getattr(coro, "gi_yieldfrom", None)
        if ours is None:
            return task.name
        return f"{ours.f_code.co_name} ({ours.f_code.co_filename.rsplit('/', 2)[-1]}:{ours.f_lineno})"

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.t0 = time.perf_counter()
        try:
            self.where = self._where(task)
        except Exception:
            self.where = task.name

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if not self.t0:
            return
        dt = (time.perf_counter() - self.t0) * 1000
        if dt >= 2:
            e = self.total.setdefault(self.where, [0.0, 0, 0.0])
            e[0] += dt
            e[1] += 1
            e[2] = max(e[2], dt)

    def report(self, top: int = 12) -> str:
        rows = sorted(self.total.items(), key=lambda kv: -kv[1][0])[:top]
        return "\n".join(f"    {v[0]:8.0f} ms in {v[1]:4d} steps (max {v[2]:5.1f} ms)  {k}" for k, v in rows)


async def lag_probe(out: list[float]) -> None:
    """How late the loop wakes a task that asked to sleep PROBE_S (ms)."""
    while True:
        t = trio.current_time()
        await trio.sleep(PROBE_S)
        out.append((trio.current_time() - t - PROBE_S) * 1000)


def sandboxed(cli: Path, cwd: Path) -> list[str]:
    """The bubblewrap prefix the local launcher puts around a claude agent (read profile)."""
    search = f"{cli.parent}:/usr/local/bin:/usr/bin:/bin"
    read = (str(cwd), *interpreter_paths(str(cli), search))
    return bwrap_argv(HostLayout.probe(), Confinement(cwd=str(cwd), read=read, network=True)) + [str(cli)]


async def plain(argv: list[str], prompt: Path, n: int, conc: int) -> float:
    sem = trio.Semaphore(conc)

    async def one() -> None:
        async with sem:
            with open(prompt, "rb") as stdin:
                await trio.run_process(argv, stdin=stdin, stdout=subprocess.DEVNULL, start_new_session=True)

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return time.perf_counter() - t


async def through_daemon(state: Path, cli: Path, n: int, conc: int, steps: LongSteps | None = None
                         ) -> dict[str, float]:
    state.mkdir()
    write_config(state, extra={"perRunConcurrency": conc, "maxConcurrentAgents": conc, "maxAgentsPerRun": n,
                               "engines": {"claude": {"bin": str(cli)}}}, caller={"runUsdMax": 100000},
                 key="sk-bench-key-000000")
    cfg = config.load(state / "config.json")
    lag: list[float] = []
    out: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        sup = services.supervisor
        await trio.sleep(1.0)                     # let start-up work (a spare runner, if any) settle
        gc.collect()
        rss0 = rss_kb()
        peak = [rss0]
        t = time.perf_counter()
        run = sup.start(cfg.caller("bench"), {"script": f"return (await parallel(Array.from({{length: {n}}}, "
                                                        f"() => () => agent('noop', {{maxUsd: 0.05}})))).length",
                                              "budgetUsd": n})
        live = sup.live[run.id]
        if steps is not None:
            trio.lowlevel.add_instrument(steps)
        async with trio.open_nursery() as probes:
            probes.start_soon(lag_probe, lag)

            async def watch_memory() -> None:
                while True:
                    await trio.sleep(0.05)
                    peak[0] = max(peak[0], rss_kb())
                    if run.agents_done >= n or live.finished.is_set():   # every agent finished
                        probes.cancel_scope.cancel()    # (the lag probe stops before this GC)
                        if steps is not None:
                            trio.lowlevel.remove_instrument(steps)
                        gc.collect()
                        out["live_rss_kb"] = rss_kb()
                        return
            probes.start_soon(watch_memory)
        await live.finished.wait()
        out["elapsed"] = time.perf_counter() - t
        assert run.status == "completed", run.error
        gc.collect()
        out["after_rss_kb"] = rss_kb()
        out["rss0_kb"], out["peak_kb"] = rss0, peak[0]
        out["spawned"] = sup.agents.spawned
        out["sandbox"] = cfg.sandbox_mode
        nursery.cancel_scope.cancel()
    out["lag_p50"], out["lag_p99"], out["lag_max"] = pct(lag, 0.5), pct(lag, 0.99), max(lag)
    return out


async def main(sizes: list[int], conc: int, show_steps: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-agents-"))
    (tmp / "bin").mkdir()
    cli = fake_claude.install(tmp / "bin")
    prompt = tmp / "prompt.txt"
    prompt.write_text("noop")
    boxed = sandboxed(cli, tmp)
    await plain([str(cli)], prompt, conc * 2, conc)                      # warm the page cache
    await plain(boxed, prompt, conc * 2, conc)
    per_agent: dict[int, float] = {}
    for n in sizes:
        base = await plain([str(cli)], prompt, n, conc)
        base_boxed = await plain(boxed, prompt, n, conc)
        steps = LongSteps() if show_steps else None
        d = await through_daemon(tmp / f"state-{n}", cli, n, conc, steps)
        per_agent[n] = (d["elapsed"] - base_boxed) / n * 1000
        print(f"{n} no-op agents, {conc} at a time (daemon sandbox: {d['sandbox']})")
        print(f"  plain Trio loop, bare CLI:      {base:.2f} s ({base / n * 1000:.1f} ms per process)")
        print(f"  plain Trio loop, CLI in bwrap:  {base_boxed:.2f} s ({base_boxed / n * 1000:.1f} ms per process)")
        print(f"  through daemon:                 {d['elapsed']:.2f} s ({d['spawned']} processes spawned)")
        print(f"  ratio vs the same processes (bwrap): {d['elapsed'] / base_boxed:.3f}× (target ≤ 1.05×); "
              f"vs the bare CLI: {d['elapsed'] / base:.3f}×")
        print(f"  per-agent overhead: {per_agent[n]:.2f} ms wall, {per_agent[n] * conc:.1f} ms per agent slot")
        print(f"  event-loop lag meanwhile: p50 {d['lag_p50']:.1f} ms, p99 {d['lag_p99']:.1f} ms, "
              f"max {d['lag_max']:.1f} ms (target p99 ≤ 20 ms)")
        live_kb = d.get("live_rss_kb", d["peak_kb"]) - d["rss0_kb"]
        print(f"  daemon RSS: +{(d['peak_kb'] - d['rss0_kb']) / 1024:.1f} MB at peak, "
              f"{live_kb / n:.1f} KB per finished agent with the run still live, "
              f"{(d['after_rss_kb'] - d['rss0_kb']) / n:.1f} KB per agent after it ended (target < 50 KB)")
        print(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        if steps is not None:
            print("  task steps of 2 ms and more, by where the task was:\n" + steps.report(), flush=True)
    if len(sizes) > 1:
        small, big = sizes[0], sizes[-1]
        print(f"per-agent overhead at {big} vs {small}: {per_agent[big]:.2f} vs {per_agent[small]:.2f} ms "
              f"({(per_agent[big] / per_agent[small] - 1) * 100:+.0f} %; target within 10 %)")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", default="200", help="comma-separated sizes, e.g. 200,2000")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--steps", action="store_true", help="list the task steps that held the loop longest")
    a = p.parse_args()
    trio.run(main, [int(x) for x in a.agents.split(",")], a.concurrency, a.steps)
