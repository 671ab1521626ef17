"""Hostile JSON against the real daemon process over real WebSockets: non-finite numbers,
frames nested 100,000 deep (before and after auth), and internal errors that must not
show paths or stack traces to the peer."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed

import swarmbase
from swarmbase.client import connect, open_websocket
from swarmbase.mcpl import tools
from swarmbase.mcpl.session import UNAUTH_CLOSE_AFTER_S, Hub, Session

from .clidaemon import CliDaemon, cli_daemon
from .conftest import Env, write_config


def rpc(rid: Any, method: str, params: Any = None) -> str:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg)


INIT = rpc(0, "initialize", {"capabilities": {"experimental": {"mcpl": {"version": "0.5", "pushEvents": True}}}})


async def answers(ws: Any, count: int) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for _ in range(count):
        msg = json.loads(await ws.get_message())
        out[msg.get("id")] = msg
    return out


def assert_no_traceback(d: CliDaemon) -> None:
    text = d.stderr.decode(errors="replace")
    assert "Traceback" not in text and "RecursionError" not in text, text[-3000:]


@pytest.mark.timeout(120)
async def test_non_finite_numbers_and_deep_frames_against_the_daemon_process(tmp_path: Path) -> None:
    path, tokens = write_config(tmp_path / "state", callers=["alice"])
    async with cli_daemon(path) as d:
        url = f"{d.ws}?token={tokens['alice']}"
        with trio.fail_after(60):
            async with open_websocket(url, max_message_size=16 * 1024 * 1024) as ws:
                await ws.send_message(INIT)
                await answers(ws, 1)
                call = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"run","arguments":%s}}'
                await ws.send_message(call % (1, '{"script":"return 1","budgetUsd":NaN}'))
                await ws.send_message(call % (2, '{"script":"return args","args":{"x":[1,2,Infinity]}}'))
                await ws.send_message(call % (3, '{"script":"return 1","budgetTokens":-Infinity}'))
                await ws.send_message('{"jsonrpc":"2.0","id":4,"method":"ping","params":{"n":NaN}}')
                await ws.send_message("[" * 100_000)                              # never closed
                await ws.send_message("[" * 100_000 + "]" * 100_000)              # valid, absurdly deep
                deep_args = '{"script":"return 1","args":' + "[" * 200 + "]" * 200 + "}"
                await ws.send_message(call % (5, deep_args))
                got = await answers(ws, 7)
                for rid, path, token in [(1, "arguments.budgetUsd", "NaN"), (2, "arguments.args.x[2]", "Infinity"),
                                         (3, "arguments.budgetTokens", "-Infinity"), (4, "params.n", "NaN")]:
                    err = got[rid]["error"]
                    assert err["code"] == -32602 and err["data"]["path"] == path, err
                    assert token in err["message"] and path in err["message"]
                assert got[None]["error"]["code"] == -32700 and "nests too deep" in got[None]["error"]["message"]
                assert got[5]["error"]["code"] == -32600 and "deeper than" in got[5]["error"]["message"]
                # The connection keeps serving, and nothing reached a run.
                await ws.send_message(rpc(6, "ping"))
                await ws.send_message(rpc(7, "tools/call", {"name": "list", "arguments": {}}))
                after = await answers(ws, 2)
                assert after[6]["result"] == {}
                assert after[7]["result"]["structuredContent"]["runs"] == []
                ok_args = '{"script":"return args.length","args":' + "[" * 100 + "]" * 100 + "}"
                await ws.send_message(call % (8, ok_args))          # deep but within bounds: fine
                assert "runId" in (await answers(ws, 1))[8]["result"]["structuredContent"]

            # Before auth: whatever a connection without a valid token sends first — a frame
            # nested 100,000 deep (never closed, or closed), a NaN id, binary garbage, a real
            # request — is answered -32001 and the connection closed at once.
            for url in (f"{d.ws}?token=wrong", d.ws):
                for first, rid in [("[" * 100_000, None), ("[" * 100_000 + "]" * 100_000, None),
                                   ('{"jsonrpc":"2.0","id":NaN,"method":"initialize"}', None),
                                   (b"\xff\xfe\x00garbage", None), (INIT, 0)]:
                    async with open_websocket(url, max_message_size=16 * 1024 * 1024) as ws:
                        await ws.send_message(first)
                        refused = json.loads(await ws.get_message())
                        assert refused["id"] == rid and refused["error"]["code"] == -32001, (first[:20], refused)
                        with pytest.raises(ConnectionClosed) as ei:
                            await ws.get_message()
                        assert ei.value.reason.code == 4001
            # A second frame sent right behind the first is never read. (Whether the refusal
            # still arrives then is up to TCP: a frame that reaches a socket the daemon has
            # just closed makes the kernel reset it, which may drop the refusal in flight: a
            # full-suite run saw 1006 so. So only what never happens is asserted here.)
            async with open_websocket(f"{d.ws}?token=wrong") as ws:
                await ws.send_message(INIT)
                with contextlib.suppress(ConnectionClosed):
                    await ws.send_message(INIT.replace('"id": 0', '"id": 9'))
                seen = []
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        seen.append(json.loads(await ws.get_message()))
                assert [m.get("id") for m in seen] in ([0], []), seen
            async with connect(d.ws, tokens["alice"]) as h:      # and the daemon serves on
                await h.handshake()
                assert await h.request("ping") == {}
        await trio.sleep(0.2)
    assert_no_traceback(d)


class SilentPeer:
    """A transport whose peer never sends a frame."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed: int | None = None

    async def send(self, text: str) -> None:
        self.sent.append(text)

    async def receive(self) -> str:
        await trio.sleep_forever()
        raise AssertionError

    async def close(self, code: int, reason: str) -> None:
        self.closed = code


async def test_an_unauthenticated_peer_that_sends_nothing_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    peer = SilentPeer()
    with trio.fail_after(UNAUTH_CLOSE_AFTER_S * 2):
        await Session(peer, None, sup=None, outbox=None, hub=Hub()).serve()   # type: ignore[arg-type]
    assert peer.closed == 4001 and peer.sent == []
    assert trio.current_time() == pytest.approx(UNAUTH_CLOSE_AFTER_S)


async def test_internal_error_text_shows_no_paths_or_stack(running: Env, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    install = str(Path(swarmbase.__file__).parent)

    def broken(sup: Any, caller: Any, a: dict[str, Any]) -> dict[str, Any]:
        raise FileNotFoundError(2, "No such file or directory", f"{install}/runs/store.py")
    monkeypatch.setitem(tools.HANDLERS, "list", broken)
    caplog.set_level(logging.ERROR, logger="swarmbase")
    with trio.fail_after(10):
        async with open_websocket(f"{running.ws}?token={running.tokens['alice']}") as ws:
            await ws.send_message(INIT)
            await answers(ws, 1)
            await ws.send_message(rpc(1, "tools/call", {"name": "list", "arguments": {}}))
            err = (await answers(ws, 1))[1]["error"]
            await ws.send_message(rpc(2, "ping"))
            assert (await answers(ws, 1))[2]["result"] == {}
    assert err["code"] == -32603
    message = err["message"]
    assert "/" not in message and install not in message and "Traceback" not in message and "File " not in message
    assert "FileNotFoundError" in message
    ref = message.rsplit("ref ", 1)[1]
    assert any(ref in r.getMessage() and r.exc_info for r in caplog.records)     # the details are in the log
