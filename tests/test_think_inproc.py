"""Think agents inside the daemon (issue 23 item 1): one streamed Messages API request (or
Responses API request for codex) made by the daemon, against the fake model APIs on
loopback, through the real daemon's run path (daemon.serve, the supervisor, the Node
runner). The CLI path stays for agents with tools and for `inProcessThink: false`; the
real CLIs are what those tests start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio


from .clidaemon import cli_daemon, run_script
from .conftest import agent_json, result_of, run_to_end, write_config
from .fakes.anthropic_api import FakeAnthropic
from .fakes.responses_api import FakeResponses
from .think_daemon import CANARY, CODEX, SCHEMA, claude_engine, requests_for, think_daemon, transcript

@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


def in_daemon_only(requests: list[dict[str, Any]]) -> bool:
    """Every request came from the daemon itself, none from a CLI (claude-cli/…, codex_exec/…)."""
    return bool(requests) and all(r["headers"].get("user-agent", "").startswith("swarmbase") for r in requests)


async def test_think_agents_are_requests_made_by_the_daemon(tmp_path: Path, nursery: trio.Nursery,
                                                            api: FakeAnthropic) -> None:
    env = await think_daemon(nursery, tmp_path, claude_engine(api.url))
    s = json.dumps(SCHEMA)
    script = f"""
