"""The codex engine as residents meet it: an agent that runs far past trio's 10 s
thread-cache idle time under bubblewrap, honest prices with the default budget, and a
model that is always known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from swarmbase import config
from swarmbase.runs.quota import QuotaPending

from .conftest import agent_json, codex_daemon, result_of, run_to_end
from .fakes.responses_api import FakeResponses


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeResponses:
    return await nursery.start(FakeResponses().serve)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_codex_agent_lives_past_10_s_under_bwrap(tmp_path: Path, nursery: trio.Nursery, codex_bin: str,
                                                         api: FakeResponses) -> None:
    """Three model responses of 7 s each, two shell calls between them: 21 s and more,
    under the default sandbox (children of the long-lived spawning thread). A trio worker
    thread exits after 10 s idle, and its death once SIGKILLed the agents it forked: the
    second shell call (at 14 s) and the answer (at 21 s) come well after that."""
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url)
    assert env.cfg.sandbox_mode == "bwrap"
    run = await run_to_end(env, "return await agent('slow work [[slowshell:7]]', {engine: 'codex', timeoutMs: 150000})",
                           timeout=170)
    assert run.status == "completed", run.error
    a = agent_json(env, run, 1)
    assert a["state"] == "done", a["error"]
    assert a["durationS"] > 20
    assert result_of(env, run).startswith("slow done:") and "one" in result_of(env, run) and "two" in result_of(env, run)


async def test_default_budget_priced_model_with_a_large_prompt_completes(tmp_path: Path, nursery: trio.Nursery,
                                                                         codex_bin: str, api: FakeResponses) -> None:
    # $5 budget (the caller default) -> each agent's cap is $0.625; a 400 KB prompt is ~100k
    # tokens of input: $0.125 at the input rate, but $1.00 if it were priced as output.
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url,
                             prices={"gpt-5.5": {"input": 1.25, "output": 10}},
                             caller_extra={"runUsdDefault": 5})
    run = await run_to_end(env, "return await agent('read this: ' + 'lorem ipsum '.repeat(35000), {engine: 'codex'})",
                           timeout=120)
    assert run.status == "completed", run.error
    a = agent_json(env, run, 1)
    assert a["state"] == "done", a["error"]
    assert a["costUsd"] == pytest.approx((1000 * 1.25 + 100 * 10) / 1e6)


def test_codex_needs_a_known_model(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "codex").write_text("#!/bin/sh\n")
    (b / "codex").chmod(0o755)
    base = {"engines": {"codex": {"bin": str(b / "codex"), "baseUrl": "http://gw"}}, "sandbox": "none",
            "homesDir": "/var/lib/sb-homes",
            "callers": [{"name": "a", "tokenSha256": "a" * 64, "engines": ["codex"]}]}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(base))
    with pytest.raises(config.ConfigError, match=r"callers\[0\].defaultModels.codex: .*no model is configured"):
        config.load(p)
    base["engines"]["codex"]["defaultModel"] = "gpt-5.5"
    p.write_text(json.dumps(base))
    assert config.load(p).engines.codex.defaultModel == "gpt-5.5"
    base["callers"][0]["models"] = {"codex": ["gpt-6-*"]}
    p.write_text(json.dumps(base))
    with pytest.raises(config.ConfigError, match="default model 'gpt-5.5' is not in its allowlist"):
        config.load(p)


def test_homes_under_the_temp_dir_refused_without_the_sandbox(tmp_path: Path) -> None:
    b = tmp_path / "bin"
    b.mkdir()
    (b / "codex").write_text("#!/bin/sh\n")
    (b / "codex").chmod(0o755)
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"engines": {"codex": {"bin": str(b / "codex"), "baseUrl": "http://gw",
                                                   "defaultModel": "gpt-5.5"}}, "sandbox": "none"}))
    with pytest.raises(config.ConfigError, match="homesDir: .* is under the temp dir.*Set homesDir"):
        config.load(p)


async def test_a_codex_agent_without_a_price_row_costs_nothing(tmp_path: Path, nursery: trio.Nursery,
                                                                codex_bin: str, api: FakeResponses) -> None:
    """The engine's default model (no caller default) is sent, and with no price row the
    agent is $0 of the USD budget — never a claude row."""
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url, caller_extra={"defaultModels": {}},
                             engine_extra={"defaultModel": "gpt-6-astra"})
    run = await run_to_end(env, "return await agent('hi', {engine: 'codex', detail: true})", timeout=90)
    res = result_of(env, run)
    assert res["ok"] and res["costUsd"] == 0
    assert next(r for r in api.requests if r["path"] == "/responses")["body"]["model"] == "gpt-6-astra"
    assert agent_json(env, run, 1)["priced"] is False


async def test_an_unpriced_model_is_refused_for_a_caller_with_a_usd_quota(tmp_path: Path, nursery: trio.Nursery,
                                                                         codex_bin: str, api: FakeResponses) -> None:
    """Issue 31 #6: an unpriced agent counts $0, so a USD quota would not bound it; the
    agent() call is refused with the reason, and a priced model still runs."""
    env = await codex_daemon(tmp_path, nursery, codex_bin, api.url, caller_extra={"usdPerDay": 5},
                             prices={"gpt-5.5-priced": {"input": 2, "output": 10}})
    # The quota's history is read in a thread at start; a run before that is refused as
    # pending (tested in test_quota), which is not what this test is about.
    with trio.fail_after(30):
        while True:
            try:
                env.services.supervisor.quota.windows(env.cfg.caller("alice"))
                break
            except QuotaPending:
                await trio.sleep(0.05)
    run = await run_to_end(env, """
const out = {};
try { await agent('hi', {engine: 'codex', model: 'gpt-6-astra'}); } catch (e) { out.refused = e.message; }
out.priced = await agent('hi', {engine: 'codex', model: 'gpt-5.5-priced'});
return out;""", timeout=90)
    res = result_of(env, run)
    assert "model 'gpt-6-astra' on codex has no price row" in res["refused"]
    assert "usdPerDay/usdPerMonth" in res["refused"] and "`prices` row" in res["refused"]
    assert res["priced"] == "done"
    assert [r["body"]["model"] for r in api.requests if r["path"] == "/responses"] == ["gpt-5.5-priced"]
