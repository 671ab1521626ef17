"""agent() on the real Claude Code CLI (installed by tests/install.sh) against a fake
Anthropic Messages API on loopback. These must not skip: a missing CLI fails them."""

from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import pytest
import trio


from swarmbase.engines import framing

from .conftest import CLAUDE, Env, agent_json, descendants, engine_daemon, result_of, run_to_end  # noqa: F401
from .fakes.anthropic_api import FakeAnthropic

CANARY = "sk-ant-canary-" + secrets.token_hex(16)


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


async def claude_daemon(tmp_path: Path, nursery: trio.Nursery, bin_path: str, base_url: str | None,
                        caller_extra: dict[str, Any] | None = None, **extra: Any) -> Env:
    extra.setdefault("perRunConcurrency", 8)
    return await engine_daemon(tmp_path, nursery, key=CANARY, engines={"claude": {"bin": bin_path, "baseUrl": base_url}},
                               caller_extra={"maxProfile": "write", **(caller_extra or {})}, **extra)


def all_text_under(path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in path.rglob("*") if p.is_file())


# -- results ----------------------------------------------------------------------

@pytest.mark.timeout(400)
async def test_text_structured_and_tool_use_results(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                    api: FakeAnthropic) -> None:
    # Five real CLI agents one after another: 9-13 s on a quiet machine, 28 s at load 13 on
    # 2 cores (nice 19), past the 60 s run_to_end used to allow at the suite's load of 20-40
    # (issue 32.10). No deadline of the test's own: the hard timeout is the only one.
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    (tmp_path / "roots" / "notes.txt").write_text("the secret word is marmalade")
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    script = f"""
const text = await agent("say it [[text:hello there]]", {{ label: "plain" }});
const obj = await agent("rate [[structured:{{\\"score\\": 4}}]]", {{ schema: {json.dumps(schema)} }});
const bad = await agent("rate badly [[structured:{{\\"score\\": \\"high\\"}}]]", {{ schema: {json.dumps(schema)} }}).catch((e) => e.message);
const none = await agent("no object [[textonly]]", {{ schema: {json.dumps(schema)} }}).catch((e) => e.message);
const read = await agent("[[read:{tmp_path / 'roots' / 'notes.txt'}]]", {{ profile: "read", cwd: {json.dumps(str(tmp_path / 'roots'))} }});
return {{ text, obj, bad, none, read, budget: {{ spent: budget.usd.spent, reserved: budget.usd.reserved }} }};
"""
    run = await run_to_end(env, script, timeout=math.inf)
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert res["text"] == "hello there"
    assert res["obj"] == {"score": 4}
    # agent({schema}) throws without a valid object (Claude Code's rule).
    assert res["bad"].startswith("agent({schema}): agent 3 returned no valid structured output")
    assert res["none"].startswith("agent({schema}): agent 4 returned no valid structured output")
    assert "marmalade" in res["read"]
    assert res["budget"]["reserved"] == 0
    assert agent_json(env, run, 3)["state"] == "failed"
    err4 = agent_json(env, run, 4)["error"]
    assert "structured output" in err4 or "schema" in err4
    a1 = agent_json(env, run, 1)
    assert [h["state"] for h in a1["history"]] == ["queued", "running", "done"]
    assert a1["costUsd"] == pytest.approx(0.005) and a1["estimated"] is False
    assert a1["tokens"]["input"] == 1000 and a1["tokens"]["output"] == 50
    assert a1["exitCode"] == 0 and a1["durationS"] > 0
    lines = (env.services.store.dir(run) / "agents" / "1" / "transcript.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["type"] == "system" and json.loads(lines[-1])["type"] == "result"
    # Settled spend equals the sum of agent costs; the ledger holds nothing back.
    total = sum(agent_json(env, run, n)["costUsd"] for n in range(1, 6))
    assert run.spent_usd == pytest.approx(total)
    # Headers for gateway attribution went out on every request.
    # Every agent is told its final message is the script's return value.
    systems = {r["prompt"]: "\n".join(b.get("text", "") for b in r["body"].get("system") or [] if isinstance(b, dict))
               for r in api.requests}
    assert framing.note(False) in next(v for k, v in systems.items() if "say it [[text:hello there]]" in k)
    assert framing.note(True) in next(v for k, v in systems.items() if "rate [[structured" in k)
    for r in api.requests:
        assert r["headers"]["x-gate-origin"] == "swarmbase"
        assert r["headers"]["x-gate-channel"] == run.id
        assert r["headers"]["x-api-key"] == CANARY
    assert {r["headers"]["x-gate-counterparty"] for r in api.requests} >= {"1:plain", "2:agent 2"}


async def test_api_errors_make_agent_null_with_reason(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                      api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    run = await run_to_end(env, "return [await agent('[[401]]'), await agent('[[500]]'), "
                                "await agent('[[slow:0.2]]')]", timeout=120)
    assert run.status == "completed", run.error
    assert result_of(env, run) == [None, None, "slowly done"]
    e1, e2 = agent_json(env, run, 1)["error"], agent_json(env, run, 2)["error"]
    assert "HTTP 401" in e1 and "HTTP 500" in e2


async def test_hang_hits_idle_watchdog_and_cost_is_estimated(tmp_path: Path, nursery: trio.Nursery,
                                                             claude_bin: str, api: FakeAnthropic) -> None:
    # The watchdog counts silence from the CLI's start, so on a loaded machine it can fire
    # during start-up, before any usage streamed: then the agent is charged exactly $0, not
    # estimated. Both outcomes are checked whenever they happen; the idle timeout doubles
    # until the one this test is about (usage streamed, then silence) has been seen.
    idle_ms = 3000
    for attempt in range(6):
        env = await claude_daemon(tmp_path / str(attempt), nursery, claude_bin, api.url, agentIdleTimeoutMs=idle_ms)
        run = await run_to_end(env, "return await agent('[[hang]]')", timeout=60 + 2 * idle_ms / 1000)
        assert run.status == "completed" and result_of(env, run) is None
        a = agent_json(env, run, 1)
        assert a["state"] == "failed" and "idle watchdog" in a["error"]
        assert env.services.supervisor.runs[run.id].spent_usd == pytest.approx(a["costUsd"])
        if a["tokens"]["total"] > 0:
            assert a["estimated"] is True and a["costUsd"] > 0
            assert run.spent_estimated is True
            return
        assert a["estimated"] is False and a["costUsd"] == 0 and run.spent_estimated is False
        idle_ms *= 2
    pytest.fail("the CLI never streamed usage before its idle watchdog, even at 96 s")


async def test_budget_exhaustion_throws_inside_script(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                      api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    # Each agent costs $0.44 (100k in, 2k out at $4/$20 per M); the budget is $1.
    script = """
const got = [];
try {
  for (let i = 0; i < 10; i++) got.push(await agent("[[usage:100000,2000]] " + i, { maxUsd: 0.5 }));
} catch (e) { return { got: got.length, message: e.message, name: e.name, budget: JSON.parse(JSON.stringify(budget.usd)) }; }
return { got: got.length, message: null };"""
    run = await run_to_end(env, script, budgetUsd=1)
    res = result_of(env, run)
    assert res["message"] is not None and "budget is spent" in res["message"]
    assert res["name"] == "WorkflowBudgetExceededError"
    assert res["got"] == 3
    assert res["budget"]["reserved"] == 0 and res["budget"]["remaining"] == 0
    assert res["budget"]["spent"] == pytest.approx(1.32)


async def test_parallel_20_agents_at_per_run_concurrency_4(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                                           api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url, perRunConcurrency=4)
    peak = 0
    done = trio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            # One agent is one process group (Claude Code forks helpers inside its group). Only
            # this test's own: other test runs on the machine start the same CLI.
            groups = {_pgid(Path(f"/proc/{p}")) for p in descendants(os.getpid()) if _is_claude(Path(f"/proc/{p}"))}
            groups.discard(None)
            peak = max(peak, len(groups))
            await trio.sleep(0.02)

    nursery.start_soon(watch)
    run = await run_to_end(env, "return await parallel(Array.from({length: 20}, (_, i) => () => "
                                "agent('[[sleep:0.3]] ' + i, { label: 'a' + i })))", timeout=180)
    done.set()
    assert run.status == "completed", run.error
    assert len(result_of(env, run)) == 20
    assert 2 <= peak <= 4, peak
    assert api.max_live <= 4


def _pgid(p: Path) -> int | None:
    try:
        return int((p / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _is_claude(p: Path) -> bool:
    """A live Claude Code process started from the test install."""
    try:
        argv0 = (p / "cmdline").read_bytes().split(b"\0")[0]
        state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X") and argv0 in (str(CLAUDE).encode(), str(CLAUDE.resolve()).encode())


async def test_canary_key_never_leaks(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                      api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    argvs: list[bytes] = []

    async def watch() -> None:
        while True:
            for p in Path("/proc").iterdir():
                if p.name.isdigit() and _is_claude(p):
                    try:
                        argvs.append((p / "cmdline").read_bytes())
                    except OSError:
                        pass
            await trio.sleep(0.01)

    nursery.start_soon(watch)
    run = await run_to_end(env, "const r = await agent('[[echokey]]', {label: 'leaky'});\nlog('agent said: ' + r);\n"
                                "throw new Error('failing with ' + r);")
    assert run.status == "failed"
    assert argvs and not any(CANARY.encode() in a for a in argvs)
    assert CANARY not in all_text_under(env.services.store.dir(run))
    assert "[redacted]" in run.error
    notice = env.services.outbox.pending("alice")[-1]
    assert CANARY not in json.dumps(notice)
    from swarmbase.mcpl import tools
    st = tools.call(env.services.supervisor, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": run.id}})
    assert CANARY not in json.dumps(st) and "[redacted]" in json.dumps(st)
    # The request really carried it: the redaction is doing the work.
    assert any(r["headers"].get("x-api-key") == CANARY for r in api.requests)


def _environ_and_argv(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes() + b"\n" + Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:              # gone meanwhile
        return b""


async def test_the_key_never_enters_an_agent(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                             api: FakeAnthropic) -> None:
    """Issue 31 #3: the CLI holds a bearer of its own; the key door swaps it for the key.
    While the agent's request is held at the API: no process of the daemon's has the key
    in its environment or argv, no file in the agents' homes has it; the agent's own
    `env` (sent back to the model) has the bearer and no key; the API got the key."""
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    prompt = "[[gate]] [[bash:env; tr '\\0' '\\n' < /proc/$PPID/environ]]"
    results: list[Any] = []
    ended = trio.Event()

    async def go() -> None:
        results.append(await run_to_end(env, f"return await agent({json.dumps(prompt)}, {{profile: 'write'}})"))
        ended.set()

    nursery.start_soon(go)
    with trio.fail_after(60):
        while not api.requests:          # the CLI is up and waiting on its first answer
            await trio.sleep(0.02)
    procs = descendants(os.getpid())
    seen = {pid: _environ_and_argv(pid) for pid in procs}
    clis = [pid for pid in procs if _is_claude(Path(f"/proc/{pid}"))]
    assert clis and all(b"ANTHROPIC_API_KEY=" in seen[pid] for pid in clis)
    assert not [pid for pid, text in seen.items() if CANARY.encode() in text]
    homes = [p for p in env.cfg.homes_dir.rglob("*") if p.is_file()]
    assert homes and not any(CANARY.encode() in p.read_bytes() for p in homes)
    api.gate.set()
    with trio.fail_after(120):
        await ended.wait()
    run = results[0]
    assert run.status == "completed", run.error
    told = json.dumps([r["body"] for r in api.requests])
    assert "ANTHROPIC_API_KEY=" in told and "ANTHROPIC_BASE_URL=http://127.0.0.1:" in told
    assert CANARY not in told
    assert CANARY not in all_text_under(env.services.store.dir(run))
    # The API got the caller's key on every request, from the door.
    assert len(api.requests) >= 2 and all(r["headers"].get("x-api-key") == CANARY for r in api.requests)


async def test_cwd_must_lie_under_cwd_roots(tmp_path: Path, nursery: trio.Nursery, claude_bin: str,
                                            api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "roots" / "link").symlink_to(outside)
    for cwd in (str(outside), str(tmp_path / "roots" / "link"), "relative/path"):
        run = await run_to_end(env, f"return await agent('x', {{ cwd: {json.dumps(cwd)} }})")
        assert run.status == "failed"
        assert "cwdRoots" in run.error or "absolute path" in run.error, run.error
    assert api.requests == []


async def test_read_profile_is_confined_to_cwd_and_denies_secrets(tmp_path: Path, nursery: trio.Nursery,
                                                                  claude_bin: str, api: FakeAnthropic) -> None:
    env = await claude_daemon(tmp_path, nursery, claude_bin, api.url)
    roots = tmp_path / "roots"
    (roots / "ok.txt").write_text("VISIBLE-CONTENT")
    (roots / ".env").write_text("DOTENV-SECRET-VALUE")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "private.txt").write_text("OUTSIDE-SECRET-VALUE")
    reads = [roots / "ok.txt", roots / ".env", outside / "private.txt", env.cfg.path]
    script = "return await parallel(args.map(p => () => agent('[[read:' + p + ']]', { profile: 'read', cwd: "
    script += json.dumps(str(roots)) + " })))"
    run = await run_to_end(env, script, args=[str(p) for p in reads], timeout=120)
    ok, dotenv, out, cfg = result_of(env, run)
    assert "VISIBLE-CONTENT" in ok
    assert "DOTENV-SECRET-VALUE" not in dotenv
    assert "OUTSIDE-SECRET-VALUE" not in out
    assert "tokenSha256" not in cfg
