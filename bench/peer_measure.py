"""One run of the peer bench, measured: wall, the CPU of its side's whole process tree
(the side's cgroup), peak PSS over that tree (sampled), the requests the fake model got,
the daemon process's own CPU, and what the rest of the machine used meanwhile.

The others' load is all CPUs' busy time (/proc/stat) less both sides' trees and the
bench process (the fake model, the sampler, the client) over the run's wall time: how many
cores other people's work took while this run was measured.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from bench.peer_fsyncs import counting
from bench.tree_cgroup import TreeCgroup, TreeSampler, machine_busy_s, proc_cpu
from tests.peer.counted_model import CountedModel


@attrs.frozen
class Figures:
    wall_s: float
    cpu_s: float
    pss_mb: float
    requests: dict[str, int]        # CountedModel.kinds() during the run
    by_name: dict[str, float]       # sampled CPU-s by process name (lower bounds)
    own_s: float | None             # the daemon process alone (SwarmBase)
    others_cores: float
    load1: float
    bench_s: float                  # the bench process meanwhile
    problem: str | None = None      # the run did not end as the case expects
    agent_life_s: float | None = None   # SwarmBase: median agent record duration (start → end)
    replayed: int | None = None     # SwarmBase: agents replayed from the journal
    fsyncs: int | None = None       # fsync + fdatasync calls in the side's cgroup (None: perf unavailable)

    @property
    def runner_s(self) -> float:
        """The script runners' CPU (Node: the only node processes in SwarmBase's tree)."""
        return self.by_name.get("node", 0.0)


def process_cpu_s(pid: int | None) -> float | None:
    """utime+stime of one process (all its threads, none of its children)."""
    if not pid:
        return None
    with open(f"/proc/{pid}/stat") as f:
        return proc_cpu(f.read())[2]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def _machine() -> tuple[float, float]:
    with open("/proc/stat") as f:
        busy = machine_busy_s(f.read())
    return busy, float(loadavg().split()[0])


async def measure(trees: tuple[TreeCgroup, ...], tree: TreeCgroup, model: CountedModel,
                  work: Callable[[], Awaitable[Any]], *, sample_s: float,
                  daemon_pid: int | None = None) -> tuple[Any, Figures]:
    """Runs `work` and measures `tree` (one of `trees`, every side's) meanwhile."""
    sampler = TreeSampler(tree, interval=sample_s)
    async with counting(tree.path) as fsyncs:
        req0, own0 = model.kinds(), process_cpu_s(daemon_pid)
        cpu0 = [t.cpu_s() for t in trees]
        busy0, load0 = _machine()
        bench0, t0 = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as n:
            await n.start(sampler.run)
            result = await work()
            n.cancel_scope.cancel()
        await sampler.sample_now()
        # Read before perf is stopped: its exit is not the run's.
        wall = time.perf_counter() - t0
        bench = time.process_time() - bench0
        busy1, load1 = _machine()
        cpu = [t.cpu_s() - c for t, c in zip(trees, cpu0, strict=True)]
        own1 = process_cpu_s(daemon_pid)
        req = {k: v - req0[k] for k, v in model.kinds().items()}
    others = max(0.0, busy1 - busy0 - sum(cpu) - bench)
    return result, Figures(
        wall_s=wall, cpu_s=cpu[trees.index(tree)], pss_mb=sampler.peak_kb / 1024, requests=req,
        by_name=dict(sampler.cpu_by_name()), own_s=None if own0 is None or own1 is None else own1 - own0,
        others_cores=others / wall, load1=max(load0, load1), bench_s=bench, fsyncs=fsyncs())
