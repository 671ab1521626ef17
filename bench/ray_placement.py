"""Agents on a Ray cluster vs on this machine: start to first line (cold and warm Ray
workers), per-line latency, the daemon's CPU per streamed line, and the memory of an idle
head + worker node.

    python3 bench/ray_placement.py [--agents 5] [--lines 400]

Starts the tests' two-node cluster (tests/raycluster.py: token auth, a network namespace
holding only `lo`), then runs the measuring half of this script inside the namespace: the
real LocalLauncher and RayLauncher (sandbox "none" on both, so the figures are the
transport's), each running a stand-in CLI that prints JSON lines stamped with their send
time. Prints a table; asserts nothing. Needs root (network namespace).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The stand-in CLI: N lines, one every INTERVAL s, each stamped; the last one is final.
CLI = r"""
import json, sys, time
n, interval = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    print(json.dumps({"t": time.time(), "i": i, "final": i == n - 1, "pad": "x" * 200}), flush=True)
    if interval:
        time.sleep(interval)
"""


def memory(pids: list[int]) -> tuple[float, float]:
    """(RSS, PSS) in MiB over the pids."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss / 1024, pss / 1024


def outside(args: argparse.Namespace) -> None:
    from tests.raycluster import RayCluster, tree
    root = Path(tempfile.mkdtemp(prefix="sb-raybench-"))
    t0 = time.perf_counter()
    cluster = RayCluster(root=root).start()
    up = time.perf_counter() - t0
    try:
        time.sleep(3)                              # let both nodes settle before measuring idle memory
        head, worker = tree(cluster.head.pid), tree(cluster.worker.pid)
        mem_head, mem_worker = memory(head), memory(worker)
        runs = []
        for extra in ([], ["--check-first"]):     # each a new Ray job: no worker of the first is reused
            out = subprocess.run(cluster.ns.argv([sys.executable, __file__, "--inside", cluster.address,
                                                  str(cluster.token_file), str(root), "--agents", str(args.agents),
                                                  "--lines", str(args.lines), *extra]),
                                 env=cluster.env({"SWARMBASE_NODE_DIR": str(cluster.node_dir)}),
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                sys.exit(f"the measuring half failed:\n{out.stderr[-4000:]}")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        figures, checked = runs
    finally:
        t1 = time.perf_counter()
        cluster.close()
        down = time.perf_counter() - t1
    print(f"cluster up {up:.1f} s (head + worker, ray start --block), down by pid {down:.1f} s")
    print(f"idle head:   {len(head)} processes, RSS {mem_head[0]:.0f} MiB, PSS {mem_head[1]:.0f} MiB")
    print(f"idle worker: {len(worker)} processes, RSS {mem_worker[0]:.0f} MiB, PSS {mem_worker[1]:.0f} MiB")
    print(f"idle total:  RSS {mem_head[0] + mem_worker[0]:.0f} MiB, PSS {mem_head[1] + mem_worker[1]:.0f} MiB")
    print(f"ray.init from a thread (daemon side): {figures['connect_s'] * 1000:.0f} ms")
    for name in ("local", "ray"):
        f = figures[name]
        print(f"{name:5} start→first line: first {f['first'][0] * 1000:.0f} ms, then "
              f"{', '.join(f'{x * 1000:.0f}' for x in f['first'][1:])} ms")
        lat = f["latency_ms"]
        print(f"{name:5} per-line latency ms: p50 {lat['p50']:.2f} p90 {lat['p90']:.2f} p99 {lat['p99']:.2f} "
              f"max {lat['max']:.2f} ({lat['n']} lines)")
        print(f"{name:5} daemon CPU per streamed line: {f['cpu_per_line_ms']:.3f} ms "
              f"({f['burst_lines']} lines from {args.agents} agents at once)")
    print(f"ray   first agent after the daemon's boot check ran on the node (as the daemon does): "
          f"{checked['ray']['first'][0] * 1000:.0f} ms (check took {checked['check_s'] * 1000:.0f} ms)")
    print(f"ray worker memory while agents run: {figures['ray']['worker_rss_mib']:.0f} MiB RSS per agent")


def bench_config(address: str, token: str, root: str, sandbox: str) -> tuple[Any, Path, Path]:
    """(the daemon's Config for the cluster, its shared root, its state dir) under root."""
    from swarmbase import config
    shared = Path(root) / "bench-shared"
    shared.mkdir(exist_ok=True)
    state = Path(root) / "bench-state"
    state.mkdir(exist_ok=True)
    raw = {"sandbox": sandbox, "engines": {"claude": {"bin": sys.executable}},
           "placement": {"ray": {"address": address, "tokenFile": token, "labels": {"swarmbase/cli": "claude"},
                                 "sharedRoots": [str(shared)]}}}
    return config.parse(json.dumps(raw), state / "config.json"), shared, state


def inside(args: argparse.Namespace) -> None:
    import trio

    from swarmbase.launch.local import LocalLauncher
    from swarmbase.launch.ray import RayLauncher
    from swarmbase.launch.spec import LaunchSpec

    cfg, shared, state = bench_config(*args.inside, sandbox="none")
    local = LocalLauncher(mode="none", homes=state / "homes", procs=state / "procs")
    (state / "procs").mkdir(exist_ok=True)
    ray_l = RayLauncher(cfg)

    def spec(key: str, n: int, interval: float) -> LaunchSpec:
        return LaunchSpec(argv=(sys.executable, "-c", CLI, str(n), str(interval)), env={"PATH": os.environ["PATH"]},
                          cwd=str(shared), key=key, dirs=("home", "tmp"), idle_timeout=120)

    async def one(launcher: Any, key: str, n: int, interval: float) -> tuple[float, list[float]]:
        lat: list[float] = []
        first: list[float] = []
        t0 = time.time()

        def on_line(line: bytes) -> bool:
            now = time.time()
            ev = json.loads(line)
            if not first:
                first.append(now - t0)
            lat.append((now - ev["t"]) * 1000)
            return bool(ev["final"])

        res = await launcher.run(spec(key, n, interval), on_line)
        assert res.final_seen, res
        return first[0], lat

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    async def main() -> dict[str, Any]:
        t = time.perf_counter()
        await ray_l.connect()
        out: dict[str, Any] = {"connect_s": time.perf_counter() - t}
        if args.check_first:                          # what the daemon's watcher does at boot
            t = time.perf_counter()
            for node in await ray_l.refresh_nodes():
                if node.get("Alive") and ray_l._eligible(node):
                    await ray_l._check(node, [])
            out["check_s"] = time.perf_counter() - t
        for name, launcher in (("local", local), ("ray", ray_l)):
            firsts, lats = [], []
            for i in range(args.agents):              # one after another: the first Ray one is cold
                f, lat = await one(launcher, f"{name}-seq-{i}", 20, 0.02)
                firsts.append(f)
                lats += lat
            # A burst: all agents at once, lines as fast as they come; CPU of this process
            # (the daemon side: Trio, Ray's driver threads) minus its idle rate.
            idle0, t_idle = cpu(), time.perf_counter()
            await trio.sleep(2)
            idle_rate = (cpu() - idle0) / (time.perf_counter() - t_idle)
            c0, w0 = cpu(), time.perf_counter()
            worker_rss: list[float] = []
            async with trio.open_nursery() as n:
                for i in range(args.agents):
                    n.start_soon(one, launcher, f"{name}-burst-{i}", args.lines, 0.002)
                if name == "ray":
                    await trio.sleep(0.5)
                    workers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                               and _cmd(int(p.name)).startswith(b"ray::swarmbase-agent")]
                    worker_rss = [memory([w])[0] for w in workers]
            used = cpu() - c0 - idle_rate * (time.perf_counter() - w0)
            lats.sort()
            out[name] = {"first": firsts, "cpu_per_line_ms": used * 1000 / (args.agents * args.lines),
                         "burst_lines": args.agents * args.lines,
                         "worker_rss_mib": statistics.mean(worker_rss) if worker_rss else 0.0,
                         "latency_ms": {"p50": lats[len(lats) // 2], "p90": lats[int(len(lats) * .9)],
                                        "p99": lats[int(len(lats) * .99)], "max": lats[-1], "n": len(lats)}}
        return out

    print(json.dumps(trio.run(main)))


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=5)
    p.add_argument("--lines", type=int, default=400)
    p.add_argument("--check-first", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--inside", nargs=3, metavar=("ADDRESS", "TOKEN_FILE", "ROOT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    inside(a) if a.inside else outside(a)
