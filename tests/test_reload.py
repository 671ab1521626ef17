"""Config reloads of the real daemon process (issue 24 #2): SIGHUP adds, removes and
rotates callers while another caller's run goes on (it completes and its notice is
delivered; the removed caller's run goes on too, its notice queued); a bad config is refused by `swarmbase reload` (exit 2, the one-line message,
the same line in the daemon's log) and the old config keeps serving; a restart-only
change is reported, not applied; `add-caller` serves the new caller without a restart;
a lowered limit applies to the next run of a session that stayed open.

One daemon serves the whole sequence (each step needs the state the last one left), so
the module costs one start. Waits are on events (a close frame, a notice, the daemon's
status file), never on elapsed time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import RpcFailure, connect

from .clidaemon import cli_daemon, fake_cli_config
from .reloading import edit_config, new_token, sighup_and_wait


async def swarmbase(path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, SWARMBASE_CONFIG=str(path))
    return await trio.run_process([sys.executable, "-m", "swarmbase", *args], env=env, capture_stdout=True,
                                  capture_stderr=True, check=False)


def queued_notice(state: Path, event_id: str) -> dict[str, Any] | None:
    lines = []
    for line in (state / "outbox.jsonl").read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:              # the daemon's append in progress
            pass
    adds = [e["notice"] for e in lines if e.get("op") == "add" and e["notice"]["eventId"] == event_id]
    return adds[-1] if adds else None


async def can_list_tools(ws: str, token: str) -> bool:
    async with connect(ws, token) as h:
        try:
            await h.handshake()
            return bool((await h.request("tools/list"))["tools"])
        except (RpcFailure, ConnectionError):
            return False


@pytest.mark.timeout(300)
async def test_callers_change_live_while_a_run_goes_on(tmp_path: Path) -> None:
    path, tokens = fake_cli_config(tmp_path, callers=("alice", "bob", "dave"), sandbox="none")
    state = path.parent
    gate = tmp_path / "gate"
    gate.write_text("")
    with trio.fail_after(240):
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as alice, \
                connect(d.ws, tokens["bob"]) as bob, connect(d.ws, tokens["dave"]) as dave:
            for h in (alice, bob, dave):
                await h.handshake()
            run_id = (await alice.tool("run", {"script": f"return await agent('waitfile:{gate}')"})
                      )["structuredContent"]["runId"]
            bob_run = (await bob.tool("run", {"script": f"return await agent('waitfile:{gate}')"})
                       )["structuredContent"]["runId"]

            # One reload: carol added, bob removed, dave's token rotated.
            carol_tok, carol_sha = new_token(state, "carol")
            dave_tok, dave_sha = new_token(state, "dave")

            def callers(cfg: dict[str, Any]) -> None:
                keep = [c for c in cfg["callers"] if c["name"] != "bob"]
                for c in keep:
                    if c["name"] == "dave":
                        c["tokenSha256"] = dave_sha
                cfg["callers"] = keep + [{**keep[0], "name": "carol", "tokenSha256": carol_sha}]
            edit_config(path, callers)
            st = await sighup_and_wait(d, state)
            assert st["ok"] and st["message"] == ("config reloaded: added caller carol; removed caller bob; "
                                                  "rotated the token of caller dave"), st
            # Where the time went, step by step (issue 32.9), in the status file and the log.
            assert list(st["phasesMs"]) == ["read", "plan", "swap", "sessions", "quotas", "keys"], st
            assert all(isinstance(v, (int, float)) and v >= 0 for v in st["phasesMs"].values())
            await bob.closed_event.wait()
            await dave.closed_event.wait()
            assert (bob.closed.reason.code, bob.closed.reason.reason) == (
                4003, "the caller was removed from the daemon's config")
            assert (dave.closed.reason.code, dave.closed.reason.reason) == (
                4004, "the caller's token was rotated; reconnect with the new token")
            assert await can_list_tools(d.ws, carol_tok)
            assert await can_list_tools(d.ws, dave_tok)
            assert not await can_list_tools(d.ws, tokens["dave"])      # the old token: refused at once
            assert not await can_list_tools(d.ws, tokens["bob"])
            assert d.proc.returncode is None                            # SIGHUP no longer kills it

            # alice's run went on through it all; it completes and its notice arrives.
            assert (await alice.tool("status", {"runId": run_id}))["structuredContent"]["status"] == "running"
            gate.unlink()
            notice = await alice.wait_notice(f"{run_id}:end")
            assert "swarmbase:completed" in notice["tags"]
            # The removed caller's run went on too; its notice waits in the outbox for that name.
            while not (bob_notice := queued_notice(state, f"{bob_run}:end")):
                await trio.sleep(0.05)
            assert "swarmbase:completed" in bob_notice["tags"]

            # A lower limit applies to the next run of the session that stayed open.
            edit_config(path, lambda cfg: [c.update(runUsdMax=2, runUsdDefault=1) for c in cfg["callers"] if c["name"] == "alice"])
            st = await sighup_and_wait(d, state)
            assert st["message"] == "config reloaded: changed caller alice", st
            refused = await alice.tool("run", {"script": "return 1", "budgetUsd": 5})
            assert refused["isError"] and "above this caller's runUsdMax 2" in refused["content"][0]["text"]

            # A bad config: refused with the one-line message, and the old one serves on.
            good = path.read_text()
            edit_config(path, lambda cfg: cfg["callers"][0].update(runUsdMax="lots"))
            out = await swarmbase(path, "reload")
            line = (f"swarmbase: reload refused: bad config: {path}: callers[0].runUsdMax: must be a number, "
                    f"got a string; the running config stays")
            assert out.returncode == 2 and out.stderr.decode().strip() == line, out
            assert line.removeprefix("swarmbase: ") in d.stderr.decode()
            assert await can_list_tools(d.ws, carol_tok)
            assert not await can_list_tools(d.ws, tokens["bob"])

            # A setting that cannot change live is reported, not half-applied.
            path.write_text(good)
            edit_config(path, lambda cfg: cfg.update(port=1, maxAgentsPerRun=7))
            out = await swarmbase(path, "reload")
            assert out.returncode == 0, out
            assert out.stderr.decode().strip() == ("swarmbase: config reloaded: applied maxAgentsPerRun; "
                                                   "needs a restart (kept the running value): port")
            assert await can_list_tools(d.ws, carol_tok)                # still on the port it bound

            # add-caller reloads the running daemon: the new caller connects at once.
            out = await swarmbase(path, "add-caller", "erin")
            assert out.returncode == 0, out
            assert "config reloaded: added caller erin" in out.stderr.decode()
            assert await can_list_tools(d.ws, (state / "mcpl-erin.token").read_text().strip())
        assert d.proc.returncode == 0


async def test_reload_without_a_daemon_says_so(tmp_path: Path) -> None:
    path, _ = fake_cli_config(tmp_path)
    out = await swarmbase(path, "reload")
    assert out.returncode == 1
    assert out.stderr.decode().strip() == (f"swarmbase: no daemon is running on {path.parent}; it reads the config "
                                           "when it starts")
