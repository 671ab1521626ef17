"""The key door on its own (engines/key_door.py), served as the daemon serves it, in front
of the fake Anthropic API: a live bearer is swapped for the caller's key on the way out;
any other request is refused and nothing reaches the API. The whole path, real CLI in its
sandbox: test_claude_engine.py::test_the_key_never_enters_an_agent."""

from __future__ import annotations

import secrets
import socket

import httpx
import trio

from swarmbase.daemon import serve_relay
from swarmbase.engines.key_door import KeyDoor, upstream_url
from swarmbase.runs.records import Redactor

from .fakes.anthropic_api import FakeAnthropic

KEY = "sk-ant-door-canary-" + secrets.token_hex(12)
BODY = {"model": "claude-test", "max_tokens": 16, "stream": True,
        "messages": [{"role": "user", "content": "[[text:through the door]]"}]}


async def test_a_live_bearer_is_swapped_for_the_key(nursery: trio.Nursery) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    redact = Redactor()
    door = KeyDoor(redact=redact)
    await nursery.start(serve_relay, door)
    agent = door.register(KEY, api.url + "/")
    assert redact(f"x {agent.bearer} y") == "x [redacted] y"          # live bearers are secrets
    async with httpx.AsyncClient() as c:
        r = await c.post(door.url + "/v1/messages?beta=true", json=BODY,
                         headers={"x-api-key": agent.bearer, "anthropic-version": "2023-06-01",
                                  "anthropic-beta": "b1", "authorization": f"Bearer {agent.bearer}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert "through the door" in r.text                 # the stream came back as it was
        seen = api.requests[-1]["headers"]
        assert seen["x-api-key"] == KEY and "authorization" not in seen
        assert seen["anthropic-version"] == "2023-06-01" and seen["anthropic-beta"] == "b1"
        assert agent.bearer not in str(seen)
        # The API's own answers pass with their status and headers (a 429's retry-after).
        limited = dict(BODY, messages=[{"role": "user", "content": "[[429:1]] [[text:x]]"}])
        r = await c.post(door.url + "/v1/messages", json=limited, headers={"authorization": f"Bearer {agent.bearer}"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert api.requests[-1]["headers"]["x-api-key"] == KEY


async def test_anything_but_a_live_bearer_is_refused_and_goes_nowhere(nursery: trio.Nursery) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    door = KeyDoor(redact=Redactor())
    await nursery.start(serve_relay, door)
    agent = door.register(KEY, api.url)
    async with httpx.AsyncClient() as c:
        for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": KEY}, {"authorization": "Basic " + agent.bearer},
                        {"authorization": "Bearer " + agent.bearer[:-1]}):
            r = await c.post(door.url + "/v1/messages", json=BODY, headers=headers)
            assert r.status_code == 401, headers
        door.unregister(agent)                          # the agent ended: its bearer is dead
        r = await c.post(door.url + "/v1/messages", json=BODY, headers={"x-api-key": agent.bearer})
        assert r.status_code == 401
    assert api.requests == [] and door.refused == 6


async def test_an_absolute_target_cannot_leave_the_api(nursery: trio.Nursery) -> None:
    """A raw `POST http://elsewhere/...` (absolute-form) must not carry the key there."""
    api = await nursery.start(FakeAnthropic().serve)
    door = KeyDoor()
    await nursery.start(serve_relay, door)
    agent = door.register(KEY, api.url)
    host, port = door.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        body = b'{"messages": []}'
        s.sendall(b"POST http://127.0.0.1:9/v1/messages HTTP/1.1\r\nHost: 127.0.0.1:9\r\nx-api-key: "
                  + agent.bearer.encode() + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n"
                  b"connection: close\r\n\r\n" + body)
        s.settimeout(10)
        reply = b""
        while chunk := await trio.to_thread.run_sync(s.recv, 65536):
            reply += chunk
    assert not reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert api.requests == []
    assert upstream_url("https://gw.example/a", b"/v1/messages", b"beta=true") == \
        httpx.URL("https://gw.example/a/v1/messages?beta=true")
    for raw in (b"http://evil.example/x", b"@evil.example/x", b""):
        assert upstream_url("https://gw.example", raw, b"") is None, raw
