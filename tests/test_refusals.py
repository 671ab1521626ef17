"""Refused MCPL connections (issue 32.16), under MockClock: a host retrying with an old
token every 1.5 s for 45 s leaves one daemon log line, the next window's line counts what
was refused without one, another address gets its own line; the -32001 answer says the
token was rotated or the caller removed while the daemon remembers the old hash. The real
Session over a test transport; the real daemon's answer is in test_reload_rotation.py."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from swarmbase import config
from swarmbase.mcpl import refusals
from swarmbase.mcpl.refusals import Refusals, token_sha256
from swarmbase.mcpl.session import Hub, Session
from swarmbase.notify.outbox import Outbox

from .session_wire import FakeEnv, FakeSup, Wire, configs


async def refuse(hub: Hub, cfg: config.Config, tmp_path: Path, peer: str, token: str | None) -> dict[str, object]:
    """One connection presenting `token` (matching no caller of `cfg`): its -32001 answer."""
    wire = Wire.new()
    s = Session(wire, None, FakeSup(FakeEnv(cfg)), Outbox(tmp_path / "outbox.jsonl"), hub,  # type: ignore[arg-type]
                rng=random.Random(0), peer=peer, presented_sha256=token_sha256(token))
    await wire.inbox_send.send('{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}')
    await s.serve()
    assert wire.closes == [(4001, "unauthorized")]
    [answer] = [json.loads(t) for t in wire.sent]
    return answer["error"]  # type: ignore[no-any-return]


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused an MCPL connection")]


async def test_one_line_per_address_per_window(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                               autojump_clock: trio.testing.MockClock) -> None:
    caplog.set_level(logging.INFO, logger="swarmbase.mcpl")
    old, _, _ = configs(tmp_path)
    hub = Hub()
    start = trio.current_time()
    for _ in range(30):                                  # 45 s of retries, every 1.5 s
        await refuse(hub, old, tmp_path, "10.0.0.5", "an-old-token")
        await trio.sleep(1.5)
    assert refusal_lines(caplog) == [
        "refused an MCPL connection from 10.0.0.5: the token is missing or matches no caller"]
    await refuse(hub, old, tmp_path, "10.0.0.9", None)  # another address: its own line at once
    assert len(refusal_lines(caplog)) == 2
    await trio.sleep(start + refusals.WINDOW_S - trio.current_time())
    await refuse(hub, old, tmp_path, "10.0.0.5", "an-old-token")
    assert refusal_lines(caplog)[-1] == (
        "refused an MCPL connection from 10.0.0.5: the token is missing or matches no caller; 29 more refused "
        "from this address since the last such line")
    assert not any("an-old-token" in r.getMessage() for r in caplog.records)


async def test_a_rotated_or_removed_token_is_told_so_while_remembered(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="swarmbase.mcpl")
    old, rotated, tokens = configs(tmp_path)
    removed = attrs.evolve(rotated, callers=[c for c in rotated.callers if c.name != "alice"])
    hub = Hub()
    hub.refusals.retire(old, rotated)
    hub.refusals.retire(rotated, removed)
    answers = [await refuse(hub, removed, tmp_path, f"10.0.0.{i}", tok)
               for i, tok in enumerate((tokens["dave"], tokens["alice"], "never-a-token"))]
    assert [(a["code"], a["message"]) for a in answers] == [
        (-32001, "unauthorized: this token was rotated; connect with the caller's new token"),
        (-32001, "unauthorized: this caller was removed from the daemon's config"),
        (-32001, "unauthorized: the token is missing or matches no caller")]
    assert refusal_lines(caplog)[:2] == [
        "refused an MCPL connection from 10.0.0.0: this token was rotated; connect with the caller's new token "
        "(caller dave)",
        "refused an MCPL connection from 10.0.0.1: this caller was removed from the daemon's config (caller alice)"]


def test_memory_is_bounded() -> None:
    r = Refusals()
    for i in range(refusals.MAX_PEERS + 10):
        assert r.note(f"10.1.{i // 256}.{i % 256}", 0.0) == 0
    assert len(r._windows) == refusals.MAX_PEERS
    assert r.note("10.1.0.0", 0.0) == 0       # the oldest was dropped: it logs again
    for i in range(refusals.MAX_RETIRED + 5):
        r._remember(f"{i:064x}", refusals.ROTATED, "dave")
    assert len(r._retired) == refusals.MAX_RETIRED
    assert r.why(f"{0:064x}") == (refusals.UNKNOWN, None)           # the oldest forgotten
    assert r.why(f"{refusals.MAX_RETIRED + 4:064x}") == (refusals.ROTATED, "dave")
