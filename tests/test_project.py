"""A caller's project (issue 28 item 1): the run works in it as a Claude Code session works
in its directory. The real Claude Code CLI against the fake model API, whose Bash and Read
calls show what the agent really sees (its cwd, the project's files), so an agent in the
wrong directory changes the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config
from swarmbase.mcpl import tool_docs, tools
from swarmbase.runs.run_opts import RunRefused

from .conftest import Env, git, result_of, run_to_end, write_config
from .fakes.anthropic_api import FakeAnthropic
from .project_daemon import make_project, project_daemon, said

def status_of(env: Env, run_id: str) -> dict[str, Any]:
    st = tools.call(env.services.supervisor, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": run_id}})
    out: dict[str, Any] = st["structuredContent"]
    return out


@pytest.mark.timeout(200)
async def test_the_default_project_is_where_agents_work(tmp_path: Path, nursery: trio.Nursery,
                                                         claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    app = make_project(tmp_path / "roots" / "app", "the app")
    lib = make_project(tmp_path / "roots" / "lib", "the lib", repo=False)
    env = await project_daemon(tmp_path, nursery, api.url, {"default": str(app), "lib": str(lib)})
    # A Claude Code script as written: no cwd, no project parameter; a relative cwd too.
    script = """
const here = await agent('[[bash:pwd && cat marker.txt]]', { profile: 'write', label: 'here' });
const sub = await agent('[[bash:pwd && cat inner.txt]]', { profile: 'write', cwd: 'src', label: 'sub' });
return { here, sub };"""
    run = await run_to_end(env, script, timeout=150)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert said(res["here"]) == [str(app), "the", "app"]
    assert said(res["sub"]) == [str(app / "src"), "inner", "of", "the", "app"]
    st = status_of(env, run.id)
    assert (st["project"], st["projectName"]) == (str(app), "default")
    listed = tools.call(env.services.supervisor, env.cfg.caller("alice"), {"name": "list", "arguments": {}})
    assert listed["structuredContent"]["runs"][0]["projectName"] == "default"
    run_json = json.loads((env.services.store.dir(run) / "run.json").read_text())
    assert run_json["project"] == str(app) and run_json["projectName"] == "default"

    # Another project by name (a plain directory), and `repository`, its older name, as a path.
    other = await run_to_end(env, "return await agent('[[bash:pwd && cat marker.txt]]', { profile: 'write' })",
                             project="lib", timeout=150)
    assert other.status == "completed", other.error
    assert said(result_of(env, other)) == [str(lib), "the", "lib"]
    assert status_of(env, other.id)["projectName"] == "lib"
    by_path = await run_to_end(env, "return await agent('[[bash:cat marker.txt]]', { profile: 'write' })",
                               repository=str(lib), timeout=150)
    assert said(result_of(env, by_path)) == ["the", "lib"] and status_of(env, by_path.id)["projectName"] == "lib"

    # Worktrees come from the project: a worktree agent with no cwd works.
    wt = await run_to_end(env, "return await agent('[[bash:cat marker.txt > seen.txt && echo ok]]', "
                               "{ profile: 'write', isolation: 'worktree', detail: true })", timeout=150)
    assert wt.status == "completed", wt.error
    commit = result_of(env, wt)["worktree"]["commit"]
    assert git(app, "show", f"{commit}:seen.txt") == "the app"

    # The run page shows the project.
    with pytest.raises(RunRefused, match="not one of this caller's projects \\(default, lib\\)"):
        env.services.supervisor.start(env.cfg.caller("alice"), {"script": "return 1", "project": "nope"})
    doc = tool_docs.for_caller(tools.TOOLS, env.cfg.caller("alice"), env.cfg)
    run_doc = json.dumps(next(t for t in doc if t["name"] == "run"))
    assert "your project 'default'" in run_doc


@pytest.mark.timeout(200)
async def test_without_a_project_worktree_agents_fail_before_spend_and_so_does_the_run(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    (tmp_path / "roots").mkdir()
    env = await project_daemon(tmp_path, nursery, api.url, None)
    # What a public script does: pipeline() turns each throw into null and returns.
    script = """
const out = await Promise.all([0, 1].map((i) => agent('[[text:done]]', { isolation: 'worktree' }).catch(() => null)));
return { passed: out.filter(Boolean).length };"""
    run = await run_to_end(env, script, timeout=150)
    assert run.status == "failed"
    assert "every worktree agent of the run (2) failed before it started" in (run.error or "")
    assert "this run has no project" in (run.error or "")
    assert api.requests == []                      # nothing was paid for
    assert status_of(env, run.id)["project"] is None
    doc = json.dumps(next(t for t in tool_docs.for_caller(tools.TOOLS, env.cfg.caller("alice"), env.cfg)
                          if t["name"] == "run"))
    assert "you have no project configured, so agents work in the run's own empty work dir" in doc
    # One worktree agent refused among other agents that ran: the script's own business.
    mixed = await run_to_end(env, "const a = await agent('[[text:fine]]', { profile: 'read' }); "
                                  "const b = await agent('x', { isolation: 'worktree' }).catch(e => e.message); "
                                  "const c = await agent('y', { isolation: 'worktree', cwd: '/nonexistent' })"
                                  ".catch(e => 'refused'); return [a, b, c];", timeout=150)
    assert mixed.status == "completed", mixed.error


def test_projects_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    (roots / "app").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    state = tmp_path / "state"

    def load(projects: dict[str, str]) -> config.Config:
        path, _ = write_config(state, callers=["alice"],
                               caller_extra={"cwdRoots": [str(roots)], "projects": projects})
        return config.load(path)

    assert load({"app": str(roots / "app")}).caller("alice").default_project() == ("app", str(roots / "app"))
    for projects, words in (({"app": str(tmp_path / "outside")}, "is not inside the caller's cwdRoots"),
                            ({"app": "relative/dir"}, "must be an absolute path"),
                            ({"a b": str(roots / "app")}, "is not a project name"),
                            ({"app": str(roots / "missing")}, "is not a directory")):
        with pytest.raises(config.ConfigError, match=words):
            load(projects)
    two = load({"app": str(roots / "app"), "web": str(roots)})
    assert two.caller("alice").default_project() is None          # several, none named default
