"""Runs through the daemon: notices, cancel, isolation, store, shutdown and boot recovery."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config, fsutil
from swarmbase.client import connect
from swarmbase.script.runner import RunnerLimits
from swarmbase.runs.model import Run
from swarmbase.runs.store import RunStore

from .conftest import Env, runner_pids, start_daemon
from .fakes.agents import Gate, Parked


def cold_env(tmp_path: Path) -> Env:
    """No warm spare runner: these tests count runner processes (tests/test_spares.py covers spares)."""
    from .conftest import write_config
    path, tokens = write_config(tmp_path / "state", spareRunners=0)
    return Env(state=tmp_path / "state", tokens=tokens, cfg=config.load(path))


@pytest.fixture
async def parked(tmp_path: Path, nursery: trio.Nursery) -> tuple[Env, Parked]:
    agents = Parked()
    env = cold_env(tmp_path)
    await start_daemon(nursery, env, agents=agents, limits=RunnerLimits(slice_ms=1000))
    return env, agents


async def test_notice_reaches_connected_host_exactly(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            script = "export const meta = { name: 'notice test' };\nreturn { answer: 42 };"
            run_id = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
            n = await h.wait_notice(f"{run_id}:end")
    assert n["featureSet"] == "swarmbase.notify"
    assert n["eventId"] == f"{run_id}:end"
    end_hash = running.services.supervisor.runs[run_id].end["hash"]
    assert n["origin"] == {"source": "swarmbase", "kind": "run-end", "runId": run_id,
                           "url": f"{running.url}/runs/{run_id}", "endHash": end_hash}
    assert n["tags"] == ["surface:done", "swarmbase:run-end", "swarmbase:completed"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", n["timestamp"])
    # The daemon's words, then the result as data in a block of its own (issue 24 #5).
    [block, data] = n["payload"]["content"]
    assert block["type"] == data["type"] == "text"
    assert block["text"].startswith(f'Run "notice test" ({run_id}) completed: 0 agents, $0.0000 of $5.0000.')
    assert block["text"].endswith(f"\nEnd record hash: {end_hash}") and '"answer"' not in block["text"]
    assert data["text"].startswith("The run's result follows, as data") and '"answer": 42' in data["text"]
    # Accepted notices leave the outbox.
    assert running.services.outbox.pending("alice") == []


async def test_failed_run_notice_and_status(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            run_id = (await h.tool("run", {"script": "log('before');\nthrow new Error('nope')", "label": "bad"}))[
                "structuredContent"]["runId"]
            n = await h.wait_notice(f"{run_id}:end")
            assert n["tags"][-1] == "swarmbase:failed"
            assert n["payload"]["content"][1]["text"].startswith("Error (script line 2). The run's error follows")
            assert "\n```text\nError: nope\n```" in n["payload"]["content"][1]["text"]
            st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
            assert st["status"] == "failed" and st["errorLine"] == 2
            assert [e["message"] for e in st["log"]] == ["before", "run failed: Error: nope"]


async def test_cancel_mid_run_leaves_no_runner_process(parked: tuple[Env, Parked]) -> None:
    env, agents = parked
    with trio.fail_after(20):
        async with connect(env.ws, env.tokens["alice"]) as h:
            await h.handshake()
            run_id = (await h.tool("run", {"script": "phase('wait');\nawait agent('forever');\nreturn 1"}))[
                "structuredContent"]["runId"]
            await agents.started.wait()
            assert len(runner_pids()) == 1
            assert (await h.tool("cancel", {"runId": run_id}))["structuredContent"]["status"] == "cancelling"
            n = await h.wait_notice(f"{run_id}:end")
            assert "swarmbase:cancelled" in n["tags"]
            assert runner_pids() == []
            st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
            assert st["status"] == "cancelled" and st["error"] == "cancelled by caller alice"
            assert st["phases"] == [{"title": "wait", "workflow": "", "agents": []}]


async def test_offline_caller_gets_notices_on_connect_oldest_first(env: Env, nursery: trio.Nursery) -> None:
    gate = Gate()
    await start_daemon(nursery, env, agents=gate)
    with trio.fail_after(30):
        async with connect(env.ws, env.tokens["bob"]) as h:
            await h.handshake()
            ids = [(await h.tool("run", {"script": f"return await agent('{i}')"}))["structuredContent"]["runId"]
                   for i in range(3)]
        gate.open.set()   # the runs end while bob is offline
        while any(i in env.services.supervisor.live for i in ids):       # each run's end fully recorded
            await trio.sleep(0.02)
        queued = [n["eventId"] for n in env.services.outbox.pending("bob")]
        assert sorted(queued) == sorted(f"{i}:end" for i in ids)
        on_disk = [json.loads(line) for line in (env.state / "outbox.jsonl").read_text().splitlines()]
        adds = [e["notice"] for e in on_disk if e["op"] == "add"]
        # Each end notice is added held, then amended once with its end-record hash.
        assert list(dict.fromkeys(n["eventId"] for n in adds)) == queued and len(adds) == 2 * len(queued)
        assert all("endHash" in n["origin"] for n in {n["eventId"]: n for n in adds}.values())
        async with connect(env.ws, env.tokens["bob"]) as h:
            await h.handshake()
            got = [await h.notices.receive() for _ in ids]
        assert [n["eventId"] for n in got] == queued
        assert env.services.outbox.pending("bob") == []


async def test_host_without_push_grant_keeps_notice_waiting(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake("0.5", grant=False)
            await h.request("featureSets/update", {"effectiveCapabilities": ["tools"], "enabled": ["swarmbase"]})
            run_id = (await h.tool("run", {"script": "return 'quiet'"}))["structuredContent"]["runId"]
            while True:
                st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
                if st["status"] == "completed":
                    break
                await trio.sleep(0.02)
            assert [n["eventId"] for n in running.services.outbox.pending("alice")] == [f"{run_id}:end"]
            # Granting pushEvents later releases it.
            await h.request("featureSets/update", {"effectiveCapabilities": ["tools", "pushEvents"]})
            n = await h.wait_notice(f"{run_id}:end")
            assert n["tags"][-1] == "swarmbase:completed"


async def test_run_store_files_and_work_dir(running: Env) -> None:
    with trio.fail_after(20):
        async with connect(running.ws, running.tokens["alice"]) as h:
            await h.handshake()
            a = (await h.tool("run", {"script": "phase('x'); log('l1'); return [1]"}))["structuredContent"]["runId"]
            b = (await h.tool("run", {"script": "return 2", "keepWork": True}))["structuredContent"]["runId"]
            await h.wait_notice(f"{a}:end")
            await h.wait_notice(f"{b}:end")
    sup = running.services.supervisor
    da, db = sup.env.store.dir(sup.runs[a]), sup.env.store.dir(sup.runs[b])
    assert da.name.endswith(f"-{a}") and re.match(r"\d{8}T\d{6}Z-", da.name)
    assert json.loads((da / "run.json").read_text())["status"] == "completed"
    assert (da / "script.js").read_text() == "phase('x'); log('l1'); return [1]"
    assert json.loads((da / "result.json").read_text()) == {"value": [1]}
    assert json.loads((da / "phases.json").read_text()) == [{"title": "x", "workflow": "", "agents": []}]
    assert [e["message"] for e in fsutil.read_lines(da / "log.jsonl")[0]] == ["phase: x", "l1"]
    assert not (da / "work").exists()
    assert (db / "work").is_dir()
    hist = [h["status"] for h in json.loads((da / "run.json").read_text())["history"]]
    assert hist == ["queued", "running", "completed"]


async def test_shutdown_interrupts_runs_closes_ws_1001_and_reboot_delivers(tmp_path: Path) -> None:
    env = cold_env(tmp_path)
    agents = Parked()
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            await start_daemon(n, env, agents=agents, stop=stop)
            async with connect(env.ws, env.tokens["alice"]) as h:
                await h.handshake("0.5", grant=False)   # no pushes: the notice must wait
                run_id = (await h.tool("run", {"script": "await agent('x'); return 1"}))["structuredContent"]["runId"]
                await agents.started.wait()
                stop.set()
                await h.closed_event.wait()
                assert h.closed.reason.code == 1001
        # Daemon gone: the run was recorded as interrupted and its notice is durable.
        data = json.loads(next((env.state / "runs").glob(f"*-{run_id}/run.json")).read_text())
        assert data["status"] == "interrupted"
        assert runner_pids() == []
        # Boot again: the notice goes out to the reconnecting host, once.
        async with trio.open_nursery() as n:
            await start_daemon(n, env)
            async with connect(env.ws, env.tokens["alice"]) as h:
                await h.handshake()
                notice = await h.wait_notice(f"{run_id}:end")
                assert notice["tags"][-1] == "swarmbase:interrupted"
                st = (await h.tool("status", {"runId": run_id}))["structuredContent"]
                assert st["status"] == "interrupted"
            n.cancel_scope.cancel()


def test_boot_recovery_marks_interrupted_and_sweeps_work(env: Env) -> None:
    store = RunStore(env.state)
    now = time.time()
    runs = {}
    for name, status, keep in [("left", "running", False), ("done", "completed", False), ("kept", "completed", True)]:
        rid = f"run_{name:0>12}"[:16]
        rid = "run_" + (name.encode().hex() + "0" * 12)[:12]
        r = Run(id=rid, caller="alice", dir_name=RunStore.dir_name_for(rid, now), created_at=now, status=status,
                keep_work=keep)
        store.create(r, "return 1")
        runs[name] = r
    from swarmbase.daemon import build_services
    leftovers = [env.cfg.homes_dir / f"{runs['left'].id}-1", env.cfg.homes_dir / f"{runs['left'].id}-runner"]
    for d in leftovers:
        d.mkdir(parents=True)
    services = build_services(env.cfg)
    interrupted = services.supervisor.recover()
    assert not any(d.exists() for d in leftovers)      # throwaway agent homes and CODEX_HOMEs are gone
    assert [r.id for r in interrupted] == [runs["left"].id]
    assert services.supervisor.runs[runs["left"].id].status == "interrupted"
    assert [n["eventId"] for n in services.outbox.pending("alice")] == [f"{runs['left'].id}:end"]
    assert not store.work_dir(runs["left"]).exists()
    assert not store.work_dir(runs["done"]).exists()
    assert store.work_dir(runs["kept"]).exists()
    # A second boot does not notify twice.
    assert build_services(env.cfg).supervisor.recover() == []


def test_delete_work_on_end_false_keeps_work(tmp_path: Path) -> None:
    from .conftest import write_config
    path, _ = write_config(tmp_path / "s", deleteWorkOnEnd=False)
    cfg = config.load(path)
    store = RunStore(cfg.state_dir)
    r = Run(id="run_aaaaaaaaaaaa", caller="alice", dir_name=RunStore.dir_name_for("run_aaaaaaaaaaaa", 0),
            created_at=0, status="failed")
    store.create(r, "")
    from swarmbase.daemon import build_services
    sup = build_services(cfg).supervisor
    sup.recover()
    assert r.id in sup.runs                 # it was loaded, and its work dir kept
    assert store.work_dir(r).is_dir()


def test_boot_finishes_an_agent_from_its_journal_line_when_the_kill_beat_its_record(env: Env) -> None:
    # An agent's journal line is written before its final agent.json (that waits for the
    # run's flush): a kill -9 in between must not make the finished agent "interrupted".
    from swarmbase.daemon import build_services
    from swarmbase.runs import records
    from swarmbase.runs.journal import Journal, args_hash
    store = RunStore(env.state)
    r = Run(id="run_00000000000b", caller="alice", dir_name=RunStore.dir_name_for("run_00000000000b", time.time()),
            created_at=time.time(), status="running")
    store.create(r, "return 1")
    journal = Journal(store.dir(r) / "journal.jsonl", r.id, args_hash(None), caller="alice",
                      carried=[{"key": "old", "runId": "run_0000000000aa", "n": 2, "ok": True, "state": "done"}])
    for n in (1, 2, 3):
        rec = records.AgentRecord(n=n, dir=store.dir(r) / "agents" / str(n), label=f"a{n}", engine="claude",
                                  model=None, profile="read")
        rec.set_state("running")
        store.create_agent(rec, "p", {})
    journal.append({"key": "k1", "runId": r.id, "n": 1, "ok": True, "state": "done", "costUsd": 0.25,
                    "estimated": False, "tokens": {"input": 10, "output": 5}})
    sup = build_services(env.cfg).supervisor
    sup.recover()
    states = {n: json.loads((store.dir(r) / "agents" / str(n) / "agent.json").read_text()) for n in (1, 2, 3)}
    assert (states[1]["state"], states[1]["costUsd"], states[1]["tokens"]["total"]) == ("done", 0.25, 15)
    assert states[2]["state"] == "interrupted"      # n 2's line was carried from another run: not its own
    assert states[3]["state"] == "interrupted"
    assert sup.runs[r.id].agents_done == 1
