"""The dashboard over HTTP: pages, SSE (live, resumable, keep-alive, shutdown), admin
POSTs and the Host allowlist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from .conftest import Env, run_to_end
from .test_agents import fake_daemon

ADMIN = "admin@example.com"


@pytest.fixture
async def dash(tmp_path: Path, nursery: trio.Nursery) -> Env:
    return await fake_daemon(tmp_path, nursery, dashboard={"adminLogins": [ADMIN]},
                             publicUrl="https://box.tailnet.ts.net:7360")


async def wait_state(env: Env, run: Any, n: int, state: str) -> None:
    with trio.fail_after(30):
        while True:
            live = env.services.supervisor.live.get(run.id)
            if live and n in live.agents and live.agents[n].state == state:
                return
            await trio.sleep(0.02)


async def sse_events(client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None
                     ) -> AsyncIterator[dict[str, Any]]:
    async with client.stream("GET", url, headers=headers or {}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        frame: dict[str, Any] = {}
        async for line in r.aiter_lines():
            if line == "":
                if frame:
                    yield frame
                frame = {}
            elif line.startswith(":"):
                yield {"comment": line}
            else:
                k, _, v = line.partition(": ")
                frame[k] = v


async def test_pages_render(dash: Env, tmp_path: Path) -> None:
    run = await run_to_end(dash, "export const meta = {name: 'page test'};\nphase('work');\nlog('hello log');\n"
                                 "return [await agent('noop', {label: 'alpha'}), await agent('noresult', {label: 'beta'})]")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        page = (await c.get("/")).text
        assert "page test" in page and "alice" in page and "completed" in page
        assert run.id in (await c.get("/", params={"caller": "alice", "status": "completed"})).text
        assert run.id not in (await c.get("/", params={"status": "running"})).text
        rp = await c.get(f"/runs/{run.id}")
        assert rp.status_code == 200
        html = rp.text
        for needle in ('id="agent-1"', 'id="agent-2"', "alpha", "beta", 'id="bar-1"', "st-done", "st-failed",
                       "hello log", "Timeline", "&#34;noop&#34;", 'data-phase="work"', "width=device-width"):
            assert needle in html, needle
        assert "cancel run" not in html and 'class="skip"' not in html      # no admin login: no buttons
        ap = (await c.get(f"/runs/{run.id}/agents/1")).text
        assert "noop" in ap and "session started" in ap and "result: success" in ap
        raw = (await c.get(f"/runs/{run.id}/agents/1", params={"raw": "1"})).json()
        assert raw["agent"]["state"] == "done" and raw["transcript"][-1]["type"] == "result"
        assert (await c.get(f"/runs/{run.id}/agents/2")).text.count("without a result") >= 1
        assert (await c.get("/runs/run_000000000000")).status_code == 404
        assert (await c.get(f"/runs/{run.id}/agents/9")).status_code == 404
        for asset in ("/static/app.js", "/static/app.css"):
            r = await c.get(asset)
            assert r.status_code == 200 and len(r.content) > 500


async def test_no_external_assets(dash: Env) -> None:
    run = await run_to_end(dash, "return 1")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        for path in ("/", f"/runs/{run.id}"):
            html = (await c.get(path)).text
            for attr in ('src="http', "src='http", 'href="http', "//cdn"):
                assert attr not in html


async def test_sse_live_resume_and_keepalive(dash: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dashboard.app
    monkeypatch.setattr(dashboard.app, "KEEPALIVE_S", 0.3)
    hold = tmp_path / "hold"
    hold.write_text("")
    sup = dash.services.supervisor
    run = sup.start(dash.cfg.caller("alice"), {"script": f"phase('p');\nreturn await agent('waitfile:{hold}', {{label: 'w'}})"})
    await wait_state(dash, run, 1, "running")
    seen: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=dash.url, timeout=httpx.Timeout(10, read=None)) as c:
        with trio.fail_after(30):
            async for ev in sse_events(c, f"/runs/{run.id}/events"):
                seen.append(ev)
                if ev.get("event") == "agent" and json.loads(ev["data"])["state"] == "running" and hold.exists():
                    hold.unlink()                      # let the agent finish while we watch
                if ev.get("event") == "run" and json.loads(ev["data"])["status"] == "completed":
                    break
        events = [e for e in seen if "event" in e]
        states = [json.loads(e["data"])["state"] for e in events if e["event"] == "agent"]
        assert states[:2] == ["queued", "running"] and states[-1] == "done"
        assert any(e["event"] == "phase" for e in events) and any(e["event"] == "result" for e in events)
        ids = [int(e["id"]) for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        # Reconnect with Last-Event-ID: exactly the events after it, nothing lost or repeated.
        k = ids[2]
        again = []
        with trio.fail_after(10):
            async for ev in sse_events(c, f"/runs/{run.id}/events", headers={"Last-Event-ID": str(k)}):
                if "comment" in ev:
                    break                              # caught up, idle: a keep-alive arrives
                if "event" in ev:
                    again.append(int(ev["id"]))
        assert again == [i for i in ids if i > k]


async def test_run_list_stream_sees_new_runs(dash: Env) -> None:
    async with httpx.AsyncClient(base_url=dash.url, timeout=httpx.Timeout(10, read=None)) as c:
        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                got: list[dict[str, Any]] = []

                async def watch() -> None:
                    async for ev in sse_events(c, "/events"):
                        if ev.get("event") == "run":
                            got.append(json.loads(ev["data"]))
                            if got[-1]["status"] == "completed":
                                n.cancel_scope.cancel()
                n.start_soon(watch)
                await trio.sleep(0.2)
                await run_to_end(dash, "return 5", label="listed")
        assert got[0]["label"] == "listed" and got[0]["caller"] == "alice"


async def test_sse_ends_cleanly_on_shutdown(tmp_path: Path) -> None:
    from swarmbase import config
    from .conftest import start_daemon, write_config
    path, tokens = write_config(tmp_path / "s", callers=["alice"])
    env = Env(state=tmp_path / "s", tokens=tokens, cfg=config.load(path))
    stop = trio.Event()
    frames = []
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await start_daemon(n, env, stop=stop)
            async with httpx.AsyncClient(base_url=env.url, timeout=httpx.Timeout(10, read=None)) as c:
                async for ev in sse_events(c, "/events"):
                    frames.append(ev)
                    if len(frames) == 1:
                        stop.set()
    assert frames[-1].get("event") == "shutdown"


async def test_admin_posts(dash: Env, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("")
    sup = dash.services.supervisor
    run = sup.start(dash.cfg.caller("alice"), {"script": f"const a = await agent('waitfile:{hold}');\n"
                                                        f"const b = await agent('waitfile:{hold}');\nreturn [a, b];"})
    await wait_state(dash, run, 1, "running")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        skip = f"/runs/{run.id}/agents/1/skip"
        cases = [({}, "missing header"), ({"X-SwarmBase": "1"}, "need a Tailscale-User-Login"),
                 ({"X-SwarmBase": "1", "Tailscale-User-Login": "eve@example.com"}, "not listed"),
                 ({"Tailscale-User-Login": ADMIN}, "missing header")]
        for headers, msg in cases:
            r = await c.post(skip, headers=headers)
            assert r.status_code == 403 and msg in r.json()["error"], headers
        assert sup.live[run.id].agents[1].state == "running"
        # The admin sees the buttons; others do not.
        assert 'class="skip"' in (await c.get(f"/runs/{run.id}", headers={"Tailscale-User-Login": ADMIN})).text
        assert 'class="skip"' not in (await c.get(f"/runs/{run.id}", headers={"Tailscale-User-Login": "eve@x"})).text
        ok = await c.post(skip, headers={"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN})
        assert ok.status_code == 200 and ok.json()["status"] == "skipping"
        await wait_state(dash, run, 2, "running")
        assert sup.live[run.id].agents[1].state == "skipped"
        cancel = await c.post(f"/runs/{run.id}/cancel", headers={"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN})
        assert cancel.status_code == 200
        with trio.fail_after(30):
            while run.active:
                await trio.sleep(0.02)
        assert run.status == "cancelled" and run.error == f"cancelled by admin {ADMIN}"
        again = await c.post(f"/runs/{run.id}/cancel", headers={"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN})
        assert again.status_code == 409


async def test_host_allowlist(dash: Env) -> None:
    async with httpx.AsyncClient(base_url=dash.url) as c:
        for host in ("evil.example", "evil.example:7360", "127.0.0.1.nip.io"):
            r = await c.get("/", headers={"Host": host})
            assert r.status_code == 403 and r.json() == {"error": "host not allowed"}
        assert (await c.get("/", headers={"Host": "box.tailnet.ts.net:7360"})).status_code == 200
        assert (await c.get("/", headers={"Host": "localhost:7360"})).status_code == 200
        assert (await c.get("/", headers={"Host": "[::1]:7360"})).status_code == 200
    # The WebSocket endpoint too (a rebinding page could open it): a raw upgrade request.
    port = int(dash.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /mcpl?token=x HTTP/1.1\r\nHost: evil.example\r\nUpgrade: websocket\r\n"
                              b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              b"Sec-WebSocket-Version: 13\r\n\r\n")
        with trio.fail_after(10):
            head = await stream.receive_some(4096)
    assert head.startswith(b"HTTP/1.1 403")
