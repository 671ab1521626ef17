"""SIGTERM restarts of the real daemon process with an acknowledging host connected
(issue 25 #2, #10): every notice reaches the host exactly once across the restarts, even
the one whose answer is on the wire while the daemon drains; a `run` sent after SIGTERM
is refused, never accepted and then interrupted; an interrupted run's end record counts
only the agents that finished.

The restart cycle itself is tests/restarts.py (bench/restarts.py runs it ten times)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import trio

from swarmbase.client import connect

from .clidaemon import cli_daemon
from .conftest import write_config
from .restarts import AckingHost, run_dir, run_id_of, sigterm_cycles, status_of


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
                # One after the other, each until both its lines are in the log: the second
                # run's lines must be the file's last (run at once, the first run's amended
                # line was once written after the second's).
                waiting = []
                for i in range(2):
                    rid = await run_id_of(h, f"return 'waiting {i}'")
                    waiting.append(rid)
                    while status_of(state, rid) != "completed" or \
                            sum(rid.encode() in ln for ln in (state / "outbox.jsonl").read_bytes().split(b"\n")) < 2:
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