const d = {{ detail: true }};
const [plain, obj, nudged, leak, limited, cut, capped] = await parallel([
  () => agent("say it [[text:hello there]]", {{ label: "plain" }}),
  () => agent("rate [[structured:{{\\"score\\": 4}}]]", {{ schema: {s} }}),
  () => agent("rate later [[badonce:{{\\"score\\": 2}}]]", {{ schema: {s}, schemaRetries: 1 }}),
  () => agent("leak [[echokey]]"),
  () => agent("busy [[429:1]] [[text:after the wait]]", {{ label: "limited" }}),
  () => agent("[[cut]]", {{ ...d }}),
  () => agent("[[drip:400]]", {{ ...d, maxUsd: 0.02 }}),
]);
return {{ plain, obj, nudged, leak, limited, cut, capped }};
"""
    run = await run_to_end(env, script, timeout=120, profile="think")
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert in_daemon_only(api.requests)                          # not one CLI for seven agents
    # A plain agent: one request, the CLI's result shape, cost from usage × the model's row.
    assert res["plain"] == "hello there"
    assert len(requests_for(api, "say it")) == 1
    a1 = agent_json(env, run, 1)
    assert a1["state"] == "done" and a1["costUsd"] == pytest.approx(0.005) and a1["estimated"] is False
    assert a1["tokens"]["input"] == 1000 and a1["tokens"]["output"] == 50
    lines = transcript(env, run, 1)
    assert lines[0]["type"] == "system" and lines[0]["subtype"] == "init"
    assert [ln["type"] for ln in lines[1:]] == ["assistant", "result"]
    req = requests_for(api, "say it")[0]
    assert req["headers"]["x-api-key"] == CANARY
    assert req["headers"]["x-gate-channel"] == run.id and req["headers"]["x-gate-counterparty"] == "1:plain"
    assert req["body"]["model"] == "claude-opus-5-5" and req["body"]["tools"] == []
    assert "return value" in req["body"]["system"][0]["text"]              # the framing note
    # A schema agent: a StructuredOutput tool call ends it, with no second request.
    assert res["obj"] == {"score": 4}
    structured = requests_for(api, "rate [[structured")
    assert len(structured) == 1
    assert [t["name"] for t in structured[0]["body"]["tools"]] == ["StructuredOutput"]
    assert structured[0]["body"]["tools"][0]["input_schema"] == SCHEMA
    # Prose twice (the CLI's enforce turn), then the agent service's schema nudge succeeds.
    assert res["nudged"] == {"score": 2}
    nudges = requests_for(api, "rate later")
    assert len(nudges) == 3 and "[swarmbase schema nudge]" in nudges[2]["prompt"]
    assert "structured-output-enforce" in json.dumps(nudges[1]["body"]["messages"])
    a3 = agent_json(env, run, 3)
    assert [h.get("schemaRetry") for h in a3["history"] if "schemaRetry" in h] == [1]
    assert a3["costUsd"] == pytest.approx(3 * 0.005)
    # 429 with retry-after: waited, retried, done; the retry is in the transcript.
    assert res["limited"] == "after the wait"
    assert len(requests_for(api, "busy")) == 2
    retry = [ln for ln in transcript(env, run, 5) if ln.get("subtype") == "api_retry"]
    assert len(retry) == 1 and retry[0]["error_status"] == 429 and retry[0]["retry_delay_ms"] == 1000
    # A stream cut mid-message: a clear failure, charged what streamed, marked estimated.
    assert res["cut"]["ok"] is False and "mid-message" in res["cut"]["error"]
    a6 = agent_json(env, run, 6)
    assert a6["state"] == "failed" and a6["estimated"] is True and a6["costUsd"] >= 0.004
    # A cap crossed mid-stream: stopped there, the error names opts.maxUsd, charged what streamed.
    assert res["capped"]["ok"] is False and "maxUsd" in res["capped"]["error"]
    a7 = agent_json(env, run, 7)
    assert a7["state"] == "failed" and a7["estimated"] is True
    assert 0.02 < a7["costUsd"] < 0.04
    assert api.drip_sent < 400
    with trio.fail_after(30):
        while api.disconnects < 1:          # the daemon closed the stream it stopped reading
            await trio.sleep(0.05)
    # Secrets: the model echoed the key; no record, transcript or log under the state dir has it.
    assert res["leak"] == "the key is [redacted]"
    for p in env.state.rglob("*"):
        if p.is_file():
            assert CANARY not in p.read_text(errors="replace"), p


async def test_cancel_mid_stream_destroys_the_request(tmp_path: Path, nursery: trio.Nursery,
                                                      api: FakeAnthropic) -> None:
    env = await think_daemon(nursery, tmp_path, claude_engine(api.url))
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": "return await agent('[[drip:4000]]');",
                                                  "profile": "think"})
    live = sup.live[run.id]
    with trio.fail_after(60):
        while api.drip_sent < 5:
            await trio.sleep(0.02)
        while live.agents[1].row()["tokens"] <= 1000:        # live usage: input, then the streamed text
            await trio.sleep(0.02)
    row = live.agents[1].row()
    assert row["state"] == "running" and row["costUsd"] > 0.004
    sup.cancel(run)
    with trio.fail_after(30):
        await live.finished.wait()
        while api.disconnects < 1:
            await trio.sleep(0.02)
    sent = api.drip_sent
    await trio.sleep(0.5)                    # the fake would go on writing into an open stream
    assert api.drip_sent == sent < 4000
    a = agent_json(env, run, 1)
    assert a["state"] == "cancelled" and a["estimated"] is True and a["costUsd"] > 0
    assert in_daemon_only(api.requests)


async def test_resume_replays_across_the_two_paths(tmp_path: Path, api: FakeAnthropic) -> None:
    """A run made with CLIs resumes inside the daemon with every agent replayed, and the
    reverse; the opt-out (and an agent with tools) really starts the CLI."""
    script = ("const r = await parallel([1, 2, 3].map((i) => () => agent(`item ${i} [[text:ok ${i}]]`)));\n"
              "return r.join(',');")

    async def one(in_daemon: bool, resume_of: Any = None, profile_check: bool = False) -> tuple[Any, int, int]:
        async with trio.open_nursery() as n:
            env = await think_daemon(n, tmp_path, claude_engine(api.url, in_daemon))
            sup = env.services.supervisor
            before = len(api.requests)
            if resume_of is None:
                run = await run_to_end(env, script, timeout=120, profile="think")
            else:
                run = sup.resume(env.cfg.caller("alice"), resume_of.id, {})
                with trio.fail_after(120):
                    await sup.live[run.id].finished.wait()
                assert all(agent_json(env, run, i)["replayed"] for i in (1, 2, 3))
            assert run.status == "completed", run.error
            assert result_of(env, run) == "ok 1,ok 2,ok 3"
            mine = api.requests[before:]
            spawned = sum("claude-cli" in r["headers"].get("user-agent", "") for r in mine)
            if profile_check:       # an agent with tools takes the CLI whatever inProcessThink says
                r = await run_to_end(env, "return await agent('look [[text:seen]]', {profile: 'read'});", timeout=120)
                assert result_of(env, r) == "seen"
                assert "claude-cli" in api.requests[-1]["headers"].get("user-agent", "")
            n.cancel_scope.cancel()
        return run, spawned, len(api.requests) - before

    cli_run, spawned, asked = await one(False)
    assert spawned == 3 and asked == 3                      # the opt-out: one claude -p per agent
    _, spawned, asked = await one(True, cli_run, profile_check=True)
    assert spawned == 0 and asked == 1                      # three replayed; the read agent's request
    fresh, spawned, asked = await one(True)
    assert spawned == 0 and asked == 3
    _, spawned, asked = await one(False, fresh)
    assert spawned == 0 and asked == 0                      # replayed on the CLI path too


async def test_codex_think_through_the_responses_api(tmp_path: Path, nursery: trio.Nursery) -> None:
    if not CODEX.exists():
        pytest.fail(f"the Codex CLI is not installed at {CODEX}: run bash tests/install.sh")
    fake = await nursery.start(FakeResponses().serve)
    env = await think_daemon(nursery, tmp_path, {"codex": {"bin": str(CODEX), "baseUrl": fake.url,
                                                           "inProcessThink": True}})
    s = json.dumps(SCHEMA)
    script = f"""
