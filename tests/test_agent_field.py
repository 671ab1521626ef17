"""agent() in the field: start order within a run, waiting for budget shown as its own
state, a CLI binary that vanished, an agent killed before its model answered, live usage
while an agent runs, and a full disk in the middle of a run (a real tmpfs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from swarmbase import config
from swarmbase.mcpl import tools

from .conftest import CLAUDE, Env, agent_json, engine_daemon, fake_daemon, result_of, run_to_end, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic


async def test_agents_of_a_parallel_start_in_call_order(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=2)
    run = await run_to_end(env, "return await parallel(Array.from({length: 8}, (_, i) => () => "
                                "agent('sleep:0.2 ' + i)))", timeout=60)
    assert run.status == "completed", run.error
    starts = [agent_json(env, run, n)["startedAt"] for n in range(1, 9)]
    assert starts == sorted(starts)


async def test_waiting_for_budget_is_its_own_state(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=4)
    run = await run_to_end(env, "return await parallel([0, 1, 2].map((i) => () => agent('sleep:0.5 ' + i, "
                                "{maxUsd: 0.5})))", budgetUsd=1, timeout=60)
    assert run.status == "completed", run.error
    states = [[h["state"] for h in agent_json(env, run, n)["history"]] for n in (1, 2, 3)]
    assert states[0] == ["queued", "running", "done"] and states[1] == ["queued", "running", "done"]
    assert states[2] == ["queued", "waiting-budget", "queued", "running", "done"]


async def test_a_vanished_cli_makes_agent_null_at_no_cost(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    (tmp_path / "bin" / "claude").unlink()
    run = await run_to_end(env, "return [await agent('noop'), await agent('noop', {detail: true})]", timeout=30)
    assert run.status == "completed", run.error
    first, detail = result_of(env, run)
    assert first is None and detail["ok"] is False
    assert "could not start the claude CLI" in detail["error"] and "missing" in detail["error"]
    a = agent_json(env, run, 1)
    assert a["costUsd"] == 0 and a["estimated"] is False and run.spent_usd == 0


async def test_killed_before_any_response_costs_nothing(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, "return await agent('sleep:30', { timeoutMs: 1000 })", timeout=30)
    a = agent_json(env, run, 1)
    assert a["state"] == "failed" and "timed out after 1000 ms" in a["error"]
    assert a["costUsd"] == 0 and a["estimated"] is False


async def test_running_agents_show_live_tokens_and_estimated_cost(tmp_path: Path, nursery: trio.Nursery,
                                                                  claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    env = await engine_daemon(tmp_path, nursery, key="sk-ant-live-0123456789",
                              engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}})
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": "return await agent('[[slow:1]]')"})
    seen = None
    with trio.fail_after(60):
        while seen is None:
            st = tools.call(sup, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": run.id}})
            rows = [a for p in st["structuredContent"]["phases"] for a in p["agents"]]
            if rows and rows[0]["state"] == "running" and rows[0]["tokens"] > 0:
                seen = rows[0]
            await trio.sleep(0.1)
        await sup.live[run.id].finished.wait() if run.id in sup.live else None
    assert seen["estimated"] is True and seen["costUsd"] > 0 and seen["tokens"] >= 1000
    assert st["structuredContent"]["reservedUsd"] > 0
    final = agent_json(env, run, 1)
    assert final["estimated"] is False and final["tokens"]["total"] == 1050


def fill(mount: Path, leave: int) -> Path:
    """Fill the disk so that about `leave` bytes stay free."""
    filler = mount / "filler"
    filler.unlink(missing_ok=True)
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


@pytest.mark.timeout(120)
async def test_a_full_disk_fails_the_run_not_the_daemon(small_disk: Path, nursery: trio.Nursery) -> None:
    state = small_disk / "state"
    path, tokens = write_config(state)
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    sup = env.services.supervisor
    ok = await run_to_end(env, "return 'small'")
    assert ok.status == "completed"
    filler = fill(small_disk, 40_000)
    big = await run_to_end(env, "return 'x'.repeat(300000)", timeout=60)
    assert big.status == "failed" and "the disk is full" in big.error, big.error
    assert "result.json" in big.error
    # The daemon keeps serving: status of every run, and a clear refusal to start another.
    st = tools.call(sup, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": big.id}})
    assert st["structuredContent"]["status"] == "failed"
    assert any(n["eventId"] == f"{big.id}:end" for n in env.services.outbox.pending("alice"))
    fill(small_disk, 0)
    refused = tools.call(sup, env.cfg.caller("alice"), {"name": "run", "arguments": {"script": "return 1"}})
    assert refused["isError"] and "disk is full" in refused["content"][0]["text"]
    # Space returns: new runs work, and the failed run's record is written after all.
    filler.unlink()
    again = await run_to_end(env, "return 'back'")
    assert again.status == "completed"
    with trio.fail_after(30):
        while big.id in sup.unsaved:
            await trio.sleep(0.2)
    import json
    assert json.loads((sup.env.store.dir(big) / "run.json").read_text())["status"] == "failed"
    assert env.services.outbox.persisted
