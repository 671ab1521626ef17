"""The dashboard over HTTP: pages, SSE (live, resumable, keep-alive, shutdown), admin
POSTs and the Host allowlist."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import pytest
import trio

from .browser import ADMIN
from .conftest import Env, fake_daemon, run_to_end, wait_state


@pytest.fixture
async def dash(tmp_path: Path, nursery: trio.Nursery) -> Env:
    return await fake_daemon(tmp_path, nursery, dashboard={"adminLogins": [ADMIN, "other@example.com"]},
                             publicUrl="https://box.tailnet.ts.net:7360")


class sse_events:
    """The frames of an SSE stream (`{"event", "id", "data"}`, or `{"comment"}` for a
    keep-alive), as an async iterator. Not an async generator: tests stop reading
    mid-stream, and trio warns (a ResourceWarning, an error here) about every generator
    left so. The response is closed when the stream ends or fails; one left mid-stream
    is closed with its client."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> None:
        self.client, self.url, self.headers = client, url, headers or {}
        self.stack = AsyncExitStack()
        self.lines: AsyncIterator[str] | None = None

    def __aiter__(self) -> "sse_events":
        return self

    async def __anext__(self) -> dict[str, Any]:
        try:
            if self.lines is None:
                r = await self.stack.enter_async_context(self.client.stream("GET", self.url, headers=self.headers))
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                self.lines = r.aiter_lines()
            frame: dict[str, Any] = {}
            async for line in self.lines:
                if line == "":
                    if frame:
                        return frame
                elif line.startswith(":"):
                    return {"comment": line}
                else:
                    k, _, v = line.partition(": ")
                    frame[k] = v
            raise StopAsyncIteration
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.stack.aclose()
            raise


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
        for needle in ('id="agent-1"', 'id="agent-2"', "alpha", "beta", 'id="timeline"', "st-done", "st-failed",
                       "hello log", "Timeline", "&#34;noop&#34;", 'data-phase="work"', "width=device-width",
                       "export const meta = {name: &#39;page test&#39;};", 'id="by-phase"', 'id="by-engine"',
                       'id="sb-data"', "/static/favicon.svg", "✓ page test — completed"):
            assert needle in html, needle
        data = json.loads(html.split('id="sb-data">', 1)[1].split("</script>", 1)[0])
        assert [a["label"] for a in data["agents"]] == ["alpha", "beta"]
        assert data["agents"][1]["error"] and data["agents"][1]["state"] == "failed"
        # A failed agent's reason is in its row, without a click.
        assert data["agents"][1]["error"] in html
        # The waits and the run come from the agents' state histories.
        assert [s[0] for s in data["agents"][0]["segs"]] == ["queued", "running", "done"]
        assert "cancel run" not in html and 'class="skip"' not in html      # no admin login: no buttons
        ap = (await c.get(f"/runs/{run.id}/agents/1")).text
        assert "noop" in ap and "session started" in ap and "result: success" in ap
        assert 'id="usage"' in ap and "input tokens" in ap and '<td class="num">100</td>' in ap   # usage as a table
        raw = (await c.get(f"/runs/{run.id}/agents/1", params={"raw": "1"})).json()
        assert raw["agent"]["state"] == "done" and raw["transcript"][-1]["type"] == "result"
        assert (await c.get(f"/runs/{run.id}/agents/2")).text.count("without a result") >= 1
        assert (await c.get("/runs/run_000000000000")).status_code == 404
        assert (await c.get(f"/runs/{run.id}/agents/9")).status_code == 404
        for asset in ("/static/common.js", "/static/run.js", "/static/list.js", "/static/agent.js",
                      "/static/timeline.js", "/static/highlight.js", "/static/app.css"):
            r = await c.get(asset)
            assert r.status_code == 200 and len(r.content) > 500, asset
        fav = await c.get("/favicon.ico")
        assert fav.status_code == 200 and fav.headers["content-type"].startswith("image/svg+xml")


async def test_run_page_money_one_rounding(dash: Env) -> None:
    """Issue 32.4: three agents of $0.00046 show $0.0005 each; the header and the tables'
    foot both say $0.0014 (the foot summed the rounded rows: $0.0015)."""
    run = await run_to_end(dash, "return [await agent('pay:0.00046'), await agent('pay:0.00046'), "
                                 "await agent('pay:0.00046')]")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        html = (await c.get(f"/runs/{run.id}")).text
    assert "spent <b>$0.0014</b>" in html
    feet = [row for row in html.split("<tr") if row.startswith(' class="total"')]
    assert len(feet) == 2 and all("$0.0014" in f for f in feet), feet
    assert "$0.0015" not in html


