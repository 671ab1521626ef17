"""SIGTERM restart cycles of the real daemon process with an acknowledging host connected
(issue 25 #2, #10), shared by tests/test_restarts.py and bench/restarts.py (which runs
`sigterm_cycles` ten times for the figure)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import trio

from swarmbase.client import HostClient, connect

from .clidaemon import CliDaemon, cli_daemon, fake_cli_config

# maxUsd: each agent's default cap is budget / perRunConcurrency, so four at once would
# reserve the whole budget and send a budget-warning notice besides the end notices counted.
LONG_RUN = ("const o = {maxUsd: 0.5};\n"
            "return await parallel([() => agent('noop', o), () => agent('noop', o), "
            "() => agent('sleep:120', o), () => agent('sleep:120', o)])")


class AckingHost:
    """Answers every push (accepted; a repeated eventId: duplicate, as hosts dedupe) and
    counts each push it is sent. When armed, it holds its answer to the next run-end
    notice of a completed run until released: that push is then in flight while the
    daemon drains."""

    def __init__(self) -> None:
        self.pushes: Counter[str] = Counter()
        self.accepted: set[str] = set()
        self.armed: trio.Event | None = None     # the release of the next held answer
        self.holding = trio.Event()

    async def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        eid = params["eventId"]
        self.pushes[eid] += 1
        if self.armed is not None and "swarmbase:completed" in params.get("tags", []):
            release, self.armed = self.armed, None
            self.holding.set()
            await release.wait()
        if eid in self.accepted:
            return {"result": {"accepted": False, "reason": "duplicate"}}
        self.accepted.add(eid)
        return {"result": {"accepted": True, "inferenceId": f"inf-{len(self.accepted)}"}}


@attrs.define
class Cycle:
    held: str               # the completed run whose push was in flight at SIGTERM
    interrupted: str        # the run SIGTERM stopped (2 of its 4 agents had finished)
    late: dict[str, Any]    # what `run` answered after SIGTERM


def run_dir(state: Path, run_id: str) -> Path:
    return next((state / "runs").glob(f"*-{run_id}"))


def status_of(state: Path, run_id: str) -> str | None:
    try:
        return json.loads((run_dir(state, run_id) / "run.json").read_text())["status"]
    except (StopIteration, OSError, ValueError):
        return None


async def run_id_of(h: HostClient, script: str) -> str:
    return (await h.tool("run", {"script": script}))["structuredContent"]["runId"]


async def one_cycle(d: CliDaemon, token: str, host: AckingHost, state: Path) -> Cycle:
    late: dict[str, Any] = {}
    async with connect(d.ws, token, push_answer=host.answer) as h:
        await h.handshake()
        interrupted = await run_id_of(h, LONG_RUN)
        while (await h.tool("status", {"runId": interrupted, "logLines": 0}))["structuredContent"][
                "agents"]["done"] < 2:
            await trio.sleep(0.05)
        release = trio.Event()
        host.armed, host.holding = release, trio.Event()
        held = await run_id_of(h, "return 'held'")
        await host.holding.wait()           # its push is on the wire, unanswered

        async def late_run() -> None:
            try:
                late.update(await h.tool("run", {"script": "return 'late'"}))
            except ConnectionError as e:       # the daemon closed before it answered
                late.update({"isError": True, "content": [{"text": f"no answer: {e}"}]})
        d.proc.send_signal(signal.SIGTERM)
        async with trio.open_nursery() as n:
            n.start_soon(late_run)           # sent after the signal: must be refused
            # Answer only once the daemon has stopped its runs: the answer then arrives
            # while it drains (the old daemon had closed the outbox and its sessions here).
            while status_of(state, interrupted) != "interrupted":
                await trio.sleep(0.02)
            release.set()
        await h.closed_event.wait()
    assert await d.proc.wait() == 0
    return Cycle(held=held, interrupted=interrupted, late=late)


async def sigterm_cycles(tmp_path: Path, cycles: int) -> tuple[list[Cycle], AckingHost, Path, str]:
    """`cycles` SIGTERM restarts, then a last start whose run is a barrier: a caller's
    notices go out in order, so once its notice arrived nothing older is pending."""
    path, tokens = fake_cli_config(tmp_path, perRunConcurrency=4)
    state = path.parent
    host = AckingHost()
    done: list[Cycle] = []
    for _ in range(cycles):
        async with cli_daemon(path) as d:
            done.append(await one_cycle(d, tokens["alice"], host, state))
    async with cli_daemon(path) as d:
        async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
            await h.handshake()
            barrier = await run_id_of(h, "return 'barrier'")
            await h.wait_notice(f"{barrier}:end")
    return done, host, state, barrier
