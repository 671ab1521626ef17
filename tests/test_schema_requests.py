"""An agent whose structured output never validates makes no more model requests than
Claude Code's Workflow runtime (issue 33 item 3): by default the CLI's own correction turns
and nothing after them, on the CLI path and the in-daemon think path; each `schemaRetries`
is one more such conversation, its prompt quoting the error. Real daemon, real Node runner,
the real claude CLI against the fake Messages API counting requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from .conftest import agent_json, result_of, run_to_end
from .fakes.anthropic_api import FakeAnthropic
from .think_daemon import SCHEMA, claude_engine, requests_for, think_daemon

PEER_REQUESTS = 4        # Claude Code 2.1.328's Workflow runtime, same fake: an answer that never validates


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


@pytest.mark.parametrize("in_daemon", [True, False], ids=["think-path", "cli-path"])
async def test_never_valid_output_costs_the_peers_requests(tmp_path: Path, nursery: trio.Nursery, api: FakeAnthropic,
                                                           in_daemon: bool) -> None:
    env = await think_daemon(nursery, tmp_path, claude_engine(api.url, in_daemon))
    s = json.dumps(SCHEMA)
    script = f"""
const d = {{ detail: true, schema: {s} }};
const [wrong, prose, retried] = await parallel([
  () => agent("alpha [[structured:{{\\"score\\": \\"high\\"}}]]", d),
  () => agent("beta [[textonly]]", d),
  () => agent("gamma [[structured:{{\\"score\\": \\"low\\"}}]]", {{ ...d, schemaRetries: 1 }}),
]);
return {{ wrong, prose, retried }};
"""
    run = await run_to_end(env, script, timeout=180, profile="think")
    assert run.status == "completed", run.error
    res = result_of(env, run)
    # By default: the CLI's own correction turns (a tool_result error per wrong call, the
    # one enforce turn after prose), no nudge conversation after them.
    for key, marker in (("wrong", "alpha"), ("prose", "beta")):
        sent = requests_for(api, marker)
        assert 1 < len(sent) <= PEER_REQUESTS, (marker, len(sent))
        assert not any("[swarmbase schema nudge]" in r["prompt"] for r in sent)
        assert res[key]["ok"] is False and res[key]["schemaError"]
    a1 = agent_json(env, run, 1)
    assert not [h for h in a1["history"] if "schemaRetry" in h]
    # Each schemaRetries is one more conversation as long as the first, quoting the error.
    sent = requests_for(api, "gamma")
    nudged = [r for r in sent if "[swarmbase schema nudge]" in r["prompt"]]
    assert len(sent) == 2 * len(requests_for(api, "alpha")) and len(nudged) == len(sent) // 2
    assert "did not satisfy the required JSON schema" in nudged[0]["prompt"]
    assert res["retried"]["ok"] is False and res["retried"]["schemaError"]
    assert [h.get("schemaRetry") for h in agent_json(env, run, 3)["history"] if "schemaRetry" in h] == [1]
