"""agent() plumbing with a fast fake CLI: argv and environment per profile, process
groups on skip/cancel/timeout, caps, fairness, option errors, the boot reaper, the ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

from swarmbase.engines import framing
from swarmbase.launch.deleter import remove_tree
from swarmbase.launch.procs import process_start_time, reap_recorded_groups
from swarmbase.runs.budget import BudgetGate, BudgetSpent, Ledger

from .conftest import FAKE_CLI_KEY as KEY
from .conftest import agent_json, dumps, fake_daemon, pid_alive, process_records, result_of, run_to_end, wait_streamed


async def homes_emptied(homes: Path) -> None:
    with trio.fail_after(30):
        while any(homes.iterdir()):
            await trio.sleep(0.02)


async def test_exact_argv_and_environment_per_profile(tmp_path: Path, nursery: trio.Nursery,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAUDECODE", "1")                 # a parent Claude Code's marker
    monkeypatch.setenv("SWARMBASE_TEST_AMBIENT", "leak")  # anything else from the daemon's env
    env = await fake_daemon(tmp_path, nursery)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    script = f"""
await agent("dump think", {{ profile: "think", label: "t" }});
await agent("dump read", {{ profile: "read", model: "sonnet", effort: "high", maxUsd: 0.25 }});
// The fake CLI returns no structured output: agent({{schema}}) throws (Claude Code's rule).
await agent("dump write", {{ profile: "write", schema: {json.dumps(schema)}, schemaRetries: 0 }}).catch(() => null);
return 1;"""
    run = await run_to_end(env, script, keepWork=True, budgetUsd=4, model="claude-haiku-5-5")
    assert run.status == "completed", run.error
    think, read, write = dumps(env, run)
    work = str(env.services.store.work_dir(run))
    state = str(env.state)

    def without_settings(argv: list[str]) -> list[str]:
        i = argv.index("--settings")
        return argv[1:i] + argv[i + 2:]

    common = ["-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages",
              "--permission-mode", "dontAsk",
              "--setting-sources=", "--strict-mcp-config", "--mcp-config", '{"mcpServers":{}}',
              "--no-session-persistence"]
    # Every agent is told its final message is the script's return value (engines/framing.py).
    text_note = ["--append-system-prompt", framing.note(False)]
    # The default cap is the run's budget per slot: $4 / perRunConcurrency 16.
    assert without_settings(think["argv"]) == common + ["--tools=", "--max-budget-usd", "0.2500",
                                                        "--model", "claude-haiku-5-5"] + text_note
    assert without_settings(read["argv"]) == common + [
        "--tools=Read,Grep,Glob,WebFetch,WebSearch", "--max-budget-usd", "0.2500",
        "--allowedTools", f"Read(/{work}/**),WebFetch,WebSearch", "--model", "sonnet", "--effort", "high"] + text_note
    assert without_settings(write["argv"]) == common + [
        "--tools=Read,Grep,Glob,WebFetch,WebSearch,Edit,Write,Bash", "--max-budget-usd", "0.2500",
        "--allowedTools", f"Read(/{work}/**),WebFetch,WebSearch,Edit(/{work}/**),Bash",
        "--model", "claude-haiku-5-5", "--json-schema", json.dumps(schema, separators=(",", ":")),
        "--append-system-prompt", framing.note(True)]
    deny = json.loads(think["argv"][think["argv"].index("--settings") + 1])["permissions"]["deny"]
    for rule in ("Read(**/.env)", "Read(**/*.token)", "Edit(**/.env)", f"Read(/{state}/*.key)",
                 f"Read(/{state}/runs/*/agents/**)", f"Read(/{env.state / 'alice.key'})",
                 f"Read(/{os.path.expanduser('~')}/.ssh/**)"):
        assert rule in deny, rule
    assert not any(work in r for r in deny)
    # Prompt on stdin as a file, never in argv.
    assert think["stdin_is_file"] and think["prompt"] == "dump think"
    assert not any("dump think" in a for a in think["argv"])
    e = think["env"]
    homes = str(env.state / "homes")
    assert set(e) == {"PATH", "HOME", "CLAUDE_CONFIG_DIR", "TMPDIR", "CLAUDE_CODE_TMPDIR", "LANG",
                      "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER",
                      "CLAUDE_CODE_MAX_RETRIES", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                      "ANTHROPIC_CUSTOM_HEADERS"} | ({"LC_ALL"} & set(os.environ)) | ({"TZ"} & set(os.environ)) \
        | ({"LC_CTYPE"} & set(os.environ))
    # A bearer of its own and the key door, never the caller's key or her API's URL (the
    # door swaps the bearer for the key on the way out; test_key_door.py).
    door = env.services.key_door
    assert door is not None and e["ANTHROPIC_BASE_URL"] == door.url.rstrip("/")
    assert KEY not in e.values() and len(e["ANTHROPIC_API_KEY"]) >= 40
    assert not door.agents                    # its bearer died with it
    assert e["ANTHROPIC_CUSTOM_HEADERS"] == f"x-gate-origin: swarmbase\nx-gate-channel: {run.id}\nx-gate-counterparty: 1:t"
    assert e["HOME"].startswith(homes) and e["TMPDIR"].startswith(homes)
    assert e["CLAUDE_CONFIG_DIR"] == e["HOME"] + "/.claude"
    assert e["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "CLAUDECODE" not in e and "SWARMBASE_TEST_AMBIENT" not in e
    assert think["cwd"] == work
    # Private homes are deleted after each agent (by the deleter, after the agent's end).
    await homes_emptied(env.state / "homes")
    # The key never went into argv or the records.
    assert not any(KEY in a for d in (think, read, write) for a in d["argv"])
    assert KEY not in "".join(p.read_text() for p in (env.services.store.dir(run) / "agents").rglob("*.json*"))


async def test_skip_kills_whole_group_and_run_goes_on(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": "const a = await agent('hold');\nreturn { a, b: await agent('noop') };",
                                              "keepWork": True})
    work = sup.env.store.work_dir(run)
    with trio.fail_after(30):
        # The pid file is written (it exists before its pid is in it), and the usage the
        # fake prints after it has been read: skipped before that, nothing streamed and the
        # agent is charged exactly $0, not estimated (answers.charge).
        while not [p for p in work.glob("grandchild-*") if p.read_text().strip()]:
            await trio.sleep(0.02)
        await wait_streamed(env, run, 1)
        leader = int(list(work.glob("grandchild-*"))[0].name.split("-")[1])
        grandchild = int(list(work.glob("grandchild-*"))[0].read_text())
        assert pid_alive(leader) and pid_alive(grandchild)
        assert sup.skip_agent(run, 1)
        await sup.live[run.id].finished.wait() if run.id in sup.live else None
    assert run.status == "completed"
    assert result_of(env, run) == {"a": None, "b": "noop"}
    assert not pid_alive(leader) and not pid_alive(grandchild)
    a1 = agent_json(env, run, 1)
    assert a1["state"] == "skipped" and a1["estimated"] is True and a1["costUsd"] > 0
    assert run.agents_done == 2 and run.agents_total == 2


async def test_cancel_kills_agent_groups(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": "return await parallel([() => agent('hold'), () => agent('hold')])",
                                              "keepWork": True})
    work = sup.env.store.work_dir(run)
    with trio.fail_after(30):
        # Both grandchildren have written their pid files (a file exists before its pid is in it).
        while len([p for p in work.glob("grandchild-*") if p.read_text().strip()]) < 2:
            await trio.sleep(0.02)
        pids = [int(p.name.split("-")[1]) for p in work.glob("grandchild-*")]
        pids += [int(p.read_text()) for p in work.glob("grandchild-*")]
        for n in (1, 2):             # they have streamed usage, so a kill has something to charge
            await wait_streamed(env, run, n)
        sup.cancel(run)
        await sup.live[run.id].finished.wait()
    assert run.status == "cancelled"
    assert not any(pid_alive(p) for p in pids)
    assert [agent_json(env, run, n)["state"] for n in (1, 2)] == ["cancelled", "cancelled"]
    assert process_records(env.state / "procs") == []
    assert env.services.supervisor.runs[run.id].spent_usd > 0      # killed agents are charged


async def test_agent_that_exits_leaving_grandchild_on_stdout_completes(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    # The grandchild sleeps 300 s holding stdout: waiting for EOF would hit this hard timeout.
    run = await run_to_end(env, "return await agent('grandchild')", keepWork=True, timeout=60)
    assert result_of(env, run) == "left a grandchild"
    gc = int(next(env.services.store.work_dir(run).glob("grandchild-*")).read_text())
    assert not pid_alive(gc)


async def test_missing_result_is_failure_with_estimated_cost(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, "return await agent('noresult', { model: 'claude-opus-5-5' })")
    assert result_of(env, run) is None
    a = agent_json(env, run, 1)
    assert a["state"] == "failed" and "without a result" in a["error"]
    assert a["exitCode"] == 1
    assert a["estimated"] is True and a["costUsd"] == pytest.approx(200_001 * 4 / 1e6 + 1 * 20 / 1e6, rel=1e-3)


async def test_timeout_kills_agent(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, "return await agent('sleep:30', { timeoutMs: 1000 })")
    a = agent_json(env, run, 1)
    assert a["state"] == "failed" and "timed out after 1000 ms" in a["error"]
    assert result_of(env, run) is None


@pytest.mark.parametrize("opts,message", [
    ("{ schema: { type: 'array', items: {} } }", "agent({schema}) received an unusable JSON Schema: its root must be"),
    ("{ schema: { type: 'object', properties: {}, required: ['x'] } }", "it requires 'x', which is not in its properties"),
    ("{ agentType: 'code-reviewer' }", "agent({agentType}): agent type 'code-reviewer' not found. Available agents:"),
    ("{ agentType: 'Explore', profile: 'write' }", "agentType 'Explore' is read-only"),
    ("{ phase: 3 }", "opts.phase must be a string"),
    ("{ profile: 'root' }", "opts.profile must be one of"),
    ("{ engine: 'codex' }", "engine 'codex' is not allowed"),
    ("{ effort: 'extreme' }", "opts.effort must be one of"),
    ("{ maxUsd: -1 }", "opts.maxUsd must be above 0"),
    ("{ maxTokens: 5 }", "maxTokens applies to codex agents only"),
    ("{ schema: { type: 'nope' } }", "not a valid JSON Schema"),
    ("{ isolation: 'worktree' }", "isolation: 'worktree' needs a git repository to make the worktree from"),
    ("{ isolation: 'copy' }", "opts.isolation must be 'worktree'"),
    ("{ timeoutMs: 5 }", "opts.timeoutMs must be between"),
    ("'not an object'", "opts must be an object"),
])
async def test_bad_options_throw_in_script(tmp_path: Path, nursery: trio.Nursery, opts: str, message: str) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, f"try {{ await agent('noop', {opts}); }} catch (e) {{ return e.message; }}")
    if "needs a git repository" in message:
        # Its only worktree agent had no repository: the run fails, saying why (issue 28).
        assert run.status == "failed" and message in (run.error or "")
        return
    assert message in result_of(env, run)


async def test_profile_above_caller_max_throws(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, caller_extra={"maxProfile": "read"})
    run = await run_to_end(env, "try { await agent('noop', {profile: 'write'}); } catch (e) { return e.message; }",
                           profile="read")
    assert "above this caller's maxProfile 'read'" in result_of(env, run)


async def test_max_agents_per_run_throws_naming_cap(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, maxAgentsPerRun=3)
    run = await run_to_end(env, "let n = 0;\ntry { for (;;) { await agent('noop'); n++; } }\n"
                                "catch (e) { return { n, m: e.message }; }")
    res = result_of(env, run)
    assert res["n"] == 3 and "maxAgentsPerRun" in res["m"] and "3 agents" in res["m"]


async def test_status_shows_phases_agents_and_costs(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, "await agent('noop', {label: 'first'});\nphase('two');\n"
                                "await parallel([() => agent('noop', {label: 'x'}), () => agent('noop', {label: 'y'})]);")
    from swarmbase.mcpl import tools
    st = tools.call(env.services.supervisor, env.cfg.caller("alice"),
                    {"name": "status", "arguments": {"runId": run.id}})["structuredContent"]
    assert [p["title"] for p in st["phases"]] == ["main", "two"]
    assert [a["label"] for a in st["phases"][0]["agents"]] == ["first"]
    assert sorted(a["label"] for a in st["phases"][1]["agents"]) == ["x", "y"]
    assert all(a["state"] == "done" and a["costUsd"] == 0.01 for p in st["phases"] for a in p["agents"])
    assert st["spentUsd"] == pytest.approx(0.03) and st["agents"] == {"done": 3, "total": 3, "running": 0}


async def test_fifo_across_runs_no_starvation(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, maxConcurrentAgents=2, perRunConcurrency=2,
                            caller_extra={"maxActiveRuns": 5})
    sup = env.services.supervisor
    big = sup.start(env.cfg.caller("alice"), {"script": "return await parallel(Array.from({length: 12}, () => "
                                                          "() => agent('sleep:0.2')))"})
    await trio.sleep(0.5)
    small = sup.start(env.cfg.caller("alice"), {"script": "return await parallel([() => agent('noop'), () => agent('noop')])"})
    with trio.fail_after(60):
        await sup.live[small.id].finished.wait()
        await sup.live[big.id].finished.wait() if big.id in sup.live else None
    big_starts = sorted(agent_json(env, big, n)["startedAt"] for n in range(1, 13))
    small_starts = [agent_json(env, small, n)["startedAt"] for n in (1, 2)]
    # The small run's agents did not wait for the big run to drain.
    assert max(small_starts) < big_starts[-3]


def test_boot_reaper_kills_recorded_group_only_if_start_time_matches(tmp_path: Path) -> None:
    procs = tmp_path / "procs"
    procs.mkdir()
    a = subprocess.Popen(["sleep", "300"], start_new_session=True)
    b = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        (procs / "a.json").write_text(json.dumps({"pgid": a.pid, "startTime": process_start_time(a.pid)}))
        (procs / "b.json").write_text(json.dumps({"pgid": b.pid, "startTime": process_start_time(b.pid) + 1}))
        assert reap_recorded_groups(procs) == ([a.pid], [])
        assert a.wait(timeout=10) == -signal.SIGKILL
        assert b.poll() is None            # a pid whose start time differs is never killed
        assert list(procs.iterdir()) == []
    finally:
        b.kill()
        b.wait()


# -- the ledger -------------------------------------------------------------------------

def test_ledger_reserve_and_settle() -> None:
    lg = Ledger(total=1.0)
    assert lg.try_reserve(0.5) == 0.5
    assert lg.try_reserve(0.4) == 0.4
    assert lg.try_reserve(0.5) == pytest.approx(0.1)      # what is left, if at least $0.03
    assert lg.try_reserve(0.5) is None
    lg.settle(0.5, 0.2)
    assert lg.view() == {"total": 1.0, "spent": 0.2, "reserved": 0.5, "remaining": 0.3}
    lg.settle(0.4, 0.45)                                   # one turn of overshoot is booked
    lg.settle(0.1, 0.1)
    assert lg.spent == pytest.approx(0.75) and lg.reserved == 0
    assert lg.try_reserve(0.02) == pytest.approx(0.02)    # a cap below the minimum is fine


async def test_gate_waits_for_reservations_then_throws_when_nothing_frees(autojump_clock: trio.testing.MockClock) -> None:
    gate = BudgetGate(Ledger(total=1.0))
    first = await gate.reserve(1.0)
    got: list[float] = []

    async def second() -> None:
        got.append(await gate.reserve(0.5))

    with trio.fail_after(100):
        async with trio.open_nursery() as n:
            n.start_soon(second)
            await trio.sleep(5)
            assert got == []                  # waiting while the first holds its reservation
            gate.settle(first, 0.6)           # $0.40 comes back
        assert got == [pytest.approx(0.4)]
        gate.settle(got[0], 0.4)
        with pytest.raises(BudgetSpent, match="budget is spent"):
            await gate.reserve(0.5)


async def test_an_agents_end_does_not_wait_for_its_home_to_be_deleted(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Deleting a CLI agent's private home (hundreds of files for a real CLI) happens in
    the background: with the delete held, the agents end and the run completes; released,
    the homes go. The dirs were moved aside first, so an agent of the same key would get a
    fresh one."""
    env = await fake_daemon(tmp_path, nursery)
    homes = env.state / "homes"
    deleter = env.services.launcher.deleter
    release = threading.Event()
    asked: list[Path] = []

    def slow_remove(path: Path) -> None:
        asked.append(path)
        release.wait(60)
        remove_tree(path)
    deleter.remove = slow_remove
    try:
        run = await run_to_end(env, "return await parallel([1, 2, 3].map((i) => () => agent(`noop ${i}`)));",
                               timeout=60)
        assert run.status == "completed", run.error
        assert [a["state"] for a in (agent_json(env, run, n) for n in (1, 2, 3))] == ["done"] * 3
        left = sorted(p.name for p in homes.iterdir())
        assert len(left) >= 3 and all(name.startswith(".gone-") for name in left), left
        assert deleter.pending >= 3
    finally:
        release.set()
    await homes_emptied(homes)
    assert asked and deleter.pending == 0
