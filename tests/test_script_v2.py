"""Script language v2 with real agents (the real Claude Code CLI against the fake API):
race, waitN, bounded, detail records, schema nudges, nested workflows under budget slices,
the depth cap, resume of a killed tree, the budget warning, model allowlists."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import connect
from swarmbase.mcpl import tools

from .conftest import (CLAUDE, Env, agent_json, descendants, engine_daemon, process_table, result_of, run_to_end,
                       start_cli_daemon, write_config)
from .fakes.anthropic_api import FakeAnthropic

KEY = "sk-ant-v2-0123456789abcdef"


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


async def v2_daemon(tmp_path: Path, nursery: trio.Nursery, api: FakeAnthropic, caller_extra: dict | None = None,
                    **extra: Any) -> Env:
    extra.setdefault("perRunConcurrency", 8)
    return await engine_daemon(tmp_path, nursery, key=KEY, engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                               caller_extra={"maxProfile": "write", **(caller_extra or {})}, **extra)


def claude_processes() -> list[int]:
    table = process_table()
    return [p for p in descendants(os.getpid()) if str(CLAUDE.resolve()).encode() in table.get(p, (0, "", b""))[2]
            or b"claude.exe" in table.get(p, (0, "", b""))[2][:200]]


async def test_race_returns_the_first_and_kills_the_slow_one(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                             api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    started = trio.current_time()
    run = await run_to_end(env, "return await race([() => agent('[[sleep:30]] slow', {label: 'slow'}), "
                                "() => agent('[[sleep:1]] fast', {label: 'fast'})])", timeout=25)
    assert run.status == "completed", run.error
    assert result_of(env, run).startswith("echo:") and "fast" in result_of(env, run)
    assert trio.current_time() - started < 25            # it did not wait for the slow one
    slow = agent_json(env, run, 1)
    assert slow["state"] == "cancelled" and "lost the race" in slow["error"]
    assert agent_json(env, run, 2)["state"] == "done"
    assert claude_processes() == []                      # the slow agent's process is gone


async def test_waitn_two_of_five_in_completion_order(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                     api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    script = ("return await waitN(2, [3, 30, 0.5, 30, 30].map((s, i) => () => agent('[[sleep:' + s + ']] n' + i)))")
    run = await run_to_end(env, script, timeout=40)
    assert run.status == "completed", run.error
    first, second = result_of(env, run)
    assert "n2" in first and "n0" in second
    states = [agent_json(env, run, n)["state"] for n in range(1, 6)]
    assert states == ["done", "cancelled", "done", "cancelled", "cancelled"]
    failing = await run_to_end(env, "try { return await waitN(2, [() => agent('[[500]] a'), () => agent('[[500]] b'), "
                                    "() => agent('ok')]); } catch (e) { return e.message; }", timeout=60)
    assert "1" in result_of(env, failing) and "2" in result_of(env, failing)


async def test_bounded_keeps_at_most_three_in_flight(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                     api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api, perRunConcurrency=10, maxConcurrentAgents=10)
    run = await run_to_end(env, "return await bounded(3, Array.from({length: 20}, (_, i) => i), "
                                "(x, i) => agent('[[slow:0.2]] item ' + x))", timeout=240)
    assert run.status == "completed", run.error
    assert result_of(env, run) == ["slowly done"] * 20
    assert api.max_live <= 3 and api.max_live >= 2


async def test_detail_record_and_schema_nudges(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                               api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    schema = json.dumps({"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]})
    script = f"""
