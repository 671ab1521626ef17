"""Pushing notices, under MockClock: answer classes, backoff, refusals that hold one notice
without blocking the rest, holds released by a grant or a reconnect, resends after a
timeout under a new request id, and logging each refusal once."""

from __future__ import annotations

import json
import logging
import random
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from swarmbase import config
from swarmbase.notify.delivery import PUSH_TIMEOUT_S, backoff_delay, classify_answer
from swarmbase.mcpl.session import Hub, Session
from swarmbase.notify.outbox import Outbox
from swarmbase.runs.observers import NoObserver, Observers

from .conftest import notice


def test_classify_answers() -> None:
    assert classify_answer({"accepted": True, "inferenceId": "x"})[0] == "done"
    assert classify_answer({"accepted": True}) == ("done", "accepted")        # mcpl-harness answers bare
    assert classify_answer({"accepted": False, "reason": "duplicate"}) == ("done", "duplicate")
    assert classify_answer({"accepted": False, "reason": "Unknown feature set: swarmbase.notify"}) == (
        "refused", "Unknown feature set: swarmbase.notify")
    assert classify_answer({"accepted": False})[0] == "refused"
    assert classify_answer(None, {"code": -32002, "message": "no grant"})[0] == "wait-grant"
    assert classify_answer(None, {"code": -32001, "message": "disabled"}) == ("refused", "-32001: disabled")
    assert classify_answer(None, {"code": -32003, "message": "unknown set"})[0] == "refused"
    assert classify_answer(None, {"code": -32603, "message": "boom"})[0] == "retry"
    assert classify_answer("weird")[0] == "retry"


def test_backoff_grows_with_jitter_and_caps() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(i, rng) for i in range(12)]
    for i, d in enumerate(delays):
        base = min(300.0, 2.0 ** i)
        assert 0.75 * base <= d <= 1.25 * base
    assert delays[-1] <= 375


class MemTransport:
    """The server side of a fake WebSocket: frames travel over memory channels."""

    def __init__(self) -> None:
        self.to_host_send, self.to_host = trio.open_memory_channel[str](1000)
        self.to_server, self.to_server_recv = trio.open_memory_channel[str](1000)

    async def send(self, text: str) -> None:
        await self.to_host_send.send(text)

    async def receive(self) -> str:
        return await self.to_server_recv.receive()

    async def close(self, code: int, reason: str) -> None:
        await self.to_host_send.aclose()


class MemHost:
    """A 0.5 host on the far side of a MemTransport, talking to a real Session."""

    def __init__(self, outbox: Outbox, hub: Hub, seed: int = 1) -> None:
        cfg = config.parse(json.dumps({"callers": [{"name": "a", "tokenSha256": "c" * 64}]}), Path("config.json"))
        self.t = MemTransport()
        # The session reads only the live config of its Supervisor here (its token check).
        sup = types.SimpleNamespace(env=types.SimpleNamespace(cfg=cfg))
        self.session = Session(self.t, cfg.callers[0], sup=sup, outbox=outbox, hub=hub,  # type: ignore[arg-type]
                               rng=random.Random(seed))
        self._next = 100

    async def start(self, nursery: trio.Nursery) -> None:
        self.scope = trio.CancelScope()

        async def serve() -> None:
            with self.scope:
                await self.session.serve()
        nursery.start_soon(serve)
        await self.send({"id": 0, "method": "initialize", "params": {
            "capabilities": {"experimental": {"mcpl": {"version": "0.5", "pushEvents": True}}}}})
        await self.grant()

    async def send(self, msg: dict[str, Any]) -> None:
        await self.t.to_server.send(json.dumps({"jsonrpc": "2.0", **msg}))

    async def grant(self) -> None:
        self._next += 1
        await self.send({"id": self._next, "method": "featureSets/update",
                         "params": {"effectiveCapabilities": ["pushEvents", "tools"]}})

    def pushes(self) -> "MemHost":
        """The push/event frames the host receives, as an async iterator. Not an async
        generator: tests stop reading mid-stream, and a generator left so is finalized
        by the garbage collector (a ResourceWarning)."""
        return self

    def __aiter__(self) -> "MemHost":
        return self

    async def __anext__(self) -> dict[str, Any]:
        while True:
            try:
                frame = await self.t.to_host.receive()
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            msg = json.loads(frame)
            if msg.get("method") == "push/event":
                return msg

    async def answer(self, msg: dict[str, Any], body: dict[str, Any]) -> None:
        await self.send({"id": msg["id"], **body})


