"""The codex engine: the real Codex CLI (tests/install.sh) through the meter to a fake
Responses API on loopback, inside Debian's bubblewrap. These must not skip."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from swarmbase import config
from swarmbase.engines import codex, codex_agent
from swarmbase.engines.strict_schema import StrictSchemaError, strict

from .conftest import GATEWAY, agent_json, codex_daemon, process_records, result_of, run_to_end
from .fakes.responses_api import FakeResponses

@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeResponses:
    return await nursery.start(FakeResponses().serve)


async def test_usage_across_requests_in_one_turn(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                                 api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    run = await run_to_end(env, "return await agent('three requests [[multi:3]]', {engine: 'codex', label: 'm'})",
                           timeout=90)
    assert run.status == "completed", run.error
    assert result_of(env, run) == "done"
    a = agent_json(env, run, 1)
    assert a["state"] == "done", a["error"]
    assert a["tokens"]["total"] == 3 * 1100 and a["tokens"]["input"] == 3000 and a["tokens"]["output"] == 300
    assert a["costUsd"] == 0 and a["estimated"] is False          # no price row: $0, bounded by tokens
    posts = [r for r in api.requests if r["path"] == "/responses"]
    assert len(posts) == 3
    for r in posts:
        assert r["headers"]["authorization"] == f"Bearer {GATEWAY}"
        assert r["headers"]["x-gate-origin"] == "swarmbase"
        assert r["headers"]["x-gate-channel"] == run.id
        assert r["headers"]["x-gate-counterparty"] == "1:m"
        assert r["body"]["model"] == "gpt-5.5"
    ledger = env.services.supervisor.runs[run.id]
    assert ledger.spent_usd == 0


async def test_priced_model_is_costed(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                      api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url, prices={"gpt-5.5": {"input": 2, "output": 10}})
    run = await run_to_end(env, "return await agent('hi', {engine: 'codex', effort: 'max'})", timeout=90)
    a = agent_json(env, run, 1)
    assert a["costUsd"] == pytest.approx((1000 * 2 + 100 * 10) / 1e6)
    assert run.spent_usd == pytest.approx(a["costUsd"])
    body = next(r for r in api.requests if r["path"] == "/responses")["body"]
    assert body["reasoning"]["effort"] == "xhigh"                 # max is sent as xhigh


async def test_token_ceiling_mid_stream_stops_agent_and_closes_upstream(tmp_path: Path, nursery: trio.Nursery,
                                                                        codex_bin: str, api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    run = await run_to_end(env, "return await agent('long [[long:3000]]', {engine: 'codex', maxTokens: 60000})",
                           timeout=90)
    assert result_of(env, run) is None
    a = agent_json(env, run, 1)
    assert a["state"] == "failed" and "token ceiling of 60,000 crossed" in a["error"]
    with trio.fail_after(10):
        while api.disconnects < 1:
            await trio.sleep(0.05)
    assert process_records(env.state / "procs") == []


async def test_token_budget_exhaustion_throws_in_script(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                                        api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    script = """
let n = 0;
try { for (let i = 0; i < 50; i++) { if (await agent('go ' + i, {engine: 'codex', maxTokens: 60000}) !== null) n++; } }
catch (e) { return { n, message: e.message, tokens: { spent: budget.codex.spent, reserved: budget.codex.reserved } }; }
return { n, message: null, tokens: { spent: budget.codex.spent, reserved: budget.codex.reserved } };"""
    # Each agent uses 1,100 tokens and reserves what is left (under its 60,000 ceiling).
    # Once that is below the meter's estimate of a request (~9k here), the agent is stopped
    # mid-stream and charged the estimate; then nothing is left and agent() throws.
    run = await run_to_end(env, script, budgetTokens=14_000, timeout=120)
    res = result_of(env, run)
    assert res["message"] is not None and "token budget is spent" in res["message"], res
    assert res["n"] >= 3
    assert res["tokens"]["spent"] >= 14_000 and res["tokens"]["reserved"] == 0


async def test_meter_refuses_dead_bearers_and_other_paths(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                                          api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    meter = env.services.meter
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": "return await agent('[[hang]]', {engine: 'codex', timeoutMs: 60000})"})
    with trio.fail_after(60):
        while not meter.agents or not any(r["path"] == "/responses" for r in api.requests):
            await trio.sleep(0.02)
    bearer = next(iter(meter.agents))
    async with httpx.AsyncClient(base_url=meter.url) as c:
        live = {"Authorization": f"Bearer {bearer}"}
        assert (await c.post("/v1/models", headers=live)).status_code == 404
        assert (await c.get("/responses", headers=live)).status_code == 404
        assert (await c.post("/responses", json={})).status_code == 401
        assert (await c.post("/responses", json={}, headers={"Authorization": "Bearer nope"})).status_code == 401
        sup.cancel(run)
        with trio.fail_after(30):
            await sup.live[run.id].finished.wait()
        assert (await c.post("/responses", json={"input": []}, headers=live)).status_code == 401
    assert not meter.agents
    # Killing the agent closed its in-flight upstream request.
    with trio.fail_after(10):
        while api.disconnects < 1:
            await trio.sleep(0.05)
    assert agent_json(env, run, 1)["state"] == "cancelled"


async def test_strict_schemas(tmp_path: Path, nursery: trio.Nursery, codex_bin: str, api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    script = """
const out = {};
const loose = { type: 'object', properties: { a: { type: 'string' }, b: { type: 'string' } }, required: ['a'] };
try { await agent('x', { engine: 'codex', schema: loose }); } catch (e) { out.missing = e.message; }
const extras = { type: 'object', properties: { a: { type: 'object', properties: {}, additionalProperties: true } }, required: ['a'] };
try { await agent('x', { engine: 'codex', schema: extras }); } catch (e) { out.extras = e.message; }
const good = { type: 'object', properties: { a: { type: 'string' }, n: { type: ['integer', 'null'] } }, required: ['a', 'n'] };
out.ok = await agent('[[text:{"a": "yes", "n": null}]]', { engine: 'codex', schema: good });
out.bad = await agent('[[text:not json]]', { engine: 'codex', schema: good }).catch((e) => e.message);
out.deep = await agent('[[text:' + '{"a":'.repeat(150) + '1' + '}'.repeat(150) + ']]', { engine: 'codex', schema: good }).catch((e) => e.message);
return out;"""
    run = await run_to_end(env, script, timeout=120)
    res = result_of(env, run)
    assert "properties.b is missing from required" in res["missing"]
    assert "properties.a allows extra properties" in res["extras"]
    assert res["ok"] == {"a": "yes", "n": None}
    # agent({schema}) throws without a valid object (Claude Code's rule), on codex too.
    assert res["bad"].startswith("agent({schema}): agent 4 returned no valid structured output")
    sent = [r["body"] for r in api.requests if r["path"] == "/responses"][0]
    assert sent["text"]["format"]["schema"]["additionalProperties"] is False
    # The two refused calls got numbers but never started: the good one is agent 3.
    assert agent_json(env, run, 3)["state"] == "done"
    assert "not JSON" in agent_json(env, run, 4)["error"]
    # A hostile answer nested 150 deep fails that agent only, naming the limit.
    assert res["deep"] is None and run.status == "completed"
    assert agent_json(env, run, 5)["error"] == "the structured output nests deeper than 100 levels (the limit)"


def test_strict_schema_adds_additional_properties_false_everywhere() -> None:
    s = strict({"type": "object", "required": ["x"], "properties": {"x": {"type": "array", "items": {
        "type": "object", "required": ["y"], "properties": {"y": {"type": "string"}}}}}})
    assert s["additionalProperties"] is False
    assert s["properties"]["x"]["items"]["additionalProperties"] is False
    with pytest.raises(StrictSchemaError, match=r"properties\.x\.items\.properties\.z is missing"):
        strict({"type": "object", "required": ["x"], "properties": {"x": {"type": "array", "items": {
            "type": "object", "required": [], "properties": {"z": {"type": "string"}}}}}})


async def test_isolation_denies_secrets_and_hides_gateway_token(tmp_path: Path, nursery: trio.Nursery,
                                                                codex_bin: str, api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    first = await run_to_end(env, "return 'an earlier run'")
    other_records = env.services.store.dir(first) / "run.json"
    ws = tmp_path / "roots" / "ws"
    ws.mkdir()
    (ws / ".env").write_text("DOTENV-SECRET-VALUE\n")
    (ws / "readme.txt").write_text("VISIBLE-CONTENT\n")
    targets = {"key": env.cfg.caller("alice").apiKeyFile, "config": str(env.cfg.path),
               "records": str(other_records), "dotenv": str(ws / ".env"), "ok": str(ws / "readme.txt")}
    argvs: list[bytes] = []

    async def watch() -> None:
        while True:
            for p in Path("/proc").iterdir():
                if p.name.isdigit():
                    try:
                        cmd = (p / "cmdline").read_bytes()
                    except OSError:
                        continue
                    if b"codex" in cmd:
                        argvs.append(cmd)
            await trio.sleep(0.02)

    nursery.start_soon(watch)
    script = ("const out = {};\nfor (const [k, p] of Object.entries(args)) {\n"
              "  out[k] = await agent('[[shell:cat ' + p + ']]', {engine: 'codex', profile: 'read', cwd: "
              + json.dumps(str(ws)) + ", label: k});\n}\n"
              "out.env = await agent('[[shell:env]]', {engine: 'codex', profile: 'read', cwd: " + json.dumps(str(ws)) + "});\n"
              "return out;")
    run = await run_to_end(env, script, args=targets, timeout=240)
    assert run.status == "completed", run.error
    out = result_of(env, run)
    assert "VISIBLE-CONTENT" in out["ok"]
    assert GATEWAY not in out["key"] and ("No such file" in out["key"] or "denied" in out["key"])
    assert "tokenSha256" not in out["config"]
    assert '"caller"' not in out["records"] and "an earlier run" not in out["records"]
    assert "DOTENV-SECRET-VALUE" not in out["dotenv"] and "Permission denied" in out["dotenv"]
    assert "SWARMBASE" in out["env"] or "PATH" in out["env"]      # the shell did print its environment
    assert GATEWAY not in out["env"]
    assert argvs and not any(GATEWAY.encode() in a for a in argvs)
    transcripts = "".join(p.read_text() for p in env.services.store.dir(run).rglob("transcript.jsonl"))
    assert GATEWAY not in transcripts and "VISIBLE-CONTENT" in transcripts


def test_sandbox_none_offers_read_write_only_to_write_callers() -> None:
    assert codex_agent.effective_profile("read", False, "read") == "think"
    assert codex_agent.effective_profile("write", False, "write") == "write"
    assert codex_agent.effective_profile("read", True, "read") == "read"
    think = codex.config_toml(codex.CodexCall(bin="codex", cwd="/w", codex_home="/h", profile="think", model="m",
                                              effort=None, meter_url="http://127.0.0.1:1", deny=["/s/k.key"]))
    assert "shell_tool = false" in think and 'web_search = "disabled"' in think and '"/s/k.key" = "deny"' in think
    assert '":workspace_roots"' not in think and "enabled = false" in think
    write = codex.config_toml(codex.CodexCall(bin="codex", cwd="/w", codex_home="/h", profile="write", model="m",
                                              effort="max", meter_url="u", deny=[], network=True))
    assert '":workspace_roots" = "write"' in write and 'model_reasoning_effort = "xhigh"' in write
    assert "[permissions.swarm-write.network]\nenabled = true" in write


def test_bwrap_configured_but_missing_refuses_start(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "codex").write_text("#!/bin/sh\n")
    (b / "codex").chmod(0o755)
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"engines": {"codex": {"bin": "codex", "baseUrl": "http://gw"}}}))
    with pytest.raises(config.ConfigError, match="bubblewrap is not installed.*apt-get install bubblewrap.*\"none\""):
        config.load(p, search_path=str(b))
    p.write_text(json.dumps({"engines": {"codex": {"bin": "codex", "baseUrl": "http://gw", "sandbox": "none",
                                                   "defaultModel": "gpt-5.5"}}, "homesDir": "/var/lib/sb-homes"}))
    assert config.load(p, search_path=str(b)).sandbox_mode == "none"     # the old key is read as the daemon-wide one
    p.write_text(json.dumps({"engines": {"codex": {"bin": "codex"}}, "sandbox": "none"}))   # no baseUrl: engine off
    assert config.load(p, search_path=str(b)).engines.codex is None


async def test_token_refusal_returns_the_usd_reservation(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                                         api: FakeResponses) -> None:
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    script = ("try { await agent('x', {engine: 'codex'}); } catch (e) { return { m: e.message, usd: budget.usd.reserved,"
              " remaining: budget.usd.remaining }; }")
    run = await run_to_end(env, script, budgetTokens=500, budgetUsd=2)
    res = result_of(env, run)
    assert "token budget is spent" in res["m"]
    assert res["usd"] == 0 and res["remaining"] == 2          # nothing left held after the refusal