const plain = await agent("hello", {{ engine: "codex", label: "cx" }});
const obj = await agent("rate [[badonce:{{\\"score\\": 5}}]]", {{ engine: "codex", schema: {s} }});
const big = await agent("[[long:400]]", {{ engine: "codex", maxTokens: 5000, detail: true }});
return {{ plain, obj, big }};
"""
    run = await run_to_end(env, script, timeout=120, profile="think")
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert in_daemon_only([r for r in fake.requests if r["path"] == "/responses"])
    assert res["plain"] == "done" and res["obj"] == {"score": 5}
    posts = [r for r in fake.requests if r["path"] == "/responses"]
    assert len(posts) == 4                                   # plain, the bad answer, its nudge, big
    first = posts[0]
    assert first["headers"]["authorization"] == f"Bearer {CANARY}"
    assert first["headers"]["x-gate-channel"] == run.id and first["headers"]["x-gate-counterparty"] == "1:cx"
    assert first["body"]["model"] == "gpt-5.5" and first["body"]["tools"] == []
    assert posts[1]["body"]["text"]["format"]["type"] == "json_schema"
    a1 = agent_json(env, run, 1)
    assert a1["tokens"]["input"] == 1000 and a1["tokens"]["output"] == 100 and a1["estimated"] is False
    assert [json.loads(ln)["type"] for ln in (env.services.store.dir(run) / "agents" / "1" / "transcript.jsonl")
            .read_text().splitlines()] == ["thread.started", "turn.started", "item.completed", "turn.completed"]
    # The token ceiling crossed mid-stream: stopped (the fake saw the client go), marked estimated.
    assert res["big"]["ok"] is False and "token ceiling" in res["big"]["error"]
    assert agent_json(env, run, 3)["estimated"] is True
    with trio.fail_after(30):
        while fake.disconnects < 1:
            await trio.sleep(0.05)


@pytest.mark.parametrize("in_daemon", [False, True], ids=["cli", "in-daemon"])
async def test_a_stream_cut_mid_message_is_retried_like_the_cli(tmp_path: Path, nursery: trio.Nursery,
                                                                api: FakeAnthropic, in_daemon: bool) -> None:
    """Issue 32 #13: a stream that ends without message_stop, and a connection dropped
    mid-response, are retried with the same prompt, on both paths (`claude -p` is the
    reference: it retries and succeeds); the cut attempt's input is charged, estimated."""
    env = await think_daemon(nursery, tmp_path, claude_engine(api.url, in_daemon=in_daemon))
    script = ("return await parallel([() => agent('[[cutonce]] a', {detail: true}), "
              "() => agent('[[droponce]] b', {detail: true})])")
    run = await run_to_end(env, script, timeout=120, profile="think")
    assert run.status == "completed", run.error
    cut, dropped = result_of(env, run)
    assert (cut["ok"], cut["value"]) == (True, "recovered"), cut
    assert (dropped["ok"], dropped["value"]) == (True, "recovered"), dropped
    assert len(requests_for(api, "[[cutonce]] a")) == 2 and len(requests_for(api, "[[droponce]] b")) == 2
    assert in_daemon_only(api.requests) is in_daemon
    if in_daemon:
        for n in (1, 2):
            a = agent_json(env, run, n)
            assert a["costUsd"] > 0.005 and a["estimated"] is True      # the cut attempt's input too
            assert [ln["subtype"] for ln in transcript(env, run, n) if ln.get("subtype") == "api_retry"] == ["api_retry"]

async def test_the_daemon_log_has_no_line_per_model_request(tmp_path: Path, api: FakeAnthropic) -> None:
    """`python -m swarmbase` configures logging: httpx's INFO "HTTP Request: …" line per
    request (one per think agent's turn) is not in the daemon's log."""
    key_file = tmp_path / "alice.key"
    key_file.write_text(CANARY + "\n")
    key_file.chmod(0o600)
    path, tokens = write_config(tmp_path / "state", callers=["alice"], engines=claude_engine(api.url),
                                caller_extra={"apiKeyFile": str(key_file), "maxProfile": "read"})
    script = "return await parallel([1, 2].map((i) => () => agent(`say ${i} [[text:ok ${i}]]`)));"
    async with cli_daemon(path) as d:
        _, notice, res = await run_script(d.ws, tokens["alice"], script, profile="think")
        assert res == ["ok 1", "ok 2"], notice
    assert len(api.requests) == 2 and in_daemon_only(api.requests)
    log = d.stderr.decode(errors="replace")
    assert "listening on" in log                         # the log was captured
    assert "HTTP Request:" not in log and "httpx" not in log, log
