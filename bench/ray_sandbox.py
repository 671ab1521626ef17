"""What a node agent's sandbox costs at start: start to first line of an agent placed on
the tests' two-node Ray cluster with `sandbox: "bwrap"`, median of N after one warm-up
(the first start of a Ray worker is not the sandbox's).

    python3 bench/ray_sandbox.py [--agents 10]

The agent is a stand-in CLI (this Python, printing one final line) launched by the real
RayLauncher with a caller (`owner`) and an egress list, as a claude agent is: on this
version the node drops to the caller's uid, loads the seccomp filter and makes the
network namespace and its door (issue 31 #5), and, where the tree has it, runs the
agent's key door (issue 31 #3: the CLI gets its bearer and URL). Run the same file from an export of an
older tree (`git archive main | tar -x -C /tmp/old`, then copy this file and
bench/ray_placement.py into /tmp/old/bench/) to measure before. Prints figures; asserts nothing. Needs root (network namespace, uids).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLI = ("import json, os; print(json.dumps({'final': True, 'uid': os.getuid(), "
       "'keyDoor': os.environ.get('ANTHROPIC_BASE_URL', '').startswith('http')}), flush=True)")


def outside(args: argparse.Namespace) -> None:
    from tests.raycluster import RayCluster
    root = Path(tempfile.mkdtemp(prefix="sb-raybox-"))
    cluster = RayCluster(root=root).start()
    try:
        out = subprocess.run(cluster.ns.argv([sys.executable, __file__, "--inside", cluster.address,
                                              str(cluster.token_file), str(root), "--agents", str(args.agents)]),
                             env=cluster.env({"SWARMBASE_NODE_DIR": str(cluster.node_dir)}),
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            sys.exit(f"the measuring half failed:\n{out.stderr[-4000:]}")
        got = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        cluster.close()
    starts = got["starts_ms"]
    print(f"swarmbase at {ROOT}: node agent start→first line, sandbox bwrap, median of {len(starts)}: "
          f"{statistics.median(starts):.0f} ms (min {min(starts):.0f}, max {max(starts):.0f}; "
          f"warm-up {got['warmup_ms']:.0f} ms); sandbox {got['sandbox']}, the agent ran as uid {got['uid']}, "
          f"{'with' if got['keyDoor'] else 'without'} a key door on its node")


def inside(args: argparse.Namespace) -> None:
    import trio

    from bench.ray_placement import bench_config
    from swarmbase import identity
    from swarmbase.launch.egress import Endpoint
    from swarmbase.launch.ray import RayLauncher
    from swarmbase.launch.sandbox import interpreter_paths
    from swarmbase.launch.spec import LaunchSpec

    cfg, shared, state = bench_config(*args.inside, sandbox="bwrap")
    users = identity.Identities(state / identity.ALLOCATIONS, identity.UidRange.parse(identity.DEFAULT_UIDS))
    alice = users.user_for("alice")
    os.chown(shared, alice.uid, alice.gid)
    takes_users = len(inspect.signature(RayLauncher.__init__).parameters) > 2
    launcher = RayLauncher(cfg, users.user_for) if takes_users else RayLauncher(cfg)   # older: no uid to send
    search = os.environ["PATH"]
    spec_args: dict[str, Any] = {"owner": "alice", "egress": (Endpoint("127.0.0.1", 18080),)}
    env = {"PATH": search}
    try:           # a claude agent's key door on its node (issue 31 #3), where this tree has one
        from swarmbase.launch.spec import KEY_DOOR_BEARER, KEY_DOOR_URL, ModelKey
        given = {"bearer": "bench-bearer-0123456789"} if "bearer" in attrs.fields_dict(ModelKey) else {}  # v4
        spec_args.update(egress=(), model_key=ModelKey(key="sk-bench", upstream="http://127.0.0.1:18080", **given))
        env.update(ANTHROPIC_API_KEY=KEY_DOOR_BEARER, ANTHROPIC_BASE_URL=KEY_DOOR_URL)
    except ImportError:
        pass

    def spec(key: str) -> LaunchSpec:
        return LaunchSpec(argv=(sys.executable, "-c", CLI), env=env, cwd=str(shared), key=key,
                          dirs=("home", "tmp"), read=(str(shared), *interpreter_paths(sys.executable, search)),
                          idle_timeout=120, **spec_args)

    async def one(key: str) -> tuple[float, int]:
        first: list[tuple[float, int]] = []
        t0 = time.perf_counter()

        def on_line(line: bytes) -> bool:
            said = json.loads(line)
            first.append((time.perf_counter() - t0, said["uid"], said["keyDoor"]))
            return True

        res = await launcher.run(spec(key), on_line)
        assert res.final_seen, res
        return first[0][0] * 1000, first[0][1], first[0][2]

    async def main() -> dict[str, Any]:
        await launcher.connect()
        warm, uid, keyed = await one("bench-warm")
        starts = []
        for i in range(args.agents):
            ms, uid, keyed = await one(f"bench-{i}")
            starts.append(ms)
        return {"warmup_ms": warm, "starts_ms": starts, "uid": uid, "sandbox": cfg.sandbox_mode, "keyDoor": keyed}

    print(json.dumps(trio.run(main)))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--inside", nargs=3, metavar=("ADDRESS", "TOKEN_FILE", "ROOT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    inside(a) if a.inside else outside(a)
