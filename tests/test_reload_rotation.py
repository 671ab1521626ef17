"""A rotated token's session closes every time (issue 31 item 7).

The field saw 3 of 8 rotation-only reloads leave the session open, answering `tools/list`
with a token the daemon no longer accepts. The real daemon process here rotates one
caller's token 12 times; each round two freshly attached sessions (one kept busy with
requests) must be closed with 4004, and a connection made with the old token while the
reload runs must be refused or closed 4004. The holes that can leave a session
open are pinned one by one in-process below (a session registering while the reload
swaps, a session whose token an earlier config matched, a close frame that cannot be
sent), each against the real Session and Hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed

from swarmbase import live_reload, reload
from swarmbase.client import ConnectionLost, RpcFailure, connect
from swarmbase.mcpl.session import Hub

from .clidaemon import cli_daemon, fake_cli_config
from .reloading import edit_config, new_token, sighup_and_wait
from .session_wire import FakeEnv, FakeSup, Wire, configs, session


async def keep_busy(h: Any) -> None:
    """tools/list until the connection ends: the reload's close meets sends in flight."""
    try:
        while True:
            await h.request("tools/list")
    except (ConnectionLost, ConnectionClosed, RpcFailure, trio.BrokenResourceError, trio.ClosedResourceError):
        return


async def connect_during_the_reload(ws: str, token: str, outcome: list[str]) -> None:
    """Connect with the token a reload is retiring: refused (-32001), or closed, and how:
    at registration (before its handshake is answered) or after."""
    async with connect(ws, token) as h:
        try:
            await h.handshake()
        except RpcFailure:
            outcome.append("refused")
            return
        except (ConnectionLost, ConnectionClosed):
            pass
        with trio.move_on_after(20):
            await h.closed_event.wait()
        outcome.append(f"closed {h.closed.reason.code}" if h.closed is not None else "still open")


@pytest.mark.timeout(300)
async def test_twelve_rotations_close_the_attached_session_with_4004_each_time(tmp_path: Path) -> None:
    path, tokens = fake_cli_config(tmp_path, callers=("alice", "dave"), sandbox="none")
    state = path.parent
    token = tokens["dave"]
    with trio.fail_after(240):
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as alice:
            await alice.handshake()
            for round_ in range(12):
                # Two sessions of dave (they coexist), one kept busy, and a third connecting
                # with the old token while the reload runs: whenever its token was matched,
                # it is refused or closed 4004, never left open.
                late: list[str] = []
                async with connect(d.ws, token) as dave, connect(d.ws, token) as idle, trio.open_nursery() as n:
                    for h in (dave, idle):
                        await h.handshake()
                        assert (await h.request("tools/list"))["tools"]
                    n.start_soon(keep_busy, dave)
                    new_tok, new_sha = new_token(state, "dave")
                    edit_config(path, lambda cfg: [c.update(tokenSha256=new_sha) for c in cfg["callers"]
                                                   if c["name"] == "dave"])
                    n.start_soon(connect_during_the_reload, d.ws, token, late)
                    st = await sighup_and_wait(d, state)
                    assert st["ok"] and st["message"] == "config reloaded: rotated the token of caller dave", st
                    for h in (dave, idle):
                        with trio.fail_after(20):
                            await h.closed_event.wait()
                        assert h.closed is not None, f"round {round_}: the connection ended without a close frame"
                        assert (h.closed.reason.code, h.closed.reason.reason) == (
                            4004, "the caller's token was rotated; reconnect with the new token"), round_
                assert late in (["refused"], ["closed 4004"]), (round_, late)
                # The old token is refused, and told why (issue 32.16); the other caller's
                # session never noticed.
                async with connect(d.ws, token) as old:
                    with pytest.raises(RpcFailure) as refused:
                        await old.handshake()
                assert refused.value.error == {
                    "code": -32001, "message": "unauthorized: this token was rotated; connect with the caller's new token"}
                token = new_tok
                assert await alice.request("ping") == {}
            assert not alice.closed_event.is_set()
            edit_config(path, lambda cfg: cfg.update(callers=[c for c in cfg["callers"] if c["name"] != "dave"]))
            st = await sighup_and_wait(d, state)
            assert st["message"] == "config reloaded: removed caller dave", st
            async with connect(d.ws, token) as old:
                with pytest.raises(RpcFailure) as refused:
                    await old.handshake()
            assert refused.value.error["message"] == "unauthorized: this caller was removed from the daemon's config"
        # The daemon's log said so, naming the caller, never the token.
        log = d.stderr.decode()
        assert "refused an MCPL connection from 127.0.0.1: this token was rotated; connect with the caller's new " \
               "token (caller dave)" in log
        assert tokens["dave"] not in log and token not in log


# -- the holes, in-process ----------------------------------------------------------------

async def test_a_session_registering_after_the_swap_with_a_token_the_old_config_matched_is_closed(
        tmp_path: Path) -> None:
    # The connection matched its token against the running config; the reload swapped and
    # judged the open sessions before this one registered: it must not slip in.
    old, rotated, _ = configs(tmp_path)
    sup, hub, wire = FakeSup(FakeEnv(old)), Hub(), Wire.new()
    s = session(wire, old, sup, hub, "dave", tmp_path)
    sup.env.cfg = rotated
    await live_reload.close_sessions(hub, reload.plan(old, rotated).config)
    with trio.fail_after(5):
        await s.serve()             # returns: closed at registration, never reading a frame
    assert wire.closes == [(4004, "the caller's token was rotated; reconnect with the new token")]
    assert not hub.sessions


async def test_a_session_an_earlier_config_matched_is_judged_by_its_own_token(tmp_path: Path) -> None:
    # The plan compares the running config with the new one; a session whose token only an
    # older config matched is still closed (its own token against the new config).
    old, rotated, _ = configs(tmp_path)
    sup, hub, wire = FakeSup(FakeEnv(old)), Hub(), Wire.new()
    s = session(wire, old, sup, hub, "dave", tmp_path)
    async with trio.open_nursery() as n:
        n.start_soon(s.serve)
        await trio.testing.wait_all_tasks_blocked()
        assert hub.sessions
        sup.env.cfg = rotated
        # A later reload changing something else: dave is not in its `rotated`.
        later = attrs.evolve(rotated, maxAgentsPerRun=rotated.maxAgentsPerRun + 1)
        await live_reload.close_sessions(hub, reload.plan(rotated, later).config)
        with trio.fail_after(5):
            while hub.sessions:
                await trio.sleep(0.01)
    assert wire.closes == [(4004, "the caller's token was rotated; reconnect with the new token")]


async def test_a_close_frame_that_cannot_be_sent_still_stops_the_session(tmp_path: Path) -> None:
    old, rotated, _ = configs(tmp_path)
    sup, hub, wire = FakeSup(FakeEnv(old)), Hub(), Wire.new(close_fails=True)
    s = session(wire, old, sup, hub, "dave", tmp_path)
    async with trio.open_nursery() as n:
        n.start_soon(s.serve)
        await trio.testing.wait_all_tasks_blocked()
        sup.env.cfg = rotated
        await live_reload.close_sessions(hub, reload.plan(old, rotated).config)
        with trio.fail_after(5):
            while hub.sessions:
                await trio.sleep(0.01)
        # Nothing more is answered: a request after the failed close gets no reply.
        sent = len(wire.sent)
        await wire.inbox_send.send('{"jsonrpc":"2.0","id":1,"method":"ping"}')
        await trio.testing.wait_all_tasks_blocked()
        assert len(wire.sent) == sent
    assert wire.closes == [(4004, "the caller's token was rotated; reconnect with the new token")]
