"""The daemon's side of the script language (issue 21) with the fast fake CLI: the token
target, the default cap that fits perRunConcurrency, declared phases and their models,
opts.phase, the Workflow call shape on the `run` tool, meta refused before a run starts,
and the run's repository. What the peer can check is in test_conformance.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import trio

from swarmbase.mcpl import tools

from .conftest import agent_json, dumps, fake_daemon, result_of, run_to_end


def call(env: Any, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return tools.call(env.services.supervisor, env.cfg.caller("alice"), {"name": name, "arguments": arguments})


async def finished(env: Any, run_id: str) -> Any:
    sup = env.services.supervisor
    with trio.fail_after(60):
        if run_id in sup.live:
            await sup.live[run_id].finished.wait()
    return sup.runs[run_id]


async def test_token_target_is_budget_total_and_stops_agents(tmp_path: Path, nursery: trio.Nursery) -> None:
    # Each fake agent reports 10 output tokens; the target is checked before each dispatch.
    env = await fake_daemon(tmp_path, nursery)
    script = """
const seen = [];
for (let i = 0; i < 5; i++) {
  try { await agent('noop ' + i); seen.push(budget.spent()); } catch (e) { seen.push(e.name); break; }
}
const inside = await bounded(1, [1], () => parallel([() => 1])).catch((e) => e.name);
let par; try { par = await parallel([() => agent('noop x')]); } catch (e) { par = e.message; }
return { total: budget.total, seen, remaining: budget.remaining(), par, inside };"""
    run = await run_to_end(env, script, tokenTarget=25)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert res["total"] == 25 and res["remaining"] == 0
    assert res["seen"] == [10, 20, 30, "WorkflowBudgetExceededError"]
    assert res["par"] == "agent(): the run's token target is spent (30 of 25 output tokens; the run's tokenTarget lifts it)"
    assert res["inside"] == "WorkflowBudgetExceededError"
    assert run.agents_total == 3 and run.token_target == 25
    without = await run_to_end(env, "return [budget.total, budget.remaining() === Infinity]")
    assert result_of(env, without) == [None, True]


async def test_the_default_cap_lets_perRunConcurrency_agents_run_at_once(tmp_path: Path, nursery: trio.Nursery) -> None:
    # The old default (max($0.50, budget/8)) held 8 at once on a $5 budget whatever the slots.
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=16, maxConcurrentAgents=16)
    gate = tmp_path / "gate"
    gate.write_text("")
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": f"return (await parallel(Array.from({{length: 16}}, () => "
                                                        f"() => agent('waitfile:{gate}')))).length", "budgetUsd": 5})
    live = sup.live[run.id]
    with trio.fail_after(90):
        while live.running < 16:
            await trio.sleep(0.05)
    assert live.usd.ledger.reserved == 5.0           # 16 × $5/16, all held at once
    gate.unlink()
    run = await finished(env, run.id)
    assert run.status == "completed" and result_of(env, run) == 16
    assert json.loads((sup.env.store.dir(run) / "agents" / "1" / "opts.json").read_text())["resolved"]["maxUsd"] is None
    assert agent_json(env, run, 1)["costUsd"] == 0.01


async def test_declared_phases_are_lanes_and_give_their_model(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    script = """export const meta = { name: 'lanes', description: 'declared',
  phases: [{ title: 'Scan', detail: 'look around', model: 'haiku' }, { title: 'Fix' }, { title: 'Unused' }] };