const failed = await agent('[[500]]', {{ detail: true }});
const nudged = await agent('rate [[badonce:{{"score": 4}}]]', {{ schema: {schema}, detail: true, schemaRetries: 1 }});
const stubborn = await agent('rate [[textonly]]', {{ schema: {schema}, detail: true, schemaRetries: 2 }});
return {{ failed, nudged, stubborn }};"""
    run = await run_to_end(env, script, timeout=180)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    f = res["failed"]
    assert f["ok"] is False and f["value"] is None and "HTTP 500" in f["error"] and f["n"] == 1 and f["replayed"] is False
    n = res["nudged"]
    assert n["ok"] is True and n["value"] == {"score": 4} and n["schemaError"] is None
    rec = agent_json(env, run, 2)
    assert [h.get("schemaRetry") for h in rec["history"] if "schemaRetry" in h] == [1]
    transcript = (env.services.store.dir(run) / "agents" / "2" / "transcript.jsonl").read_text()
    assert '"subtype":"schema-nudge"' in transcript
    s = res["stubborn"]
    assert s["ok"] is False and s["schemaError"] and "structured output" in s["schemaError"]
    assert [h.get("schemaRetry") for h in agent_json(env, run, 3)["history"] if "schemaRetry" in h] == [1, 2]
    assert s["costUsd"] > 0                       # three turns, all paid


TREE = """
const r = await parallel([
  () => workflow("return await agent('[[usage:10000,100]] left')", null, { label: 'left', budgetUsd: 1 }),
  () => workflow(`
      phase('middle work');
      try {
        return await workflow("for (let i = 0; i < 20; i++) await agent('[[usage:100000,2000]] deep ' + i, { maxUsd: 0.5 }); return 'never'",
                              null, { label: 'deep', budgetUsd: 1 });
      } catch (e) { return 'middle ran out: ' + e.message; }`, null, { label: 'middle', budgetUsd: 2 }),
  () => workflow("return await agent('[[usage:10000,100]] right')", null, { label: 'right', budgetUsd: 1 }),
]);
return { r, budget: { spent: budget.usd.spent, reserved: budget.usd.reserved } };"""


async def test_workflow_tree_under_budget_slices(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                 api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    run = await run_to_end(env, TREE, budgetUsd=5, timeout=180)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    left, middle, right = res["r"]
    assert left == "counted" and right == "counted"
    assert middle.startswith("middle ran out: workflow deep (2/1) failed") and "budget is spent" in middle
    rows = [agent_json(env, run, n) for n in range(1, run.agents_total + 1)]
    deep = [r for r in rows if r["workflow"] == "2/1"]
    assert len(deep) >= 2 and sum(r["costUsd"] for r in deep) <= 1.0 + 0.44   # the slice, plus one turn
    assert sum(r["costUsd"] for r in rows) == pytest.approx(run.spent_usd)
    assert res["budget"]["reserved"] == 0 and res["budget"]["spent"] == pytest.approx(run.spent_usd)
    st = tools.call(env.services.supervisor, env.cfg.caller("alice"),
                    {"name": "status", "arguments": {"runId": run.id}})["structuredContent"]
    paths = {p["workflow"] for p in st["phases"]}
    assert {"1", "2", "2/1", "3"} <= paths
    assert any(p["title"] == "middle work" and p["workflow"] == "2" for p in st["phases"])


async def test_depth_and_count_caps(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                    api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api, maxWorkflowDepth=1, maxWorkflowsPerRun=3)
    run = await run_to_end(env, """
const out = {};
out.nested = await workflow("try { return await workflow('return 1'); } catch (e) { return e.message; }");
try { await workflow({ name: 'nope' }); } catch (e) { out.saved = e.message; }
for (let i = 0; i < 3; i++) { try { await workflow('return 2'); } catch (e) { out.count = e.message; } }
return out;""", timeout=60)
    res = result_of(env, run)
    assert "depth 2" in res["nested"] and "maxWorkflowDepth" in res["nested"]
    assert "cap of 3 workflows (maxWorkflowsPerRun in the daemon config lifts it)" in res["count"]
    assert ("workflow('nope'): no workflow with that name. Available: (none) (looked in the saved workflows "
            "(this run has no project))") in res["saved"]


async def test_saved_workflows_and_model_allowlist(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                   api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api, caller_extra={"models": {"claude": ["claude-haiku-*"]}})
    sup, alice = env.services.supervisor, env.cfg.caller("alice")
    text = "// Summarize args.text\nreturn await agent('sum ' + args.text)"
    saved = tools.call(sup, alice, {"name": "save_workflow", "arguments": {"name": "summarize", "script": text}})
    assert saved["structuredContent"] == {"name": "summarize", "saved": True}
    for d in (env.cfg.state_dir / "workflows", env.cfg.state_dir / "workflows" / "alice"):
        assert d.stat().st_mode & 0o777 == 0o700, d           # workflows/ names every caller: private too
    listed = tools.call(sup, alice, {"name": "workflows", "arguments": {}})["structuredContent"]["workflows"]
    assert listed == [{"name": "summarize", "chars": len(text), "firstLine": "// Summarize args.text",
                       "source": "saved"}]
    refused = tools.call(sup, alice, {"name": "run", "arguments": {"script": "return 1", "model": "claude-opus-5-5"}})
    assert refused["isError"] and "not allowed" in refused["content"][0]["text"]
    run = await run_to_end(env, """
