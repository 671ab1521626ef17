"""A project's agent types (issue 28 item 2): `agentType` names the project's
`.claude/agents/<name>.md` before the built-in types, as in Claude Code. The real Claude Code
CLI against the fake model API, whose recorded requests show what the agent was really given:
the file's body as its system prompt, the file's model, exactly the file's tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from .conftest import Env, agent_json, result_of, run_to_end
from .fakes.anthropic_api import FakeAnthropic
from .project_daemon import make_project, project_daemon, said

EXECUTOR = """---
name: executor
description: Carries out one step of a plan
tools: Read, Bash
model: sonnet
color: green
---
You are the EXECUTOR-BODY-7731 agent. Do the step, then report.
"""
REVIEWER = """---
name: reviewer
description: Reviews a change
tools:
  - Read
  - Grep
---
You are the REVIEWER-BODY-4410 agent.
"""
THINKER = """---
name: thinker
description: Answers from what it is told
tools: []
---
You are the THINKER-BODY-2208 agent.
"""
BROKEN = """---
name: broken
description: no end to its front matter
"""


def add_agents(project: Path, files: dict[str, str]) -> None:
    folder = project / ".claude" / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.md").write_text(text)


def request_for(api: FakeAnthropic, marker: str) -> dict[str, Any]:
    """The agent's first model request (its prompt carries `marker`)."""
    found = [r["body"] for r in api.requests if marker in r["prompt"]]
    assert found, f"no request with {marker!r} among {[r['prompt'][:60] for r in api.requests]}"
    return found[0]


def system_text(body: dict[str, Any]) -> str:
    system = body.get("system", "")
    return system if isinstance(system, str) else "\n".join(b.get("text", "") for b in system)


def tool_names(body: dict[str, Any]) -> set[str]:
    return {t["name"] for t in body.get("tools", [])}


def log_lines(env: Env, run: Any) -> list[str]:
    path = env.services.store.dir(run) / "log.jsonl"
    return [json.loads(ln)["message"] for ln in path.read_text().splitlines() if ln.strip()]


async def resumed(env: Env, run_id: str) -> Any:
    sup = env.services.supervisor
    run = sup.resume(env.cfg.caller("alice"), run_id, {})
    with trio.fail_after(240):
        await sup.live[run.id].finished.wait()
    return run


