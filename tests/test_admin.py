"""Admin actions cannot be forged: against the real daemon process, a POST carrying only
the headers any local process can send is refused; `python -m swarmbase admin-link` (a
second process) mints a one-time link that the daemon redeems once for a session cookie;
an expired session is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from swarmbase.client import connect

from .conftest import start_cli_daemon, write_config
from .fakes import fake_claude

ADMIN = "admin@example.com"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def admin_link(cfg_path: Path, login: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "swarmbase", "admin-link", login], capture_output=True, text=True,
                          env=dict(os.environ, SWARMBASE_CONFIG=str(cfg_path)), timeout=60)


@pytest.mark.timeout(180)
async def test_admin_actions_need_a_session_from_a_one_time_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cli = fake_claude.install(bindir)
    state.mkdir()
    key = state / "alice.key"
    key.write_text("sk-admin-test-0000000")
    key.chmod(0o600)
    port = free_port()
    cfg_path, tokens = write_config(state, callers=["alice"], caller_extra={"apiKeyFile": str(key)},
                                    engines={"claude": {"bin": str(cli), "baseUrl": "http://127.0.0.1:9/gw"}},
                                    dashboard={"adminLogins": [ADMIN]}, sandbox="none")   # the fake waits on a host file
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "port": port}))
    proc, ws = await start_cli_daemon(cfg_path)
    base = f"http://127.0.0.1:{port}"
    hold = tmp_path / "hold"
    hold.write_text("")
    try:
        async with connect(ws, tokens["alice"]) as h, httpx.AsyncClient(base_url=base, timeout=30) as c:
            await h.handshake()
            run_id = (await h.tool("run", {"script": f"return await agent('waitfile:{hold}', {{label: 'held'}})"})
                      )["structuredContent"]["runId"]
            forged = {"Tailscale-User-Login": ADMIN, "X-SwarmBase": "1"}
            r = await c.post(f"/runs/{run_id}/cancel", headers=forged)
            assert r.status_code == 403 and "admin-link" in r.json()["error"]
            assert (await h.tool("status", {"runId": run_id}))["structuredContent"]["status"] == "running"

            refused = admin_link(cfg_path, "eve@example.com")
            assert refused.returncode == 2 and "not listed in dashboard.adminLogins" in refused.stderr
            made = admin_link(cfg_path, ADMIN)
            assert made.returncode == 0, made.stderr
            link = made.stdout.strip().splitlines()[0]
            assert link.startswith(f"{base}/admin/login/") and "works once" in made.stderr
            token = link.rsplit("/", 1)[1]
            assert not any(token in p.read_text() for p in (state / "admin").rglob("*.json"))

            path = link.removeprefix(base)
            assert (await c.get(path)).status_code == 200
            signed = await c.post(path, headers={"Tailscale-User-Login": ADMIN})
            assert signed.status_code == 303
            cookie = signed.headers["set-cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie   # plain loopback
            session = cookie.split(";", 1)[0].split("=", 1)[1]
            assert (await c.post(path, headers={"Tailscale-User-Login": ADMIN})).status_code == 410   # once

            ok = await c.post(f"/runs/{run_id}/cancel", headers={**forged, "Cookie": f"swarmbase_admin={session}"})
            assert ok.status_code == 200, ok.text
            with trio.fail_after(60):
                while (st := (await h.tool("status", {"runId": run_id}))["structuredContent"])["status"] == "running":
                    await trio.sleep(0.1)
            assert st["status"] == "cancelled" and st["error"] == f"cancelled by admin {ADMIN}"

            # Expired: the session file says so, and the daemon refuses it.
            [sess] = list((state / "admin" / "sessions").glob("*.json"))
            record = json.loads(sess.read_text())
            sess.write_text(json.dumps({**record, "expiresAt": record["createdAt"] - 60}))
            late = await c.post(f"/runs/{run_id}/cancel", headers={**forged, "Cookie": f"swarmbase_admin={session}"})
            assert late.status_code == 403 and "expired" in late.json()["error"]
    finally:
        hold.unlink(missing_ok=True)
        proc.terminate()
        with trio.move_on_after(20):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
