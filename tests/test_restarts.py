"""SIGTERM restarts of the real daemon process with an acknowledging host connected
(issue 25 #2, #10): every notice reaches the host exactly once across the restarts, even
the one whose answer is on the wire while the daemon drains; a `run` sent after SIGTERM
is refused, never accepted and then interrupted; an interrupted run's end record counts
only the agents that finished.

`sigterm_cycles` is also what bench/restarts.py runs ten times for the figure."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from swarmbase.client import HostClient, connect

from .clidaemon import CliDaemon, cli_daemon, fake_cli_config
from .conftest import write_config

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


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_sigterm_restarts_deliver_every_notice_once(tmp_path: Path) -> None:
    with trio.fail_after(220):
        cycles, host, state, barrier = await sigterm_cycles(tmp_path, 2)
    for c in cycles:
        assert host.pushes[f"{c.held}:end"] == 1, host.pushes        # answered during the drain: acked
        assert host.pushes[f"{c.interrupted}:end"] == 1, host.pushes  # pushed during the drain, not after
        assert c.late["isError"] and "shutting down and accepts no new runs" in c.late["content"][0]["text"]
        sealed = json.loads((run_dir(state, c.interrupted) / "run.json").read_text())
        assert sealed["status"] == "interrupted"
        assert (sealed["agentsDone"], sealed["agentsTotal"]) == (2, 4)     # issue 25 #10
        assert sealed["end"]["agentsDone"] == 2
    assert host.pushes[f"{barrier}:end"] == 1
    # Every run that ever existed got its one notice; nothing else was pushed, nothing is left.
    runs = {p.name.split("-", 1)[1] for p in (state / "runs").iterdir()}
    assert set(host.pushes) == {f"{r}:end" for r in runs} and set(host.pushes.values()) == {1}
    assert len(runs) == 2 * len(cycles) + 1                      # the late runs were never created
    print(f"\nnotices delivered per run over {len(cycles)} SIGTERM restarts: "
          f"{sorted(Counter(host.pushes.values()).items())} (count, runs)")


@pytest.mark.timeout(180)
async def test_a_torn_or_damaged_outbox_line_loses_no_notice_and_repeats_none(tmp_path: Path) -> None:
    # Issue 25 #3: the notices of two completed runs wait for an offline host; one's lines in
    # outbox.jsonl are damaged, the other's torn (the last line) and damaged. The next boot queues both again
    # from their run records, and an acknowledged run is not notified again.
    state = tmp_path / "state"
    path, tokens = write_config(state, callers=["alice"])
    host = AckingHost()
    with trio.fail_after(150):
        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
                await h.handshake()
                told = await run_id_of(h, "return 'told'")
                await h.wait_notice(f"{told}:end")
            async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
                await h.handshake(grant=False)              # offline for notices: they wait
                waiting = [await run_id_of(h, f"return 'waiting {i}'") for i in range(2)]
                for rid in waiting:
                    while status_of(state, rid) != "completed":
                        await trio.sleep(0.02)
        log_path = state / "outbox.jsonl"
        lines = log_path.read_bytes().split(b"\n")
        # An end notice has two add lines: as queued, then amended with the end-record hash
        # (the later one wins). Every line of the first notice is damaged; the second's
        # last line, the file's last, is torn and its earlier one damaged too, so that
        # nothing of either notice is left in the log.
        first = [i for i, ln in enumerate(lines) if waiting[0].encode() in ln]
        second = [i for i, ln in enumerate(lines) if waiting[1].encode() in ln]
        torn = second[-1]
        assert first and torn == len(lines) - 2              # the last line (then the final newline)
        for i in first + second[:-1]:
            lines[i] = b"\x00\xff not a line"
        log_path.write_bytes(b"\n".join(lines[:torn]) + b"\n" + lines[torn][:len(lines[torn]) // 2])
        async with cli_daemon(path) as d:
            assert "queued the end notice of 2 run(s) again" in d.stderr.decode()
            async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
                await h.handshake()
                for rid, i in zip(waiting, range(2)):
                    again = await h.wait_notice(f"{rid}:end")
                    assert "swarmbase:completed" in again["tags"]
                    assert f'\n```json\n"waiting {i}"\n```' in again["payload"]["content"][1]["text"]
                barrier = await run_id_of(h, "return 'barrier'")
                await h.wait_notice(f"{barrier}:end")
    assert host.pushes == Counter({f"{r}:end": 1 for r in [told, *waiting, barrier]})