async def test_no_external_assets(dash: Env) -> None:
    run = await run_to_end(dash, "return 1")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        for path in ("/", f"/runs/{run.id}"):
            html = (await c.get(path)).text
            for attr in ('src="http', "src='http", 'href="http', "//cdn"):
                assert attr not in html


async def test_sse_live_resume_and_keepalive(dash: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dashboard.sse
    monkeypatch.setattr(dashboard.sse, "KEEPALIVE_S", 0.3)
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
        # The replay holds each agent's latest row only (rows supersede each other).
        assert states[0] == "running" and states[-1] == "done" and "queued" not in states
        assert any(e["event"] == "phase" for e in events) and any(e["event"] == "result" for e in events)
        ids = [int(e["id"]) for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        # Reconnect with Last-Event-ID: what came after it, nothing repeated; log lines and the
        # result complete, rows at their latest.
        k = ids[1]
        again: list[dict[str, Any]] = []
        with trio.fail_after(10):
            async for ev in sse_events(c, f"/runs/{run.id}/events", headers={"Last-Event-ID": str(k)}):
                if "comment" in ev:
                    break                              # caught up, idle: a keep-alive arrives
                if "event" in ev:
                    again.append(ev)
        again_ids = [int(e["id"]) for e in again]
        assert again_ids == sorted(again_ids) and set(again_ids) <= {i for i in ids if i > k}
        later = [e for e in events if int(e["id"]) > k]
        assert [e["id"] for e in again if e["event"] in ("log", "result", "phase")] == \
            [e["id"] for e in later if e["event"] in ("log", "result", "phase")]
        assert again[-1]["id"] == events[-1]["id"] and json.loads(again[-1]["data"])["status"] == "completed"
        assert json.loads([e for e in again if e["event"] == "agent"][-1]["data"])["state"] == "done"


async def test_sse_reload_for_ids_it_cannot_serve(dash: Env) -> None:
    """An id older than what a stream keeps, or newer than anything published (an earlier
    daemon life), gets one `reload` event and the end of the stream, not a partial history."""
    hub = dash.services.supervisor.env.events
    run = await run_to_end(dash, "".join(f"log('line {i}');\n" for i in range(40)) + "return 1")
    async with httpx.AsyncClient(base_url=dash.url, timeout=httpx.Timeout(10, read=None)) as c:
        for after in (1, hub.seq + 1_000):
            with trio.fail_after(10):
                frames = [ev async for ev in sse_events(c, f"/runs/{run.id}/events?after={after}") if "event" in ev]
            assert [f["event"] for f in frames] == ["reload"], after


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


async def sign_in(c: httpx.AsyncClient, env: Env, login: str = ADMIN) -> str:
    """Walk the admin-link flow in-process; returns the session cookie's value."""
    from swarmbase.admin import AdminStore
    token = AdminStore(env.state).create_link(login)
    page = await c.get(f"/admin/login/{token}")
    assert page.status_code == 200 and f"Sign in as {login}" in page.text
    assert page.headers["cache-control"] == "no-store" and page.headers["referrer-policy"] == "no-referrer"
    r = await c.post(f"/admin/login/{token}", headers={"Tailscale-User-Login": login})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    for attr in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/"):
        assert attr in cookie, attr
    return cookie.split(";", 1)[0].split("=", 1)[1]


async def test_admin_posts(dash: Env, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.write_text("")
    sup = dash.services.supervisor
    run = sup.start(dash.cfg.caller("alice"), {"script": f"const a = await agent('waitfile:{hold}');\n"
                                                        f"const b = await agent('waitfile:{hold}');\nreturn [a, b];"})
    await wait_state(dash, run, 1, "running")
    async with httpx.AsyncClient(base_url=dash.url) as c:
        skip = f"/runs/{run.id}/agents/1/skip"
        # Headers alone (what any local process can send) are refused.
        cases = [({}, "missing header"), ({"X-SwarmBase": "1"}, "need a Tailscale-User-Login"),
                 ({"X-SwarmBase": "1", "Tailscale-User-Login": "eve@example.com"}, "not listed"),
                 ({"Tailscale-User-Login": ADMIN}, "missing header"),
                 ({"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN}, "no admin session"),
                 ({"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN, "Cookie": "swarmbase_admin=" + "x" * 43},
                  "no admin session")]
        for headers, msg in cases:
            r = await c.post(skip, headers=headers)
            assert r.status_code == 403 and msg in r.json()["error"], headers
        assert sup.live[run.id].agents[1].state == "running"
        session = await sign_in(c, dash)
        admin = {"Tailscale-User-Login": ADMIN, "Cookie": f"swarmbase_admin={session}"}
        # The admin with a session sees the buttons; the same login without it, or others, do not.
        assert 'class="skip"' in (await c.get(f"/runs/{run.id}", headers=admin)).text
        assert 'class="skip"' not in (await c.get(f"/runs/{run.id}", headers={"Tailscale-User-Login": ADMIN})).text
        assert 'class="skip"' not in (await c.get(f"/runs/{run.id}", headers={**admin, "Tailscale-User-Login": "eve@x"})).text
        # A session is bound to its login: another admin login cannot use it.
        r = await c.post(skip, headers={**admin, "X-SwarmBase": "1", "Tailscale-User-Login": "other@example.com"})
        assert r.status_code == 403 and "another login" in r.json()["error"]
        ok = await c.post(skip, headers={**admin, "X-SwarmBase": "1"})
        assert ok.status_code == 200 and ok.json()["status"] == "skipping"
        await wait_state(dash, run, 2, "running")
        assert sup.live[run.id].agents[1].state == "skipped"
        cancel = await c.post(f"/runs/{run.id}/cancel", headers={**admin, "X-SwarmBase": "1"})
        assert cancel.status_code == 200
        with trio.fail_after(30):
            while run.active:
                await trio.sleep(0.02)
        assert run.status == "cancelled" and run.error == f"cancelled by admin {ADMIN}"
        again = await c.post(f"/runs/{run.id}/cancel", headers={**admin, "X-SwarmBase": "1"})
        assert again.status_code == 409


async def test_admin_link_once_and_sessions_expire(dash: Env) -> None:
    from swarmbase.admin import AdminStore, digest
    store = AdminStore(dash.state)
    async with httpx.AsyncClient(base_url=dash.url) as c:
        token = store.create_link(ADMIN)
        # The link page does not use the link; the POST does, once.
        assert (await c.get(f"/admin/login/{token}")).status_code == 200
        assert (await c.get(f"/admin/login/{token}")).status_code == 200
        # A browser signed in to the tailnet as someone else cannot take it.
        wrong = await c.post(f"/admin/login/{token}", headers={"Tailscale-User-Login": "eve@example.com"})
        assert wrong.status_code == 403
        first = await c.post(f"/admin/login/{token}", headers={"Tailscale-User-Login": ADMIN})
        assert first.status_code == 303
        second = await c.post(f"/admin/login/{token}", headers={"Tailscale-User-Login": ADMIN})
        assert second.status_code == 410 and "already used" in second.text
        assert (await c.get(f"/admin/login/{token}")).status_code == 410
        assert (await c.get("/admin/login/not-a-token")).status_code == 410
        # Only hashes are on disk, owner-only.
        session = first.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
        files = list((dash.state / "admin").rglob("*.json"))
        assert [f.name for f in files] == [digest(session) + ".json"]
        assert all(token not in f.read_text() and session not in f.read_text() for f in files)
        assert oct(files[0].stat().st_mode & 0o777) == "0o600"
        assert oct((dash.state / "admin").stat().st_mode & 0o777) == "0o700"
        headers = {"X-SwarmBase": "1", "Tailscale-User-Login": ADMIN, "Cookie": f"swarmbase_admin={session}"}
        assert (await c.post("/runs/run_000000000000/cancel", headers=headers)).status_code == 404   # accepted
        # An expired session is refused (and swept).
        record = json.loads(files[0].read_text())
        files[0].write_text(json.dumps({**record, "expiresAt": record["createdAt"] - 1}))
        r = await c.post("/runs/run_000000000000/cancel", headers=headers)
        assert r.status_code == 403 and "expired" in r.json()["error"]
        # An expired link too.
        late = AdminStore(dash.state, clock=lambda: 0.0).create_link(ADMIN)
        assert (await c.post(f"/admin/login/{late}", headers={"Tailscale-User-Login": ADMIN})).status_code == 410
        assert store.sweep() >= 1 and not list((dash.state / "admin" / "sessions").glob("*.json"))


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


async def test_security_headers_and_error_pages(dash: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    root = str(Path(__file__).resolve().parent.parent)
    run = await run_to_end(dash, "phase('empty');\nphase('work');\nreturn await agent('noop', {label: 'a'})")
    pages = ["/", f"/runs/{run.id}", f"/runs/{run.id}/agents/1", "/admin/login/" + "x" * 43]
    async with httpx.AsyncClient(base_url=dash.url, timeout=httpx.Timeout(10, read=None)) as c:
        for path in [*pages, "/runs/run_000000000000", "/static/app.css", "/?status=bogus"]:
            r = await c.get(path)
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, path
            assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff", path
        async with c.stream("GET", "/events") as r:
            assert r.headers["x-content-type-options"] == "nosniff" and "content-security-policy" in r.headers
        for path in pages:
            html = (await c.get(path)).text
            # Every script is a file of ours or inert JSON data; no inline style attributes.
            for attrs in re.findall(r"<script([^>]*)>", html):
                assert re.search(r'src="/(audit/)?static/', attrs) or 'type="application/json"' in attrs, (path, attrs)
            assert " style=" not in html and "<style" not in html and " on" + "click=" not in html, path
        # The empty phase is collapsed to one line.
        assert '<details class="phase empty-phase" data-phase="empty"' in (await c.get(f"/runs/{run.id}")).text
        bad = await c.get("/?from=yesterday")
        assert bad.status_code == 400 and "?from= must be a date" in bad.text
        missing = await c.get("/runs/run_000000000000")
        assert missing.status_code == 404 and root not in missing.text

        def boom(_run: Any) -> Any:
            raise RuntimeError(f"phases.json broke in {root}/swarmbase/runs/store.py")
        monkeypatch.setattr(dash.services.supervisor, "phases", boom)
        r = await c.get(f"/runs/{run.id}")
        assert r.status_code == 500 and "Internal error" in r.text
        for leak in ("Traceback", root, "site-packages", "phases.json broke", "store.py"):
            assert leak not in r.text, leak


async def test_list_shows_quarantined_files(dash: Env) -> None:
    dash.services.supervisor.env.store.damaged = [{"path": "runs/x/run.json", "fault": "truncated JSON", "at": "2026-01-01T00:00:00Z"},
                                        {"path": "procs/7.json", "fault": "not JSON", "at": "2026-01-01T00:00:00Z"}]
    async with httpx.AsyncClient(base_url=dash.url) as c:
        html = (await c.get("/")).text
    assert "2 damaged files quarantined at boot" in html and "runs/x/run.json" in html and "truncated JSON" in html


async def test_resume_links_and_failing_line(dash: Env) -> None:
    sup = dash.services.supervisor
    first = await run_to_end(dash, "const a = await agent('noop', {label: 'kept'});\n\nthrow new Error('boom');")
    assert first.status == "failed" and first.error_line == 3
    again = sup.resume(dash.cfg.caller("alice"), first.id, {})
    with trio.fail_after(60):
        await sup.live[again.id].finished.wait()
    async with httpx.AsyncClient(base_url=dash.url) as c:
        old = (await c.get(f"/runs/{first.id}")).text
        new = (await c.get(f"/runs/{again.id}")).text
    assert f'<a href="/runs/{again.id}" id="resumed-as">' in old
    assert f'<a href="/runs/{first.id}" id="resumed-from">' in new
    assert 'data-error-line="3"' in old and '"errorLine":3' in old and "boom" in old
    # The replayed agent is marked, in its row and in the page's data for the timeline.
    data = json.loads(new.split('id="sb-data">', 1)[1].split("</script>", 1)[0])
    assert data["agents"][0]["replayed"] is True and "replayed" in new


async def test_run_list_stream_coalesces_a_log_flood(dash: Env) -> None:
    """Every log() line changes the run's row; a list viewer gets the latest row at most
    twice a second, not one event per line."""
    got: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=dash.url, timeout=httpx.Timeout(10, read=None)) as c:
        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                async def watch() -> None:
                    async for ev in sse_events(c, "/events"):
                        if ev.get("event") == "run":
                            got.append(json.loads(ev["data"]))
                            if got[-1]["status"] == "completed":
                                n.cancel_scope.cancel()
                n.start_soon(watch)
                await trio.sleep(0.2)
                await run_to_end(dash, "for (let i = 0; i < 300; i++) log('line ' + i);\nreturn 1", label="chatty")
    assert got[-1]["status"] == "completed" and got[-1]["label"] == "chatty"
    assert len(got) < 40, len(got)
