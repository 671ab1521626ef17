"""The project's workflows (issue 28 item 3): `run {name}` and `workflow('name')` find the
run's project's `.claude/workflows/<name>.js` (or a file there with that meta.name) before
the caller's saved workflows, as Claude Code does; the `workflows` tool lists both, marked.
A real daemon over its WebSocket, the real Node runner and the real Claude Code CLI against
the fake model API, whose Bash answers show where the workflow's agent worked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import HostClient, connect

from .conftest import Env, result_of
from .fakes.anthropic_api import FakeAnthropic
from .project_daemon import make_project, project_daemon, said

PROJECT_X = """export const meta = { name: 'x-flow', description: "the project's x", whenToUse: 'always' }
const seen = await agent('[[bash:cat marker.txt]]', { profile: 'write', label: 'x agent' });
return { from: 'project', tag: args.tag, seen };"""


async def ended(env: Env, started: dict[str, Any]) -> Any:
    assert not started.get("isError"), started
    run_id = started["structuredContent"]["runId"]
    sup = env.services.supervisor
    with trio.fail_after(150):
        if run_id in sup.live:
            await sup.live[run_id].finished.wait()
    run = sup.runs[run_id]
    assert run.status == "completed", run.error
    return result_of(env, run)


async def listed(h: HostClient, **args: str) -> list[tuple[str, str, bool]]:
    out = (await h.tool("workflows", args))["structuredContent"]["workflows"]
    return [(w["name"], w["source"], w.get("shadowed", False)) for w in out]


@pytest.mark.timeout(300)
async def test_the_project_s_workflows_run_by_name_before_saved_ones(tmp_path: Path, nursery: trio.Nursery,
                                                                    claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    app = make_project(tmp_path / "roots" / "app", "the app")
    lib = make_project(tmp_path / "roots" / "lib", "the lib", repo=False)
    flows = app / ".claude" / "workflows"
    flows.mkdir(parents=True)
    (flows / "x.js").write_text(PROJECT_X)
    env = await project_daemon(tmp_path, nursery, api.url, {"default": str(app), "lib": str(lib)})
    async with connect(env.ws, env.tokens["alice"]) as h:
        await h.handshake()
        for name, text in (("x", "return { from: 'saved', tag: args.tag }"), ("only", "return 'saved only'")):
            assert not (await h.tool("save_workflow", {"name": name, "script": text})).get("isError")

        # Claude Code's call: the project's x shadows the saved x, and its agent works in the project.
        by_name = await ended(env, await h.tool("run", {"name": "x", "args": {"tag": "A"}}))
        assert (by_name["from"], by_name["tag"]) == ("project", "A")
        assert said(by_name["seen"]) == ["the", "app"]

        # From a script: by file name, by meta.name, and a saved one the project does not have.
        nested = await ended(env, await h.tool("run", {"script": """
const byFile = await workflow('x', { tag: 'B' });
const byMeta = await workflow({ name: 'x-flow' }, { tag: 'C' });
const missing = await workflow('nope').catch((e) => e.message);
return { byFile, byMeta, saved: await workflow('only'), missing };"""}))
        assert [nested[k]["from"] for k in ("byFile", "byMeta")] == ["project", "project"]
        assert (nested["byFile"]["tag"], nested["byMeta"]["tag"]) == ("B", "C")
        assert said(nested["byMeta"]["seen"]) == ["the", "app"] and nested["saved"] == "saved only"
        # Claude Code's words (scripts test for them), then where SwarmBase looked.
        assert nested["missing"] == ("workflow('nope'): no workflow with that name. Available: x, only (looked in "
                                     "the project's .claude/workflows or the saved workflows)")

        # A run in another project (no .claude/workflows there) gets the saved x.
        assert (await ended(env, await h.tool("run", {"name": "x", "project": "lib", "args": {"tag": "D"}}))
                ) == {"from": "saved", "tag": "D"}
        in_lib = await ended(env, await h.tool("run", {"script": "return await workflow('x', { tag: 'E' })",
                                                     "project": "lib"}))
        assert in_lib == {"from": "saved", "tag": "E"}

        assert await listed(h) == [("x", "project", False), ("only", "saved", False), ("x", "saved", True)]
        full = (await h.tool("workflows"))["structuredContent"]
        assert (full["projectName"], full["project"]) == ("default", str(app))
        assert full["workflows"][0]["whenToUse"] == "always" and full["workflows"][0]["path"] == ".claude/workflows/x.js"
        assert await listed(h, project="lib") == [("only", "saved", False), ("x", "saved", False)]

        missing = await h.tool("run", {"name": "nope"})
        assert missing["isError"]
        assert ("no workflow named 'nope' in the project's .claude/workflows or the saved workflows. "
                "Available: x, only") in missing["content"][0]["text"]
        bad_project = await h.tool("workflows", {"project": "nope"})
        assert bad_project["isError"] and "not one of this caller's projects" in bad_project["content"][0]["text"]

    # Read when needed: a file added to the project while the daemon runs is found at once.
    (flows / "late.js").write_text("return 'late'")
    async with connect(env.ws, env.tokens["alice"]) as h:
        await h.handshake()
        assert await ended(env, await h.tool("run", {"name": "late"})) == "late"
