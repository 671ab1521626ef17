"""Damaged run records on the real daemon process (issue 25 #4, #5): a torn or garbled
run.json does not make its run vanish from list, status, result and resume while its
journal, agents and result are intact; a garbled phases.json does not make status fail.
Each is rebuilt, marked, and its damaged bytes kept beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from swarmbase.client import HostClient, connect

from .clidaemon import cli_daemon, fake_cli_config

SCRIPT = """phase('one');
const a = await agent('noop');
phase('two');
const [b, c] = await parallel([() => agent('noop'), () => agent('noop')]);
return {v: 42, x: args.x, got: [a, b, c].length};"""


async def start(h: HostClient, label: str) -> str:
    return (await h.tool("run", {"script": SCRIPT, "args": {"x": 1}, "label": label}))["structuredContent"]["runId"]


@pytest.mark.timeout(180)
async def test_damaged_run_json_and_phases_json_are_rebuilt_and_served(tmp_path: Path) -> None:
    path, tokens = fake_cli_config(tmp_path, ("alice", "bob"))
    state = path.parent
    with trio.fail_after(160):
        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                torn, garbled, phased = [await start(h, label) for label in ("torn", "garbled", "phased")]
                for rid in (torn, garbled, phased):
                    assert "swarmbase:completed" in (await h.wait_notice(f"{rid}:end"))["tags"]
        dirs = {rid: next((state / "runs").glob(f"*-{rid}")) for rid in (torn, garbled, phased)}
        originals = {rid: (dirs[rid] / "run.json").read_bytes() for rid in (torn, garbled)}
        (dirs[torn] / "run.json").write_bytes(originals[torn][:len(originals[torn]) // 2])
        (dirs[garbled] / "run.json").write_bytes(os.urandom(300))
        (dirs[phased] / "phases.json").write_bytes(b'[{"title": "one", "agents": [')

        async with cli_daemon(path) as d:
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                listed = {r["runId"]: r for r in (await h.tool("list", {}))["structuredContent"]["runs"]}
                assert set(listed) == {torn, garbled, phased}                 # nothing vanished
                for rid in (torn, garbled):
                    row = listed[rid]
                    assert row["status"] == "completed" and row["agents"] == {"done": 3, "total": 3, "running": 0}
                    assert "was damaged and was rebuilt" in row["rebuilt"]
                    assert json.loads((await h.tool("result", {"runId": rid}))["structuredContent"]["text"]) == \
                        {"v": 42, "x": 1, "got": 3}
                    st = (await h.tool("status", {"runId": rid}))["structuredContent"]
                    assert [(p["title"], len(p["agents"])) for p in st["phases"]] == [("one", 1), ("two", 2)]
                    [copy] = dirs[rid].glob("run.json.damaged-*")               # the bytes are kept
                    assert copy.read_bytes() != originals[rid] and copy.name in row["rebuilt"]
                assert listed[torn]["label"] == "torn"       # salvaged from the torn file's whole fields
                assert "args" in listed[garbled]["rebuilt"]  # garbage: the args are lost ...
                refused = await h.tool("resume", {"runId": garbled})
                assert refused["isError"] and "args were not recovered" in refused["content"][0]["text"]
                # ... and given again, every agent replays from the intact journal.
                again = (await h.tool("resume", {"runId": garbled, "args": {"x": 1}}))["structuredContent"]["runId"]
                assert "swarmbase:completed" in (await h.wait_notice(f"{again}:end"))["tags"]
                rows = [a for p in (await h.tool("status", {"runId": again}))["structuredContent"]["phases"]
                        for a in p["agents"]]
                assert len(rows) == 3 and all(a["replayed"] for a in rows)
                # phases.json garbled: status still answers, from the agent records.
                st = await h.tool("status", {"runId": phased})
                assert not st.get("isError")
                assert [(p["title"], [a["state"] for a in p["agents"]]) for p in st["structuredContent"]["phases"]] \
                    == [("one", ["done"]), ("two", ["done", "done"])]
                assert list(dirs[phased].glob("phases.json.damaged-*"))
            async with connect(d.ws, tokens["bob"]) as h:       # still only its owner's
                await h.handshake()
                assert (await h.tool("list", {}))["structuredContent"]["runs"] == []
        err = d.stderr.decode()
        assert f"run {torn}: " in err and f"run {garbled}: " in err and f"run {phased}: phases.json was damaged" in err
    rebuilt = json.loads((dirs[garbled] / "run.json").read_text())
    assert rebuilt["caller"] == "alice" and rebuilt["rebuilt"]["lost"][0] == "args"