const out = { used: await workflow({ name: 'summarize' }, { text: 'hello' }) };
try { await agent('x', { model: 'claude-opus-5-5' }); } catch (e) { out.refused = e.message; }
return out;""", model="claude-haiku-5-5", timeout=90)
    res = result_of(env, run)
    assert res["used"].startswith("echo: sum hello")
    assert "model 'claude-opus-5-5' is not allowed" in res["refused"] and "claude-haiku-*" in res["refused"]
    assert api.requests[-1]["body"]["model"] == "claude-haiku-5-5"


async def test_a_second_resume_is_refused_while_the_first_is_live(tmp_path: Path, nursery: trio.Nursery,
                                                                  claude_bin: str, api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    sup, alice = env.services.supervisor, env.cfg.caller("alice")
    old = await run_to_end(env, "throw new Error('again')", timeout=60)
    assert old.status == "failed"
    first = tools.call(sup, alice, {"name": "resume", "arguments": {"runId": old.id}})
    second = tools.call(sup, alice, {"name": "resume", "arguments": {"runId": old.id}})
    new_id = first["structuredContent"]["runId"]
    assert not first.get("isError") and second["isError"], second
    assert f"already being resumed as {new_id}" in second["content"][0]["text"]
    assert [r.id for r in sup.runs_of("alice") if r.resumed_from == old.id] == [new_id]


async def test_budget_warning_goes_out_exactly_once(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                    api: FakeAnthropic) -> None:
    env = await v2_daemon(tmp_path, nursery, api)
    script = "for (let i = 0; i < 4; i++) await agent('[[usage:100000,2000]] ' + i, { maxUsd: 0.5 }); return 1"
    run = await run_to_end(env, script, budgetUsd=2, budgetWarnAt=0.6, timeout=120)
    assert run.status == "completed", run.error
    warnings = [n for n in env.services.outbox.pending("alice") if n["eventId"] == f"{run.id}:budget-warning"]
    assert len(warnings) == 1 and warnings[0]["tags"] == ["swarmbase:budget-warning"]
    assert "of its $2.0000 budget" in warnings[0]["payload"]["content"][0]["text"]
    log = [e["message"] for e in env.services.supervisor.recent_log(run, 50)]
    assert sum("budget warning" in m for m in log) == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_kill_9_during_a_nested_tree_then_resume_replays_every_level(tmp_path: Path, nursery: trio.Nursery,
                                                                           claude_bin: str, api: FakeAnthropic) -> None:
    state = tmp_path / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text(KEY)
    key.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                                caller_extra={"apiKeyFile": str(key), "maxProfile": "write"})
    script = """
const inner = "return await parallel([0, 1].map((i) => () => agent('leaf ' + args.tag + ' ' + i)))";
const mid = "return [await agent('mid ' + args.tag), await workflow(args.inner, { tag: args.tag })]";
const tree = await parallel(['a', 'b'].map((t) => () => workflow(mid, { tag: t, inner })));
return { tree, last: await agent('[[gate]] last') };"""
    with trio.fail_after(200):
        proc, ws = await start_cli_daemon(path)
        try:
            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
            while not any("last" in r["prompt"] for r in api.requests):
                await trio.sleep(0.05)
        finally:
            proc.kill()
            await proc.wait()
        before = len(api.requests)
        assert before == 7                         # 6 finished agents at three levels, and the gated one
        api.gate.set()
        proc, ws = await start_cli_daemon(path)
        try:
            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                new = (await h.tool("resume", {"runId": rid}))["structuredContent"]["runId"]
                await h.wait_notice(f"{new}:end")
                res = json.loads((await h.tool("result", {"runId": new}))["structuredContent"]["text"])
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    assert [r["prompt"] for r in api.requests[before:]] == ["[[gate]] last"]     # nothing else ran again
    assert res["last"].startswith("echo:") and len(res["tree"]) == 2
    run_dir = next((state / "runs").glob(f"*-{new}"))
    records = [json.loads(p.read_text()) for p in run_dir.glob("agents/*/agent.json")]
    assert sorted(r["replayed"] for r in records) == [False] + [True] * 6
    assert {r["workflow"] for r in records if r["replayed"]} == {"1", "1/1", "2", "2/1"}
