"""The outbox: answer classification, backoff, torn-file salvage, and push retries under MockClock."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from swarmbase import config
from swarmbase.mcpl.session import Hub, Session
from swarmbase.outbox import Outbox, backoff_delay, classify_answer


def notice(i: int) -> dict[str, Any]:
    return {"featureSet": "swarmbase.notify", "eventId": f"run_{i:012x}:end", "timestamp": "t",
            "origin": {"source": "swarmbase", "kind": "run-end", "runId": f"run_{i:012x}"},
            "tags": ["surface:done"], "payload": {"content": [{"type": "text", "text": f"n{i}"}]}}


def test_classify_answers() -> None:
    assert classify_answer({"accepted": True, "inferenceId": "x"}) == "done"
    assert classify_answer({"accepted": False, "reason": "duplicate"}) == "done"
    assert classify_answer({"accepted": False, "reason": "rate limited"}) == "retry"
    assert classify_answer({"accepted": True}) == "done"      # mcpl-harness answers bare
    assert classify_answer(None, {"code": -32002, "message": "no grant"}) == "wait-grant"
    assert classify_answer(None, {"code": -32001, "message": "disabled"}) == "hold"
    assert classify_answer(None, {"code": -32003, "message": "unknown set"}) == "hold"
    assert classify_answer(None, {"code": -32603, "message": "boom"}) == "retry"


def test_backoff_grows_with_jitter_and_caps() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(i, rng) for i in range(12)]
    for i, d in enumerate(delays):
        base = min(300.0, 2.0 ** i)
        assert 0.75 * base <= d <= 1.25 * base
    assert delays[-1] <= 375


def test_outbox_persists_in_order_and_dedups(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox.json")
    for i in range(3):
        ob.add("a", notice(i))
    ob.add("a", notice(1))           # same eventId: not twice
    ob.add("b", notice(9))
    again = Outbox(tmp_path / "outbox.json")
    assert [n["eventId"] for n in again.pending("a")] == [notice(i)["eventId"] for i in range(3)]
    again.remove(notice(0)["eventId"])
    assert [n["eventId"] for n in Outbox(tmp_path / "outbox.json").pending("a")] == [notice(1)["eventId"], notice(2)["eventId"]]


def test_torn_outbox_keeps_intact_entries(tmp_path: Path) -> None:
    p = tmp_path / "outbox.json"
    ob = Outbox(p)
    for i in range(4):
        ob.add("a", notice(i))
    raw = p.read_bytes()
    cut = raw.rfind(b'"eventId"')          # tear inside the last entry
    p.write_bytes(raw[:cut])
    recovered = Outbox(p)
    assert recovered.recovered_from_damage
    assert [n["eventId"] for n in recovered.pending("a")] == [notice(i)["eventId"] for i in range(3)]
    assert list(tmp_path.glob("outbox.json.damaged-*"))
    assert json.loads(p.read_text())["entries"][0]["notice"]["eventId"] == notice(0)["eventId"]


class MemTransport:
    """The server side of a fake WebSocket: frames travel over memory channels."""

    def __init__(self) -> None:
        self.to_host_send, self.to_host = trio.open_memory_channel[str](100)
        self.to_server, self.to_server_recv = trio.open_memory_channel[str](100)

    async def send(self, text: str) -> None:
        await self.to_host_send.send(text)

    async def receive(self) -> str:
        return await self.to_server_recv.receive()

    async def close(self, code: int, reason: str) -> None:
        await self.to_host_send.aclose()


async def host_pushes(tmp_path: Path, nursery: trio.Nursery, event: dict[str, Any], seed: int):
    """A Session over memory channels, past initialize and a pushEvents grant, with one
    notice in its outbox. Yields (push/event requests as they arrive, answer fn, outbox)."""
    cfg = config.parse(json.dumps({"callers": [{"name": "a", "tokenSha256": "c" * 64}]}), tmp_path / "config.json")
    ob = Outbox(tmp_path / "outbox.json")
    ob.add("a", event)
    t = MemTransport()
    session = Session(t, cfg.callers[0], sup=None, outbox=ob, hub=Hub(), rng=random.Random(seed))  # type: ignore[arg-type]
    nursery.start_soon(session.serve)
    await t.to_server.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "capabilities": {"experimental": {"mcpl": {"version": "0.5", "pushEvents": True}}}}}))
    await t.to_server.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "featureSets/update",
                                       "params": {"effectiveCapabilities": ["pushEvents", "tools"]}}))

    async def pushes():
        async for frame in t.to_host:
            msg = json.loads(frame)
            if msg.get("method") == "push/event":
                yield msg

    async def answer(msg: dict[str, Any], body: dict[str, Any]) -> None:
        await t.to_server.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], **body}))

    return pushes(), answer, ob


@pytest.mark.timeout(30)
async def test_push_errors_retry_with_growing_delays(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    attempts: list[float] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            pushes, answer, ob = await host_pushes(tmp_path, n, notice(1), seed=7)
            async for msg in pushes:
                attempts.append(trio.current_time())
                assert msg["params"]["eventId"] == notice(1)["eventId"]      # same id on every retry
                if len(attempts) < 6:
                    await answer(msg, {"error": {"code": -32603, "message": "host busy"}})
                else:
                    await answer(msg, {"result": {"accepted": True}})
                    break
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert len(gaps) == 5
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    assert 0.75 <= gaps[0] <= 1.25 and 12 <= gaps[4] <= 20


@pytest.mark.timeout(30)
async def test_push_timeout_is_retried(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    seen: list[float] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            pushes, answer, ob = await host_pushes(tmp_path, n, notice(2), seed=3)
            async for msg in pushes:
                seen.append(trio.current_time())
                if len(seen) == 2:       # the first push went unanswered
                    await answer(msg, {"result": {"accepted": False, "reason": "duplicate"}})
                    break
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    assert seen[1] - seen[0] >= 30       # the push timeout, then a backoff