@pytest.mark.timeout(300)
async def test_a_project_agent_type_gives_its_body_model_and_tools(tmp_path: Path, nursery: trio.Nursery,
                                                                   claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    app = make_project(tmp_path / "roots" / "app", "the app")
    add_agents(app, {"executor": EXECUTOR, "reviewer": REVIEWER, "thinker": THINKER, "broken": BROKEN})
    env = await project_daemon(tmp_path, nursery, api.url, {"default": str(app)})
    # As a Claude Code script names them: agentType only, no profile.
    script = """
const done = await agent('[[bash:pwd && cat marker.txt]] exec-7731', { agentType: 'executor', label: 'exec' });
const review = await agent('[[text:looks right]] review-4410', { agentType: 'reviewer', label: 'review' });
const thought = await agent('[[text:thought so]] think-2208', { agentType: 'thinker' });
const broken = await agent('x', { agentType: 'broken' }).catch((e) => e.message);
const missing = await agent('x', { agentType: 'planner' }).catch((e) => e.message);
return { done, review, thought, broken, missing };"""
    run = await run_to_end(env, script, timeout=240)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert said(res["done"]) == [str(app), "the", "app"]        # in the project, with Bash
    assert res["review"] == "looks right" and res["thought"] == "thought so"
    assert ".claude/agents/broken.md:1: the front matter has no closing '---' line" in res["broken"]
    assert "agent type 'planner' not found. Available agents: executor, reviewer, thinker, general-purpose" in res["missing"]

    exec_body = request_for(api, "exec-7731")
    assert "EXECUTOR-BODY-7731" in system_text(exec_body)
    assert "returned verbatim as a string to the calling script" in system_text(exec_body)   # the note too
    assert exec_body["model"] == "claude-sonnet-5-5"                        # the file's `sonnet`
    assert {"Read", "Bash"} <= tool_names(exec_body) and not {"Edit", "Write", "Grep"} & tool_names(exec_body)
    review_body = request_for(api, "review-4410")
    assert "REVIEWER-BODY-4410" in system_text(review_body) and "EXECUTOR" not in system_text(review_body)
    assert {"Read", "Grep"} <= tool_names(review_body) and not {"Bash", "Edit", "Glob"} & tool_names(review_body)
    think_body = request_for(api, "think-2208")      # the daemon's own request: no CLI for a think agent
    assert "THINKER-BODY-2208" in system_text(think_body) and tool_names(think_body) == set()
    assert [agent_json(env, run, n)["profile"] for n in (1, 2, 3)] == ["write", "read", "think"]

    # Resumed as it is, the typed agents replay; an edited agent file makes its agents run again.
    asked = len(api.requests)
    again = await resumed(env, run.id)
    assert again.status == "completed", again.error
    assert len(api.requests) == asked
    add_agents(app, {"reviewer": REVIEWER.replace("REVIEWER-BODY-4410", "REVIEWER-BODY-EDITED")})
    edited = await resumed(env, again.id)
    assert edited.status == "completed", edited.error
    fresh = [r for r in api.requests[asked:] if "review-4410" in r["prompt"]]
    assert fresh and "REVIEWER-BODY-EDITED" in system_text(fresh[0]["body"])
    assert not [r for r in api.requests[asked:] if "exec-7731" in r["prompt"]]     # unchanged: replayed


@pytest.mark.timeout(200)
async def test_a_type_asking_above_the_callers_max_profile_is_narrowed_and_says_so(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    app = make_project(tmp_path / "roots" / "app", "the app")
    add_agents(app, {"executor": EXECUTOR.replace("model: sonnet", "model: claude-haiku-5-5"),
                     "web": "---\nname: web\ndescription: fetches pages\ntools: WebFetch\n---\nFetch.\n"})
    env = await project_daemon(tmp_path, nursery, api.url, {"default": str(app)},
                               caller_extra={"maxProfile": "read", "models": {"claude": ["claude-opus-*"]}})
    run = await run_to_end(env, "return await agent('[[text:read only]] narrow-1', { agentType: 'executor' })",
                           timeout=150)
    assert run.status == "completed", run.error
    assert result_of(env, run) == "read only"
    body = request_for(api, "narrow-1")
    assert "Bash" not in tool_names(body) and "Read" in tool_names(body)
    assert body["model"].startswith("claude-opus")               # the file's model is not allowed here
    assert agent_json(env, run, 1)["profile"] == "read"
    notes = [ln for ln in log_lines(env, run) if "agent type 'executor'" in ln]
    assert any("needs the write profile for its tools; it runs as read, the most this caller's maxProfile allows"
               in ln for ln in notes), notes
    assert any("names model 'claude-haiku-5-5', which caller 'alice' may not use" in ln for ln in notes), notes
    # A type naming only WebFetch keeps the read profile that offers it, without Read & co.
    web = await run_to_end(env, "return await agent('[[text:fetched]] web-1', { agentType: 'web' })", timeout=150)
    assert web.status == "completed", web.error
    assert agent_json(env, web, 1)["profile"] == "read"
    web_tools = tool_names(request_for(api, "web-1"))
    assert "WebFetch" in web_tools and not {"Read", "Grep", "Glob", "Bash"} & web_tools, web_tools
    explicit = await run_to_end(env, "return await agent('x', { agentType: 'executor', profile: 'write' })"
                                     ".catch((e) => e.message)", timeout=60)
    assert "above this caller's maxProfile 'read'" in result_of(env, explicit)
