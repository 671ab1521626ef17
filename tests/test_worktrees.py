"""isolation: 'worktree' with the real CLI: parallel writers on one repository each get a
branch and a commit, the caller's checkout is untouched, resume reuses the branches, and
a cwd outside a repository (or in one without commits) is refused."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from swarmbase.mcpl import tools

from .conftest import CLAUDE, agent_json, engine_daemon, git, give_to_sandbox, result_of, run_to_end
from .fakes.anthropic_api import FakeAnthropic


def make_repo(path: Path, state: Path) -> str:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("the caller's checkout\n")
    (path / "src").mkdir()
    (path / "src" / "a.txt").write_text("a\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    give_to_sandbox(path, state)
    return git(path, "rev-parse", "HEAD")


async def test_three_parallel_worktree_writers(tmp_path: Path, nursery: trio.Nursery, claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    env = await engine_daemon(tmp_path, nursery, key="sk-ant-wt-0123456789",
                              engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                              caller_extra={"maxProfile": "write"})
    repo = tmp_path / "roots" / "repo"
    head = make_repo(repo, env.state)
    (tmp_path / "roots" / "plain").mkdir()
    (tmp_path / "roots" / "empty").mkdir()
    git(tmp_path / "roots" / "empty", "init", "-q")
    script = f"""
const cwd = {json.dumps(str(repo / "src"))};
const out = await parallel([0, 1, 2].map((i) => () => agent(
  '[[bash:echo written by ' + i + ' > file-' + i + '.txt && echo changed >> a.txt && echo ok]]',
  {{ profile: 'write', cwd, isolation: 'worktree', detail: true, label: 'writer ' + i }})));
const refused = {{}};
for (const [k, dir] of Object.entries({{ plain: {json.dumps(str(tmp_path / "roots" / "plain"))},
                                        empty: {json.dumps(str(tmp_path / "roots" / "empty"))} }})) {{
  try {{ await agent('x', {{ profile: 'write', cwd: dir, isolation: 'worktree' }}); }} catch (e) {{ refused[k] = e.message; }}
}}
return {{ out, refused }};"""
    run = await run_to_end(env, script, profile="write", timeout=120)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    branches = []
    for i, r in enumerate(res["out"]):
        assert r["ok"], r
        wt = r["worktree"]
        assert wt["branch"] == f"swarmbase/{run.id}/{i + 1}" and wt["filesChanged"] == 2 and wt["base"] == head
        assert "2 files changed" in wt["diffStat"]
        assert git(repo, "show", f"{wt['commit']}:src/file-{i}.txt") == f"written by {i}"
        assert git(repo, "log", "-1", "--format=%an", wt["commit"]) == f"SwarmBase agent {i + 1}"
        assert git(repo, "rev-parse", f"{wt['commit']}^") == head
        branches.append(wt["branch"])
        assert agent_json(env, run, i + 1)["worktree"]["commit"] == wt["commit"]
    # The caller's checkout is untouched: same HEAD, clean tree, no stray files; worktrees removed.
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    assert sorted(p.name for p in (repo / "src").iterdir()) == ["a.txt"]
    assert git(repo, "worktree", "list").count("\n") == 0
    assert "not in one" in res["refused"]["plain"] and "has no commits" in res["refused"]["empty"]
    st = tools.call(env.services.supervisor, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": run.id}})
    assert st["structuredContent"]["branches"] == sorted(branches)
    # Resume replays the records: the branches still exist, nothing runs again.
    before = len(api.requests)
    sup = env.services.supervisor
    new = sup.resume(env.cfg.caller("alice"), run.id, {})
    with trio.fail_after(60):
        await sup.live[new.id].finished.wait() if new.id in sup.live else None
    assert len(api.requests) == before
    again = result_of(env, new)
    assert [r["worktree"]["commit"] for r in again["out"]] == [r["worktree"]["commit"] for r in res["out"]]
    assert all(r["replayed"] for r in again["out"])
