"""Issue 20 items 1–3 and issue 25 item 1, as an attacker would try them, against the real
daemon process (`python -m swarmbase`, as root in CI) with the real Claude Code CLI and a
fake API that scripts its Bash calls:

- a write agent's shell has no capability, no root, cannot mount or make a namespace, and
  finds /proc/sys read-only (probed with access(2): nothing is ever written to the kernel);
- a worktree agent that swaps its worktree's .git for a repository whose core.fsmonitor
  is its script, and a plain write agent that plants filters, fsmonitor, includes and a
  hook in a repository a read worktree agent then uses: no marker appears, neither where
  the daemon could write nor where sandboxed git could;
- a cwd swapped for a symlink to the state dir's runs/ or admin/sessions while its agent
  waits for a slot: the agent is refused at launch and never starts;
- kill -9 with worktree agents running, then a restart: no worktree stays registered, the
  branches keep what the agents wrote and can be deleted.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import connect

from .clidaemon import run_script

from .clidaemon import cli_daemon
from .conftest import CLAUDE, git, give_to_sandbox, start_cli_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic

KEY = "sk-ant-priv-" + secrets.token_hex(12)


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


def setup(tmp_path: Path, api: FakeAnthropic, **extra: Any) -> tuple[Path, str, Path]:
    """(config path, alice's token, her cwdRoot, given to the sandbox user)."""
    state = tmp_path / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text(KEY)
    key.chmod(0o600)
    roots = tmp_path / "roots"
    roots.mkdir()
    give_to_sandbox(roots, state)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": str(CLAUDE), "baseUrl": api.url}},
                                caller_extra={"apiKeyFile": str(key), "maxProfile": "write", "runUsdMax": 100,
                                              "cwdRoots": [str(roots)]}, **extra)
    return path, tokens["alice"], roots


def make_repo(path: Path, state: Path) -> None:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "README").write_text("the caller's checkout\n")
    git(path, "add", "-A")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    give_to_sandbox(path, state)


def bash(command: str) -> str:
    return json.dumps(f"[[bash:{command}]]")


