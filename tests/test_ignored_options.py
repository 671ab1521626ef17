"""Options Claude Code's runtime accepts are accepted (issue 28 item 4): an agent() option
SwarmBase does not know is ignored with one run-log line naming it (and a "did you mean"),
and `disallowedTools` takes those tools away from the agent's CLI (a profile left without
its own tools runs as the one below)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from swarmbase.engines import claude

from .conftest import agent_json, dumps, fake_daemon, result_of, run_to_end


def log_lines(env, run) -> list[str]:  # type: ignore[no-untyped-def]
    path = env.services.store.dir(run) / "log.jsonl"
    return [json.loads(ln)["message"] for ln in path.read_text().splitlines() if ln.strip()]


async def test_unknown_options_are_ignored_and_named_once_in_the_log(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    script = """
const a = await agent('noop', { label: 'first', retries: 0, modle: 'x' });
const b = await agent('noop', { label: 'second', timeoutMs: 60000 });
return [a, b];"""
    run = await run_to_end(env, script)
    assert run.status == "completed", run.error
    assert result_of(env, run) == ["noop", "noop"]
    ignored = [ln for ln in log_lines(env, run) if "ignored option" in ln]
    assert ignored == ["agent 1 (first): ignored options 'retries' (did you mean 'schemaRetries'?), "
                       "'modle' (did you mean 'model'?): SwarmBase does not know them"]


async def test_disallowed_tools_leave_the_cli_and_can_lower_the_profile(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    script = """
await agent('dump one', { profile: 'write', disallowedTools: ['Bash'] });
await agent('dump two', { profile: 'write', disallowedTools: ['Edit', 'Write', 'Bash'] });
return 1;"""
    run = await run_to_end(env, script, keepWork=True, profile="write")
    assert run.status == "completed", run.error
    one, two = dumps(env, run)
    assert "--tools=Read,Grep,Glob,WebFetch,WebSearch,Edit,Write" in one["argv"]
    assert "--disallowedTools=Bash" in one["argv"]
    allowed = one["argv"][one["argv"].index("--allowedTools") + 1]
    assert "Bash" not in allowed.split(",") and "Edit(" in allowed
    assert "--tools=Read,Grep,Glob,WebFetch,WebSearch" in two["argv"]       # a read agent now
    assert agent_json(env, run, 2)["profile"] == "read"
    bad = await run_to_end(env, "try { await agent('noop', { disallowedTools: 'Bash' }) } catch (e) { return e.message }")
    assert "opts.disallowedTools must be an array of tool names" in result_of(env, bad)


def test_a_disallowed_value_is_one_argv_word() -> None:
    call = claude.ClaudeCall(bin="claude", cwd="/w", profile="read", model=None, effort=None, schema=None,
                             max_usd=1.0, state_dir="/s", user_home="/h", disallowed=["--model=evil", "Read"])
    argv = claude.argv(call)
    assert "--disallowedTools=--model=evil,Read" in argv and "--model=evil" not in argv
    assert "--tools=Grep,Glob,WebFetch,WebSearch" in argv
    assert argv[argv.index("--allowedTools") + 1] == "WebFetch,WebSearch"
