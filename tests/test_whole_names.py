"""Every pattern that guards a path matches the whole name: Python's `$` also matches
before a final newline, so `^name$` with re.match let "x\\n" through (save_workflow wrote
"x\\n.js"). Each guard is tried with a valid name plus "\\n"; save_workflow also against
the real daemon process."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from swarmbase.admin import AdminStore, digest
from swarmbase.client import connect
from swarmbase.node import state as node_state
from swarmbase.runs import workflows
from swarmbase.runs.model import Run
from swarmbase.runs.store import RunStore

from .clidaemon import cli_daemon
from .conftest import Env, write_config

RUN_ID = "run_0123456789ab"


def test_saved_workflow_names(tmp_path: Path) -> None:
    workflows.save(tmp_path, "alice", "x", "return 1")
    for name in ("x\n", "x\n\n", "../x", ""):
        with pytest.raises(workflows.WorkflowError, match="1-64 letters"):
            workflows.save(tmp_path, "alice", name, "return 2")
        with pytest.raises(workflows.WorkflowError, match="1-64 letters"):
            workflows.load_saved(tmp_path, "alice", name)
    assert sorted(p.name for p in workflows.saved_dir(tmp_path, "alice").iterdir()) == ["x.js"]


def test_run_ids_and_run_dirs(tmp_path: Path) -> None:
    record = {"id": RUN_ID, "caller": "alice", "dirName": f"20250101T000000Z-{RUN_ID}", "status": "completed"}
    assert Run.from_json(record).id == RUN_ID
    with pytest.raises(ValueError, match="no valid run id"):
        Run.from_json({**record, "id": RUN_ID + "\n"})
    store = RunStore(tmp_path)
    odd = store.root / f"20250101T000000Z-{RUN_ID}\n"
    odd.mkdir(parents=True)
    (odd / "run.json").write_text(json.dumps({**record, "dirName": odd.name}))
    damaged: list[str] = []
    assert list(store.load_all(lambda p, f: damaged.append(f))) == [] and damaged == []   # not a run dir of ours


def test_admin_tokens(tmp_path: Path) -> None:
    store = AdminStore(tmp_path)
    token = "A" * 32
    # A session file for the name with a newline: the guard, not a missing file, refuses it.
    store.sessions.mkdir(parents=True, exist_ok=True)
    (store.sessions / f"{digest(token + chr(10))}.json").write_text(
        json.dumps({"login": "mallory@example.com", "createdAt": 0, "expiresAt": 4e9}))
    assert store.session_login(token + "\n") is None
    cookie = store.create_session("you@example.com")
    assert store.session_login(cookie) == "you@example.com" and store.session_login(cookie + "\n") is None


def test_node_state_names(tmp_path: Path) -> None:
    node_state.agent_dirs("alice", "boot1", "key1", root=tmp_path)
    for bad in ("key1\n", "..", ".", "a/b"):
        with pytest.raises(ValueError, match="not a plain name"):
            node_state.agent_dirs("alice", "boot1", bad, root=tmp_path)


async def test_sse_paths_match_whole(running: Env) -> None:
    async with httpx.AsyncClient(base_url=running.url, timeout=10) as c:
        assert (await c.get("/events%0A")).status_code == 404


@pytest.mark.timeout(60)
async def test_save_workflow_refuses_a_trailing_newline_on_the_daemon_process(tmp_path: Path) -> None:
    path, tokens = write_config(tmp_path / "state", callers=["alice"])
    async with cli_daemon(path) as d:
        with trio.fail_after(40):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                bad = await h.tool("save_workflow", {"name": "x\n", "script": "return 1"})
                assert bad["isError"] is True
                assert bad["content"][0]["text"] == "name 'x\\n': name must be 1-64 letters, digits, '_' or '-'"
                good = await h.tool("save_workflow", {"name": "x", "script": "return 1"})
                assert good["structuredContent"] == {"name": "x", "saved": True}
                listed = (await h.tool("workflows"))["structuredContent"]["workflows"]
                assert [w["name"] for w in listed] == ["x"]
    assert sorted(p.name for p in (tmp_path / "state" / "workflows" / "alice").iterdir()) == ["x.js"]
    assert "Traceback" not in d.stderr.decode(errors="replace")
