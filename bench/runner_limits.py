"""Script runner figures: peak RSS under the ArrayBuffer bomb, race cancel latency on the
bridge, and the cost of one bridge round trip (which now includes the memory check).

    python3 bench/runner_limits.py [--races 50] [--calls 1000]

Every figure runs the real Node runner through `run_script` with a Python host that
answers at once (no agents, no daemon). The bomb runs under RLIMIT_DATA = 512 MB (what
the daemon's launcher sets) and memoryLimitMb 512 (the default); peak RSS is the
runner's ru_maxrss, read in a fresh child process per variant. Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase.script.runner import RunnerLimits, run_script  # noqa: E402
from tests.script_host import Host, argv_with  # noqa: E402

BOMBS = {
    "32 MB touched per slice": "const keep = []; for (;;) { keep.push(new Uint8Array(32 * 2 ** 20).fill(1)); await agent('tick'); }",
    "64 MB untouched, one slice, caught": "const keep = []; try { for (;;) keep.push(new ArrayBuffer(64 * 2 ** 20)); } catch (e) {} return 1;",
    "heap arrays per slice": "const a = []; for (;;) { for (let i = 0; i < 40; i++) a.push(new Array(1e5).fill(1.5)); await agent('tick'); }",
}


def bomb_child(name: str) -> None:
    """Runs in a fresh interpreter so RUSAGE_CHILDREN holds only this runner."""
    async def main() -> dict[str, Any]:
        t = time.perf_counter()
        out = await run_script(BOMBS[name], None, Host(), RunnerLimits(), argv=argv_with(data_limit_mb=512))
        return {"error": out.error, "seconds": time.perf_counter() - t}
    result = trio.run(main)
    result["peakRssMb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(result))


class RaceHost(Host):
    """Times from handing the winner's answer back to the bridge until calls_cancelled."""

    def __init__(self) -> None:
        super().__init__({"slow": 60.0})
        self.won_at = 0.0
        self.latencies: list[float] = []

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        if prompt.startswith("fast"):
            self.won_at = time.perf_counter()
            return "won"
        return await super().agent(prompt, opts, ticket)

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        self.latencies.append(time.perf_counter() - self.won_at)


async def race_latency(races: int) -> list[float]:
    host = RaceHost()
    script = "for (let i = 0; i < args; i++) await race([() => agent('slow'), () => agent('fast' + i)]); return 1"
    await run_script(script, races, host, RunnerLimits())
    return host.latencies


async def round_trip(calls: int) -> float:
    script = "for (let i = 0; i < args; i++) await agent('t' + i); return 1"
    t = time.perf_counter()
    await run_script(script, calls, Host(), RunnerLimits())
    return (time.perf_counter() - t) / calls


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--bomb":
        bomb_child(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--races", type=int, default=50)
    ap.add_argument("--calls", type=int, default=1000)
    a = ap.parse_args()
    print("ArrayBuffer/heap bombs under RLIMIT_DATA 512 MB, memoryLimitMb 512:")
    for name in BOMBS:
        out = subprocess.run([sys.executable, __file__, "--bomb", name], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        print(f"  {name:38s} peak RSS {r['peakRssMb']:6.0f} MB  ended in {r['seconds']:.2f} s: {r['error']}")
    lat = trio.run(race_latency, a.races)
    print(f"race winner answered -> calls_cancelled on the host: median {statistics.median(lat) * 1e3:.2f} ms, "
          f"max {max(lat) * 1e3:.2f} ms ({len(lat)} races)")
    per = trio.run(round_trip, a.calls)
    print(f"agent() round trip through the bridge (host answers at once): {per * 1e6:.0f} µs per call ({a.calls} calls)")


if __name__ == "__main__":
    main()
