"""kill -9 of the real daemon process in the middle of a burst of notices: after a restart
no notice the daemon had acknowledged is pushed again, and none is lost."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import connect
from swarmbase.notify.outbox import Outbox

from .clidaemon import cli_daemon
from .conftest import notice, write_config

BURST = 400
KILL_AT = 150


def acked_on_disk(path: Path, everything: set[str]) -> set[str]:
    """Notices the log no longer holds: an ack line, or compacted away after one."""
    adds, acks = set(), set()
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        if rec["op"] == "base":
            continue
        (adds if rec["op"] == "add" else acks).add(rec["notice"]["eventId"] if rec["op"] == "add" else rec["eventId"])
    return everything - (adds - acks)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_kill_9_mid_burst_resends_no_acknowledged_notice(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg_path, tokens = write_config(state, callers=["alice"])
    ob = Outbox(state / "outbox.jsonl")
    for i in range(BURST):
        ob.add("alice", notice(i))
    ob.close()
    everything = {notice(i)["eventId"] for i in range(BURST)}

    first: Counter[str] = Counter()
    async with cli_daemon(cfg_path) as d:
        def answer_then_die(params: dict[str, Any]) -> dict[str, Any]:
            first[params["eventId"]] += 1
            if len(first) == KILL_AT:
                d.proc.send_signal(signal.SIGKILL)        # mid-burst, with this answer not yet sent
            return {"result": {"accepted": True}}
        with trio.fail_after(60):
            async with connect(d.ws, tokens["alice"], push_answer=answer_then_die) as h:
                await h.handshake()
                await h.closed_event.wait()
            assert await d.proc.wait() == -signal.SIGKILL
    acked = acked_on_disk(state / "outbox.jsonl", everything)
    assert KILL_AT - 1 <= len(acked) <= KILL_AT         # every answer the daemon read is on disk
    assert acked <= set(first)

    second: Counter[str] = Counter()

    def accept(params: dict[str, Any]) -> dict[str, Any]:
        second[params["eventId"]] += 1
        return {"result": {"accepted": True}}
    async with cli_daemon(cfg_path) as d:
        with trio.fail_after(60):
            async with connect(d.ws, tokens["alice"], push_answer=accept) as h:
                await h.handshake()
                while len(second) < BURST - len(acked):
                    await trio.sleep(0.05)
                await trio.sleep(1.0)          # room for any stray resend to show up
    resent_acked = set(second) & acked
    resent_answered = set(second) & set(first)
    print(f"\nburst {BURST}, killed after {len(first)} pushes: {len(acked)} acknowledged on disk, "
          f"{len(resent_acked)} of them re-sent; {len(resent_answered)} host-answered notice(s) re-sent")
    assert resent_acked == set()
    assert len(resent_answered) <= 1          # only the one whose answer the kill cut off
    assert max(second.values()) == 1
    assert set(second) | acked == everything  # nothing lost
    assert Outbox(state / "outbox.jsonl").pending("alice") == []
