"""Trace export overhead: observer calls for 200 agents, and the 200-agent bench with the
trace observer on vs off.

    python3 bench/trace_overhead.py [--agents 200] [--concurrency 8] [--rounds 3]

1. Micro: the observer calls a 200-agent run makes (run_started, agent_started/agent_ended
   ×200, run_ended), timed on the calling thread, with no observer, with the trace
   observer posting to a local OTLP receiver, and with one pointed at a dead port; plus
   the process CPU time (the export thread included) until the spans are flushed.
2. The 200-agent bench (bench/agents_overhead.py's daemon side: the real runner, the fake
   claude CLI, 8 at a time) with the observer calls shimmed in where the supervisor will
   make them (contracts.md), alternating off / on for --rounds rounds.

The receiver is a separate process (a stdlib HTTP server answering 200), like a local
collector. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from swarmbase import config, daemon, telemetry  # noqa: E402
from swarmbase.prices import Tokens  # noqa: E402
from swarmbase.runs import records  # noqa: E402
from swarmbase.runs.model import Run  # noqa: E402
from swarmbase.runs.records import AgentRecord  # noqa: E402
from bench.common import write_config  # noqa: E402
from tests.fakes import fake_claude  # noqa: E402

RECEIVER = r"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def start_receiver() -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    port = int(p.stdout.readline())
    return p, f"http://127.0.0.1:{port}/v1/traces"


def dead_endpoint() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1/traces"


def agents_for(tmp: Path, n: int) -> list[AgentRecord]:
    out = []
    for i in range(1, n + 1):
        rec = AgentRecord(n=i, dir=tmp / "agents" / str(i), label=f"agent {i}", engine="claude",
                          model="claude-sonnet-5-5", profile="read")
        rec.set_state("queued")
        rec.set_state("running")
        rec.cost_usd, rec.tokens = 0.01, Tokens(input=12000, output=800, cache_read=4000)
        rec.set_state("done")
        out.append(rec)
    return out


def micro(n: int, endpoint: str | None) -> tuple[float, float]:
    """(seconds on the calling thread, process CPU seconds until flushed) for one run's calls."""
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-trace-"))
    recs = agents_for(tmp, n)
    obs = telemetry.TraceObserver(endpoint=endpoint, schedule_delay_ms=200) if endpoint else None
    run = Run(id="run_0123456789ab", caller="bench", dir_name="d", created_at=time.time(), label="bench")
    run.set_status("running", time.time())
    cpu0, t0 = time.process_time(), time.perf_counter()
    if obs:
        obs.run_started(run)
    for rec in recs:
        if obs:
            obs.agent_started(run, rec)
            obs.agent_ended(run, rec)
    run.set_status("completed", time.time())
    if obs:
        obs.run_ended(run)
    calls = time.perf_counter() - t0
    if obs:
        obs.force_flush(10_000)
    cpu = time.process_time() - cpu0
    if obs:
        obs.shutdown()
    return calls, cpu


def shim(sup: Any, obs: Any) -> None:
    """Call the observer where the supervisor will (contracts.md's observer seam)."""
    changed = sup.agent_changed

    def agent_changed(live: Any, rec: Any) -> None:
        changed(live, rec)
        if rec.state == "running":
            obs.agent_started(live.run, rec)
        elif rec.state in records.ENDED:
            obs.agent_ended(live.run, rec)

    sup.agent_changed = agent_changed


async def through_daemon(state: Path, cli: Path, n: int, conc: int, endpoint: str | None) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds: the daemon's side, export thread included)."""
    write_config(state, extra={"perRunConcurrency": conc, "maxConcurrentAgents": conc, "maxAgentsPerRun": n,
                               "engines": {"claude": {"bin": str(cli)}}}, caller={"runUsdMax": 1000},
                 key="sk-bench-key-000000")
    cfg = config.load(state / "config.json")
    obs = telemetry.TraceObserver(endpoint=endpoint) if endpoint else None
    async with trio.open_nursery() as nursery:
        _, services = await nursery.start(lambda task_status: daemon.serve(cfg, task_status=task_status))
        sup = services.supervisor
        if obs:
            shim(sup, obs)
        t, cpu = time.perf_counter(), time.process_time()
        run = sup.start(cfg.caller("bench"), {"script": f"return (await parallel(Array.from({{length: {n}}}, "
                                                        f"() => () => agent('noop', {{maxUsd: 0.05}})))).length",
                                              "budgetUsd": 1000})
        if obs:
            obs.run_started(run)
        await sup.live[run.id].finished.wait()
        if obs:
            obs.run_ended(run)
        assert run.status == "completed", run.error
        nursery.cancel_scope.cancel()
    if obs:
        await obs.aclose(10)         # the spans' export is part of the cost
    return time.perf_counter() - t, time.process_time() - cpu


async def main(n: int, conc: int, rounds: int) -> None:
    proc, endpoint = start_receiver()
    try:
        print(f"1. observer calls for one run of {n} agents (calling thread / process CPU until flushed)")
        for name, ep in (("no observer", None), ("local receiver", endpoint), ("dead endpoint", dead_endpoint())):
            calls, cpu = micro(n, ep)
            print(f"   {name:<15} {calls * 1000:7.1f} ms on the loop ({calls / n * 1e6:6.1f} µs per agent), "
                  f"{cpu * 1000:7.1f} ms CPU")
        tmp = Path(tempfile.mkdtemp(prefix="sb-bench-trace-"))
        (tmp / "bin").mkdir()
        cli = fake_claude.install(tmp / "bin")
        off, on = [], []
        for r in range(rounds):
            for label, ep, bucket in (("off", None, off), ("on", endpoint, on)):
                state = tmp / f"state-{label}-{r}"
                state.mkdir()
                bucket.append(await through_daemon(state, cli, n, conc, ep))
        print(f"2. {n}-agent bench, {conc} at a time, {rounds} rounds alternating "
              f"(wall s / daemon-process CPU s)")
        for label, xs in (("tracing off", off), ("tracing on", on)):
            print(f"   {label}: " + "  ".join(f"{w:.2f}/{c:.2f}" for w, c in xs))
        for what, i in (("wall", 0), ("CPU", 1)):
            a, b = statistics.median(x[i] for x in off), statistics.median(x[i] for x in on)
            lo_a, lo_b = min(x[i] for x in off), min(x[i] for x in on)
            print(f"   {what}: median {a:.2f} → {b:.2f} s ({(b - a) / a * 100:+.1f} %), "
                  f"best {lo_a:.2f} → {lo_b:.2f} s ({(lo_b - lo_a) / lo_a * 100:+.1f} %)  (target < 3 %)")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    trio.run(main, a.agents, a.concurrency, a.rounds)