@pytest.mark.timeout(240)
async def test_a_write_agents_shell_has_no_privilege(tmp_path: Path, claude_bin: str, api: FakeAnthropic) -> None:
    path, token, roots = setup(tmp_path, api)
    probe = ("grep -E '^(Uid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; "
             "mkdir -p /tmp/m; mount -t tmpfs none /tmp/m 2>/dev/null && echo MOUNTED || echo MOUNT-REFUSED; "
             "unshare -r true 2>/dev/null && echo USERNS || echo USERNS-REFUSED; "
             "unshare -rm mount -t tmpfs none /tmp/m 2>/dev/null && echo NESTED-MOUNT || echo NESTED-REFUSED; "
             "for f in /proc/sys/kernel/core_pattern /proc/sysrq-trigger /proc/sys/vm/drop_caches; do "
             "test -w $f && echo WRITABLE $f; done; echo PROBED")
    async with cli_daemon(path) as d:
        _, notice, out = await run_script(d.ws, token, f"return await agent({bash(probe)}, {{profile: 'write'}})")
    assert "PROBED" in out, out
    fields = dict(line.split(":\t", 1) for line in out.split("tool said: ", 1)[1].splitlines() if ":\t" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields[cap].strip() == "0000000000000000", (cap, fields)
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    uids = fields["Uid"].split()
    assert "0" not in uids if os.geteuid() == 0 else uids[0] == str(os.geteuid())
    assert "MOUNT-REFUSED" in out and "USERNS-REFUSED" in out and "NESTED-REFUSED" in out
    assert "WRITABLE" not in out


@pytest.mark.timeout(300)
async def test_worktree_git_runs_nothing_an_agent_planted(tmp_path: Path, claude_bin: str, api: FakeAnthropic) -> None:
    path, token, roots = setup(tmp_path, api)
    repo = roots / "repo"
    make_repo(repo, path.parent)
    markers = tmp_path / "markers"          # where git running as the daemon could write
    markers.mkdir()
    evil = lambda tag: f"#!/bin/sh\\ntouch {markers}/{tag} {repo}/.git/{tag}-in-repo\\ncat\\n"   # noqa: E731
    # (a) a worktree agent makes its worktree's .git a repository of its own, with an fsmonitor.
    swap = (f"rm -f .git && git init -q . && printf '{evil('fsmonitor')}' > \"$PWD/fsm.sh\" && chmod +x fsm.sh && "
            "git config core.fsmonitor \"$PWD/fsm.sh\" && echo work > result.txt && echo SWAPPED")
    # (b) a plain write agent in the repository plants filters, fsmonitor, an include and hooks;
    # then a read worktree agent uses the repository.
    plant = (f"printf '{evil('smudge')}' > .git/smudge.sh && chmod +x .git/smudge.sh && "
             "git config filter.evil.smudge \"$PWD/.git/smudge.sh\" && git config filter.evil.clean \"$PWD/.git/smudge.sh\" && "
             "git config filter.evil.process \"$PWD/.git/smudge.sh\" && git config core.fsmonitor \"$PWD/.git/smudge.sh\" && "
             "git config diff.external \"$PWD/.git/smudge.sh\" && "
             "printf '[core]\\n\\tfsmonitor = %s\\n' \"$PWD/.git/smudge.sh\" > .git/inc && git config include.path inc && "
             "mkdir -p .git/info .git/hooks && echo '* filter=evil diff=evil' > .git/info/attributes && "
             "for h in post-checkout pre-commit post-commit reference-transaction; do cp .git/smudge.sh .git/hooks/$h; done && "
             "echo PLANTED")
    script = f"""
const a = await agent({bash(swap)}, {{profile: 'write', cwd: {json.dumps(str(repo))}, isolation: 'worktree', detail: true}});
const p = await agent({bash(plant)}, {{profile: 'write', cwd: {json.dumps(str(repo))}, detail: true}});
const b = await agent('look around', {{profile: 'read', cwd: {json.dumps(str(repo))}, isolation: 'worktree', detail: true}});
return {{a, p, b}};"""
    async with cli_daemon(path) as d:
        _, notice, out = await run_script(d.ws, token, script)
    assert "SWAPPED" in out["a"]["text"] and "PLANTED" in out["p"]["text"], out
    worked = sorted(p.name for p in markers.iterdir()) + sorted(p.name for p in (repo / ".git").glob("*-in-repo"))
    assert worked == [], f"planted code ran: {worked}"
    # The worktrees still did their job: (a)'s work is on its branch, (b) ran and left nothing checked out.
    assert out["a"]["ok"] and out["b"]["ok"], out
    assert git(repo, "show", f"{out['a']['worktree']['commit']}:result.txt") == "work"
    assert out["b"]["worktree"]["filesChanged"] == 0
    assert git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.timeout(300)
async def test_a_cwd_swapped_for_a_symlink_while_its_agent_waits_is_refused(tmp_path: Path, claude_bin: str,
                                                                           api: FakeAnthropic) -> None:
    """Run 1: the waiters wait for the daemon-wide slot; run 2: for the run's budget."""
    path, token, roots = setup(tmp_path, api, maxConcurrentAgents=1)
    state = path.parent
    (state / "admin" / "sessions").mkdir(parents=True, mode=0o700)
    for name in ("x", "y", "z"):
        (roots / name).mkdir()
    give_to_sandbox(roots, state)
    probe = json.dumps("[[bash:ls -la; touch planted-by-waiting-agent; echo WAITER-RAN]]")

    def script(swap: str, waiters: list[str], max_usd: tuple[str, str] = ("", "")) -> str:
        calls = [f"() => agent({bash(swap)}, {{profile: 'write', cwd: {json.dumps(str(roots))}, detail: true{max_usd[0]}}})"]
        calls += [f"() => agent({probe}, {{profile: 'write', cwd: {json.dumps(str(roots / w))}, detail: true{max_usd[1]}}})"
                  for w in waiters]
        return f"return await parallel([{', '.join(calls)}]);"

    slot = script(f"rm -rf x y && ln -s {state}/runs x && ln -s {state}/admin/sessions y && echo SWAPPED", ["x", "y"])
    # The swapper holds the whole budget: the waiter waits for it (then for the slot).
    budget = script(f"rm -rf z && ln -s {state}/runs z && echo SWAPPED", ["z"], (", maxUsd: 1", ", maxUsd: 0.5"))
    async with cli_daemon(path) as d:
        _, _, by_slot = await run_script(d.ws, token, slot)
        rid, _, by_budget = await run_script(d.ws, token, budget, budgetUsd=1)
    for out in (by_slot, by_budget):
        assert out[0]["ok"] and "SWAPPED" in out[0]["text"], out
        for waiter in out[1:]:
            assert not waiter["ok"] and "changed between the agent() call and its launch" in waiter["error"], waiter
    assert all((roots / n).is_symlink() for n in ("x", "y", "z"))
    waited = json.loads(next((state / "runs").glob(f"*-{rid}/agents/2/agent.json")).read_text())["history"]
    assert "waiting-budget" in [h["state"] for h in waited]
    assert sum("WAITER-RAN" in r["prompt"] for r in api.requests) == 0    # never started: no model call
    assert not list(state.rglob("planted-by-waiting-agent"))
    assert list((state / "admin" / "sessions").iterdir()) == []


@pytest.mark.timeout(300)
async def test_kill_9_with_worktree_agents_then_restart_leaves_no_worktree(tmp_path: Path, claude_bin: str,
                                                                          api: FakeAnthropic) -> None:
    path, token, roots = setup(tmp_path, api)
    repo = roots / "repo"
    make_repo(repo, path.parent)
    write = "[[bashhang:echo partial > partial.txt && echo wrote]]"
    script = (f"return await parallel([1, 2].map(() => () => agent({json.dumps(write)}, "
              f"{{profile: 'write', cwd: {json.dumps(str(repo))}, isolation: 'worktree'}})))")
    with trio.fail_after(240):
        proc, ws = await start_cli_daemon(path)
        try:
            async with connect(ws, token) as h:
                await h.handshake()
                rid = (await h.tool("run", {"script": script}))["structuredContent"]["runId"]
                # Both agents wrote, and hang on their next model turn.
                while sum(1 for r in api.requests if "partial" in r["prompt"]) < 4:
                    await trio.sleep(0.05)
        finally:
            proc.kill()
            await proc.wait()
        listed = git(repo, "worktree", "list", "--porcelain")
        assert listed.count("worktree ") == 3, listed          # the crash left both registered
        async with cli_daemon(path):
            pass                                                 # boot, then a clean stop
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    branches = git(repo, "branch", "--list", f"swarmbase/{rid}/*", "--format=%(refname:short)").split()
    assert sorted(branches) == [f"swarmbase/{rid}/1", f"swarmbase/{rid}/2"]
    for b in branches:
        assert git(repo, "show", f"{b}:partial.txt") == "partial"         # what the agent wrote is kept
        git(repo, "branch", "-D", b)                                      # and nothing holds the branch
    assert not list((path.parent / "runs").glob(f"*-{rid}/worktrees/*"))


@pytest.mark.timeout(60)
async def test_the_daemon_refuses_to_start_when_the_sandbox_cannot(tmp_path: Path, api: FakeAnthropic) -> None:
    """A host where bwrap cannot make a namespace (here: a bwrap that says so) stops the real
    daemon at start-up with one line; it never runs agents with privilege instead."""
    path, _, _ = setup(tmp_path, api)
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = dict(os.environ, SWARMBASE_CONFIG=str(path), PATH=f"{fake.parent}:{os.environ['PATH']}")
    with trio.fail_after(50):
        done = await trio.run_process([sys.executable, "-m", "swarmbase"], env=env, capture_stderr=True, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "cannot start: the sandbox cannot start a child" in err and "setting up uid map" in err
    assert "Traceback" not in err and "listening" not in err