def filled(tmp_path: Path, count: int) -> Outbox:
    ob = Outbox(tmp_path / "outbox.jsonl")
    for i in range(count):
        ob.add("a", notice(i))
    return ob


@pytest.mark.timeout(30)
async def test_push_errors_retry_with_growing_delays(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    ob = filled(tmp_path, 1)
    attempts: list[float] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, Hub(), seed=7)
            await host.start(n)
            async for msg in host.pushes():
                attempts.append(trio.current_time())
                assert msg["params"]["eventId"] == notice(0)["eventId"]      # same id on every retry
                if len(attempts) < 6:
                    await host.answer(msg, {"error": {"code": -32603, "message": "host busy"}})
                else:
                    await host.answer(msg, {"result": {"accepted": True}})
                    break
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert len(gaps) == 5
    assert all(later > earlier for earlier, later in zip(gaps, gaps[1:])), gaps
    assert 0.75 <= gaps[0] <= 1.25 and 12 <= gaps[4] <= 20


@pytest.mark.timeout(30)
async def test_unanswered_push_is_resent_under_a_new_request_id(tmp_path: Path,
                                                                autojump_clock: trio.testing.MockClock) -> None:
    ob = filled(tmp_path, 1)
    seen: list[tuple[float, Any, str]] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, Hub(), seed=3)
            await host.start(n)
            async for msg in host.pushes():
                seen.append((trio.current_time(), msg["id"], msg["params"]["eventId"]))
                if len(seen) == 2:       # the first push went unanswered
                    # a late answer to the first request id is ignored; the resend's answer counts
                    await host.send({"id": seen[0][1], "result": {"accepted": True}})
                    await host.answer(msg, {"result": {"accepted": False, "reason": "duplicate"}})
                    break
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    (t0, id0, ev0), (t1, id1, ev1) = seen
    assert ev0 == ev1 and id0 != id1
    assert PUSH_TIMEOUT_S + 0.75 <= t1 - t0 <= PUSH_TIMEOUT_S + 1.25      # the timeout, then one backoff


@pytest.mark.timeout(30)
@pytest.mark.parametrize("refusal", [
    {"result": {"accepted": False, "reason": "Unknown feature set: swarmbase.notify"}},
    {"result": {"accepted": False, "reason": "rate limited by policy"}},
    {"error": {"code": -32001, "message": "feature set disabled", "data": {"featureSet": "swarmbase.notify"}}},
    {"error": {"code": -32003, "message": "feature set unknown", "data": {"featureSet": "swarmbase.notify"}}},
])
async def test_a_refused_notice_is_held_and_does_not_block_the_rest(
        tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
        refusal: dict[str, Any]) -> None:
    ob = filled(tmp_path, 4)
    hub = Hub()
    first = notice(0)["eventId"]
    got: list[tuple[float, str]] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, hub)
            await host.start(n)
            t0 = trio.current_time()
            pushes = host.pushes()
            async for msg in pushes:
                eid = msg["params"]["eventId"]
                got.append((trio.current_time() - t0, eid))
                if eid == first:
                    await host.answer(msg, refusal)
                else:
                    await host.answer(msg, {"result": {"accepted": True}})
                if len(got) == 4:
                    break
            # The other three went out at once, one after the other; the refused one waits.
            assert [e for _, e in got] == [notice(i)["eventId"] for i in range(4)]
            assert all(t < 1.0 for t, _ in got)
            await trio.sleep(600)
            assert ids_pending(ob) == [first]
            # A new grant releases it; refused again, it is held again but logged only once.
            await host.grant()
            msg = await pushes.__anext__()
            assert msg["params"]["eventId"] == first
            await host.answer(msg, refusal)
            await trio.sleep(600)
            await host.grant()
            msg = await pushes.__anext__()
            await host.answer(msg, {"result": {"accepted": True}})
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if "refused notice" in r.getMessage()]
    assert len(warnings) == 1 and first in warnings[0]
    reason = refusal.get("result", {}).get("reason") or refusal["error"]["message"]
    assert reason in warnings[0]


