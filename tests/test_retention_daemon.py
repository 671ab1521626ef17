"""Retention against the real daemon process (fake claude CLI, real Node runner): ended
runs archived at boot, then read through `status`, `result`, `list`, the dashboard and
`python -m swarmbase audit --expect-hash`; a resumable run kept; delete mode; a bad
retention config refused. One state dir goes through three daemons in turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from swarmbase import usage
from swarmbase.client import connect

from . import gen_runs
from .clidaemon import cli_daemon, fake_cli_config

OK = "phase('work');\nconst a = await agent('noop first', {label: 'one'});\nreturn {answer: a, n: 1};"
FAILS = "phase('work');\nawait agent('noop paid', {label: 'paid'});\nthrow new Error('boom after a paid agent');"


def set_retention(cfg: Path, retention: Any) -> None:
    data = json.loads(cfg.read_text())
    data["retention"] = retention
    cfg.write_text(json.dumps(data))


def run_dir(state: Path, run_id: str) -> list[Path]:
    return list((state / "runs").glob(f"*-{run_id}"))


def archive_of(state: Path, run_id: str) -> list[Path]:
    return list((state / "runs-archive").glob(f"*-{run_id}.zip"))


def audit_cli(cfg: Path, *args: str) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "swarmbase", "audit", *args], capture_output=True, text=True,
                       env=dict(os.environ, SWARMBASE_CONFIG=str(cfg)), timeout=60)
    return p.returncode, p.stdout + p.stderr


async def run_and_wait(h: Any, script: str) -> str:
    rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
    await h.wait_notice(f"{rid}:end")
    return rid


async def wait_for(check: Any) -> None:
    while not check():
        await trio.sleep(0.05)


@pytest.mark.timeout(300)
async def test_archive_then_read_everywhere_then_delete(tmp_path: Path) -> None:
    cfg, tokens = fake_cli_config(tmp_path)
    state = tmp_path / "state"
    # 1. Three ended runs, no retention yet: an old completed one, a failed one with a
    #    paid agent in its journal (resumable), and a newer completed one.
    async with cli_daemon(cfg) as d:
        with trio.fail_after(120):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                old = await run_and_wait(h, OK)
                notice = await h.wait_notice(f"{old}:end")
                failed = await run_and_wait(h, FAILS)
                newer = await run_and_wait(h, OK)
                before = (await h.tool("status", {"runId": old}))["structuredContent"]
                result_before = (await h.tool("result", {"runId": old}))["structuredContent"]["text"]
                usage_before = (await h.tool("usage", {}))["structuredContent"]
    end_hash = notice["origin"]["endHash"]
    (old_dir,) = run_dir(state, old)
    transcript = (old_dir / "agents" / "1" / "transcript.jsonl").read_bytes()
    assert (run_dir(state, failed)[0] / "journal.jsonl").stat().st_size > 0

    # 2. maxRuns 1: at boot the old run is archived; the failed one is resumable and kept.
    #    Then, every 3 s, the periodic pass: a new run ends and the one before it goes.
    set_retention(cfg, {"maxRuns": 1, "intervalMinutes": 0.05})
    async with cli_daemon(cfg) as d:
        base = d.ws.split("/mcpl")[0].replace("ws://", "http://")
        with trio.fail_after(120):
            await wait_for(lambda: archive_of(state, old) and not run_dir(state, old))
            assert run_dir(state, failed) and run_dir(state, newer) and not archive_of(state, newer)
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                status = (await h.tool("status", {"runId": old}))["structuredContent"]
                result = (await h.tool("result", {"runId": old}))["structuredContent"]
                listed = (await h.tool("list", {}))["structuredContent"]["runs"]
                only_archived = (await h.tool("list", {"status": "archived"}))["structuredContent"]["runs"]
                resumed = await h.tool("resume", {"runId": old})
                usage_after = (await h.tool("usage", {}))["structuredContent"]
                usage_cli = usage.report_for_state(state, caller="alice")        # what `swarmbase usage` reads
                assert not archive_of(state, newer)
                latest = await run_and_wait(h, OK)
                await wait_for(lambda: archive_of(state, newer) and not run_dir(state, newer))
                assert run_dir(state, latest) and run_dir(state, failed)
            async with httpx.AsyncClient(base_url=base) as c:
                run_page = await c.get(f"/runs/{old}")
                agent_page = await c.get(f"/runs/{old}/agents/1", params={"raw": "1"})
                archived_list = await c.get("/", params={"status": "archived"})
                verdict = (await c.get(f"/runs/{old}/audit.json")).json()
    assert status["archivedAt"] and status["status"] == "completed"
    assert status["phases"] == before["phases"] and status["log"] == before["log"]
    assert result["text"] == result_before and '"n": 1' in result["text"]
    rows = {r["runId"]: r for r in listed}
    assert "archivedAt" in rows[old] and "archivedAt" not in rows[newer] and "archivedAt" not in rows[failed]
    # `list` filters as the dashboard's /?status=archived does: archived, whatever the status.
    assert [(r["runId"], r["status"]) for r in only_archived] == [(old, "completed")]
    assert resumed["isError"] and "archived" in resumed["content"][0]["text"]
    # Spend still counts the archived run's agent, in the daemon and in `swarmbase usage`.
    assert usage_after == usage_before and usage_before["totals"]["agents"] == 3
    assert usage_cli == {k: v for k, v in usage_before.items() if k != "quota"}     # the tool adds its quotas
    assert run_page.status_code == 200 and 'id="run-archived"' in run_page.text
    assert "return {answer: a, n: 1}" in run_page.text.replace("&#39;", "'")
    assert agent_page.status_code == 200
    raw = agent_page.json()
    assert raw["agent"]["label"] == "one" and len(raw["transcript"]) == transcript.count(b"\n")
    assert archived_list.status_code == 200 and old in archived_list.text and newer in archived_list.text
    assert latest not in archived_list.text
    assert verdict["status"] == "intact", verdict

    # 3. The audit reads the archive: every chain and the notice's end-record hash verify.
    code, text = await trio.to_thread.run_sync(audit_cli, cfg, old, "--expect-hash", end_hash)
    assert code == 0 and "every chain is intact, and the end record hash is the expected one" in text, text
    code, text = await trio.to_thread.run_sync(audit_cli, cfg, old, "--expect-hash", "0" * 64)
    assert code == 1 and f"not the expected {'0' * 64}" in text, text

    # 4. Delete mode, resumable runs included when asked: the failed run goes for good; the
    #    archives stay readable; the newest run stays.
    set_retention(cfg, {"maxRuns": 1, "action": "delete", "keepResumable": False})
    async with cli_daemon(cfg) as d:
        with trio.fail_after(120):
            await wait_for(lambda: not run_dir(state, failed))
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                gone = await h.tool("status", {"runId": failed})
                still = (await h.tool("result", {"runId": old}))["structuredContent"]
    assert gone["isError"] and "no run" in gone["content"][0]["text"]
    assert still["text"] == result_before and run_dir(state, latest) and archive_of(state, old)
    assert not list((state / "runs").glob(".pruned-*")) and not list((state / "runs-archive").glob(".tmp-*"))
    assert "Traceback" not in d.stderr.decode(errors="replace")


@pytest.mark.timeout(180)
async def test_a_reload_applies_retention_at_once(tmp_path: Path) -> None:
    """Issue 32.3: retention is a policy, read at each pass; `swarmbase reload` turning it
    on says so and archives at once (the reload used to say "needs a restart")."""
    cfg, tokens = fake_cli_config(tmp_path)
    state = tmp_path / "state"
    async with cli_daemon(cfg) as d:
        with trio.fail_after(150):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                old = await run_and_wait(h, OK)
                newer = await run_and_wait(h, OK)
            set_retention(cfg, {"maxRuns": 1, "intervalMinutes": 600})
            p = await trio.run_process([sys.executable, "-m", "swarmbase", "reload"], capture_stdout=True,
                                       capture_stderr=True, check=False, env=dict(os.environ, SWARMBASE_CONFIG=str(cfg)))
            assert p.returncode == 0, p
            assert p.stderr.decode().strip() == "swarmbase: config reloaded: applied retention (a pass runs now)"
            await wait_for(lambda: archive_of(state, old) and not run_dir(state, old))
            assert run_dir(state, newer) and not archive_of(state, newer)
    assert "Traceback" not in d.stderr.decode(errors="replace")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retention, message", [
    ({}, "retention: set days, maxRuns or both"),
    ({"days": 30, "action": "shred"}, "retention.action: must be one of 'archive', 'delete', got 'shred'"),
    ({"maxRun": 5}, "retention.maxRun: unknown key (did you mean 'maxRuns'?)"),
    ({"days": -1}, "retention.days: must be between"),
])
def test_a_bad_retention_config_is_refused(tmp_path: Path, retention: Any, message: str) -> None:
    cfg, _ = fake_cli_config(tmp_path)
    set_retention(cfg, retention)
    p = subprocess.run([sys.executable, "-m", "swarmbase"], capture_output=True, text=True, timeout=50,
                       env=dict(os.environ, SWARMBASE_CONFIG=str(cfg)))
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.timeout(300)
async def test_kill_9_mid_archive_then_a_clean_boot(tmp_path: Path) -> None:
    cfg, tokens = fake_cli_config(tmp_path, callers=gen_runs.CALLERS)
    state = tmp_path / "state"
    runs = gen_runs.generate(state, 400)
    set_retention(cfg, {"maxRuns": 1})
    names = {r.dir_name for r in runs}

    def on_disk() -> tuple[set[str], set[str]]:
        dirs = {p.name for p in (state / "runs").iterdir() if p.is_dir() and not p.name.startswith(".")}
        zips = {p.name[:-4] for p in (state / "runs-archive").glob("*.zip") if not p.name.startswith(".")}
        return dirs, zips

    async with cli_daemon(cfg) as d:
        with trio.fail_after(120):
            await wait_for(lambda: (state / "runs-archive").is_dir() and on_disk()[1])
        d.proc.kill()                              # mid-pass: the first archives are done
        await d.proc.wait()
    dirs, zips = on_disk()
    pruned = {p.name[len(".pruned-"):] for p in (state / "runs").glob(".pruned-*")}
    assert dirs | zips | pruned == names and len(zips) < 397       # nothing lost, the pass cut short
    async with cli_daemon(cfg) as d:
        with trio.fail_after(180):
            await wait_for(lambda: len(on_disk()[1]) == 397)
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                listed = (await h.tool("list", {"limit": 500}))["structuredContent"]["runs"]
    dirs, zips = on_disk()
    assert not dirs & zips and dirs | zips == names and len(dirs) == 3
    assert not list((state / "runs").glob(".pruned-*")) and not list((state / "runs-archive").glob(".tmp-*"))
    assert all(zipfile.ZipFile(state / "runs-archive" / f"{z}.zip").testzip() is None for z in zips)
    lines = [json.loads(x) for x in (state / "runs-archive" / "index.jsonl").read_text().splitlines()]
    assert sorted({x["dirName"] for x in lines}) == sorted(zips)
    mine = [r for r in runs if r.caller == "alice"]
    assert len(listed) == len(mine) and sum("archivedAt" not in r for r in listed) == 1
    assert "Traceback" not in d.stderr.decode(errors="replace")