phase('Scan');
await agent('dump in scan', { label: 'a' });
await parallel([() => agent('dump fix', { label: 'b', phase: 'Fix' }), () => agent('dump own', { label: 'c', model: 'opus' })]);
await agent('dump elsewhere', { label: 'd', phase: 'Later' });
phase('Fix');
phase('Scan');
return 1;"""
    run = await run_to_end(env, script, keepWork=True)
    assert run.status == "completed", run.error
    assert run.meta == {"name": "lanes", "description": "declared",
                        "phases": [{"title": "Scan", "detail": "look around", "model": "haiku"}, {"title": "Fix"},
                                   {"title": "Unused"}]}
    st = call(env, "status", {"runId": run.id})["structuredContent"]
    lanes = {p["title"]: sorted(a["label"] for a in p["agents"]) for p in st["phases"]}
    # One group per title, in declared order first; phase('Scan') again goes back to it.
    assert list(lanes) == ["Scan", "Fix", "Unused", "Later"]
    assert lanes == {"Scan": ["a", "c"], "Fix": ["b"], "Unused": [], "Later": ["d"]}
    models = {d["prompt"]: d["argv"][d["argv"].index("--model") + 1] if "--model" in d["argv"] else None
              for d in dumps(env, run)}
    # A declared phase's model is the default of its agents; opts.model wins; 'Fix' names none.
    assert models == {"dump in scan": "haiku", "dump fix": None, "dump own": "opus", "dump elsewhere": None}


async def test_the_run_tool_takes_the_workflow_call_shape(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    roots = tmp_path / "roots"
    (roots / "flows").mkdir()
    script_file = roots / "flows" / "one.js"
    script_file.write_text("export const meta = { name: 'from-file', description: 'a file' }\n"
                           "return { args, got: await agent('noop') };")
    saved = call(env, "save_workflow", {"name": "saved", "script": "return 'saved ' + args.x"})
    assert not saved.get("isError")
    by_path = call(env, "run", {"scriptPath": str(script_file), "args": {"x": 1}, "title": "T", "description": "D"})
    by_name = call(env, "run", {"name": "saved", "args": {"x": 2}})
    first = await finished(env, by_path["structuredContent"]["runId"])
    second = await finished(env, by_name["structuredContent"]["runId"])
    assert result_of(env, first) == {"args": {"x": 1}, "got": "noop"} and result_of(env, second) == "saved 2"
    assert first.label == "T" and first.description == "D" and first.meta["name"] == "from-file"
    listed = call(env, "list", {})["structuredContent"]["runs"]
    assert {r["label"] for r in listed} >= {"T"} and any(r["description"] == "D" for r in listed)
    # resumeFromRunId with an edited script: the unchanged agent() call replays.
    resumed = call(env, "run", {"resumeFromRunId": first.id, "args": {"x": 1},
                                "script": "return { edited: true, got: await agent('noop') };"})
    assert resumed["structuredContent"]["resumedFrom"] == first.id
    third = await finished(env, resumed["structuredContent"]["runId"])
    assert result_of(env, third) == {"edited": True, "got": "noop"}
    assert agent_json(env, third, 1)["replayed"] is True and third.resumed_from == first.id
    refused = [call(env, "run", a) for a in ({"name": "nope"}, {"scriptPath": "/etc/hostname"},
                                             {"script": "const n = 'x';\nexport const meta = { name: n }"},
                                             {"script": "export const meta = { name: n, description: 'd' }"})]
    texts = [r["content"][0]["text"] for r in refused]
    assert all(r["isError"] for r in refused)
    assert "no workflow named 'nope' in the saved workflows (this run has no project). Available: saved" \
        in texts[0]
    assert "is not inside this caller's cwdRoots" in texts[1]
    assert "must be the FIRST statement" in texts[2] and "meta must be a pure literal" in texts[3]
    bad_save = call(env, "save_workflow", {"name": "bad", "script": "export const meta = { name: f() }"})
    assert bad_save["isError"] and "meta must be a pure literal" in bad_save["content"][0]["text"]
    listed_flows = call(env, "workflows", {})["structuredContent"]["workflows"]
    assert [w["name"] for w in listed_flows] == ["saved"]


async def test_a_run_names_its_repository_once(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    repo = tmp_path / "roots" / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "f.txt").write_text("x\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"], cwd=repo, check=True)
    script = "return await agent('dump here', { isolation: 'worktree', detail: true });"
    run = await run_to_end(env, script, repository=str(repo), profile="write")
    assert run.status == "completed", run.error
    rec = result_of(env, run)
    assert rec["ok"] and rec["worktree"]["branch"] == f"swarmbase/{run.id}/1"
    plain = await run_to_end(env, "return await agent('dump plain');", repository=str(repo), keepWork=True)
    assert result_of(env, plain) == "dumped"
    assert json.loads((env.services.store.dir(plain) / "agents" / "1" / "opts.json").read_text())[
        "resolved"]["cwd"] == str(repo.resolve())
    outside = call(env, "run", {"script": "return 1", "repository": "/etc"})
    assert outside["isError"] and "project '/etc' is not inside this caller's cwdRoots" in outside["content"][0]["text"]