def ids_pending(ob: Outbox) -> list[str]:
    return [n["eventId"] for n in ob.pending("a")]


@pytest.mark.timeout(30)
async def test_a_held_notice_goes_out_after_a_reconnect(tmp_path: Path,
                                                        autojump_clock: trio.testing.MockClock) -> None:
    ob = filled(tmp_path, 2)
    hub = Hub()
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, hub)
            await host.start(n)
            async for msg in host.pushes():
                if msg["params"]["eventId"] == notice(0)["eventId"]:
                    await host.answer(msg, {"result": {"accepted": False, "reason": "not now"}})
                else:
                    await host.answer(msg, {"result": {"accepted": True}})
                    break
            await trio.sleep(600)
            assert ids_pending(ob) == [notice(0)["eventId"]]
            host.scope.cancel()                       # the host goes away and comes back
            again = MemHost(ob, hub)
            await again.start(n)
            async for msg in again.pushes():
                assert msg["params"]["eventId"] == notice(0)["eventId"]
                await again.answer(msg, {"result": {"accepted": True}})
                break
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()


@pytest.mark.timeout(30)
async def test_no_push_grant_waits_for_the_next_grant(tmp_path: Path, autojump_clock: trio.testing.MockClock,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    ob = filled(tmp_path, 2)
    times: list[float] = []
    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, Hub())
            await host.start(n)
            pushes = host.pushes()
            msg = await pushes.__anext__()
            times.append(trio.current_time())
            await host.answer(msg, {"error": {"code": -32002, "message": "pushEvents not granted",
                                              "data": {"capability": "pushEvents"}}})
            await trio.sleep(1000)            # nothing is pushed while the host has not granted
            await host.grant()
            for _ in range(2):
                msg = await pushes.__anext__()
                times.append(trio.current_time())
                await host.answer(msg, {"result": {"accepted": True}})
            while ob.pending("a"):
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    assert times[1] - times[0] >= 1000
    assert sum("has not granted pushEvents" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.timeout(30)
async def test_observers_hear_delivered_and_refused(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    ob = filled(tmp_path, 2)
    heard: list[tuple[str, ...]] = []

    class Observer(NoObserver):
        def notice_delivered(self, caller: str, eid: str) -> None:
            heard.append(("delivered", caller, eid))

        def notice_failed(self, caller: str, eid: str, reason: str) -> None:
            heard.append(("failed", caller, eid, reason))
            raise RuntimeError("a broken observer never affects delivery")

    with trio.fail_after(10_000):
        async with trio.open_nursery() as n:
            host = MemHost(ob, Hub(Observers(Observer())))
            await host.start(n)
            async for msg in host.pushes():
                if msg["params"]["eventId"] == notice(0)["eventId"]:
                    await host.answer(msg, {"result": {"accepted": False, "reason": "nope"}})
                else:
                    await host.answer(msg, {"result": {"accepted": True}})
                    break
            while len(ob.pending("a")) > 1:
                await trio.sleep(0.01)
            n.cancel_scope.cancel()
    assert heard == [("failed", "a", notice(0)["eventId"], "nope"), ("delivered", "a", notice(1)["eventId"])]


def test_log_once_key_is_bounded() -> None:
    hub = Hub()
    assert hub.first_report("x") and not hub.first_report("x")
    for i in range(20_000):
        hub.first_report(i)
    assert len(hub._reported) <= 10_000


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="swarmbase")
