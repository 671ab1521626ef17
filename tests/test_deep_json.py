"""Deeply nested JSON wherever a value crosses into the daemon: a script's return value,
workflow args and agent options (the runner bridge), a tool's arguments (MCPL), and a
model's structured answer (the real Claude Code CLI answering StructuredOutput from the
fake API). Each is refused with an error naming the limit and fails only what carried it:
never the run with "internal error: ExceptionGroup", never the daemon."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import json_depth
from swarmbase.client import HostClient, connect
from swarmbase.engines.meter import event_data
from swarmbase.script.runner import RunnerLimits, run_script

from .clidaemon import cli_daemon
from .conftest import write_config
from .fakes.anthropic_api import FakeAnthropic
from .script_host import Host

LIMIT = json_depth.MAX_DEPTH


def nested(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


def test_depth_is_counted_in_levels_and_bounded_without_recursion() -> None:
    assert not json_depth.deeper_than(nested(LIMIT), LIMIT) and json_depth.deeper_than(nested(LIMIT + 1), LIMIT)
    assert not json_depth.deeper_than({"a": 1, "b": [2, {"c": 3}]}, 3)
    assert json_depth.deeper_than({"a": 1, "b": [2, {"c": [3]}]}, 3)
    assert json_depth.loads(json.dumps(nested(LIMIT))) == nested(LIMIT)
    wide = json.dumps([[i] for i in range(10_000)])           # many brackets, shallow
    assert len(json_depth.loads(wide)) == 10_000
    for text in ("[" * (LIMIT + 1) + "]" * (LIMIT + 1), "[" * 100_000 + "]" * 100_000):
        with pytest.raises(json_depth.TooDeep, match=f"deeper than {LIMIT} levels"):
            json_depth.loads(text)
    with pytest.raises(ValueError):
        json_depth.loads("[" * 100_000)                        # never closed: still just bad JSON


def test_a_deep_event_from_the_model_api_is_not_read_by_the_meter() -> None:
    assert event_data(b'data: {"type": "response.completed", "usage": {"input_tokens": 3}}') == {
        "type": "response.completed", "usage": {"input_tokens": 3}}
    assert event_data(b"data: " + b"[" * 5000 + b"]" * 5000) is None


# A runner that breaks protocol: what the daemon's side of the bridge does with values the
# real runner's hooks would have refused first.
DEEP_RUNNER = r"""
import json, sys
def w(text):
    sys.stdout.write(text + "\n"); sys.stdout.flush()
sys.stdin.readline()   # start
deep = "[" * 150 + "]" * 150
w('{"t":"call","id":1,"op":"agent","prompt":"p","opts":{"x":%s}}' % deep)
reply = json.loads(sys.stdin.readline())
while reply.get("t") != "reply":
    reply = json.loads(sys.stdin.readline())
w('{"t":"log","message":%s}' % json.dumps(reply["error"]))
w('{"t":"done","ok":true,"value":' + "[" * 3000 + "]" * 3000 + "}")
"""


async def test_the_bridge_refuses_deep_values_a_runner_sends_anyway() -> None:
    host = Host()
    with trio.fail_after(30):
        out = await run_script("unused", None, host, RunnerLimits(), argv=[sys.executable, "-c", DEEP_RUNNER])
    assert host.calls == []                                     # the deep call never reached the host
    assert host.logs == [f"agent(): the script runner sent a value nested deeper than {LIMIT} levels "
                         "(the limit for values crossing to the daemon)"]
    assert not out.ok and f"nested deeper than {LIMIT} levels" in out.error


def claude_config(tmp_path: Path, api_url: str, claude: str) -> tuple[Path, dict[str, str]]:
    state = tmp_path / "state"
    state.mkdir()
    key = state / "alice.key"
    key.write_text("sk-ant-deep-json-test\n")
    key.chmod(0o600)
    return write_config(state, callers=["alice"], engines={"claude": {"bin": claude, "baseUrl": api_url}},
                        caller_extra={"apiKeyFile": str(key)})


async def run_and_wait(h: HostClient, script: str, **params: Any) -> dict[str, Any]:
    res = await h.tool("run", {"script": script, **params})
    assert not res.get("isError"), res
    run_id = res["structuredContent"]["runId"]
    await h.wait_notice(f"{run_id}:end")
    return (await h.tool("status", {"runId": run_id, "logLines": 50}))["structuredContent"]


async def result_of(h: HostClient, run_id: str) -> Any:
    return json.loads((await h.tool("result", {"runId": run_id}))["structuredContent"]["text"])


CATCHES = """
let deep = 1;
for (let i = 0; i < %d; i++) deep = [deep];
const caught = {};
try { await agent('never sent', { label: 'deep opts', schema: deep }); } catch (e) { caught.opts = e.message; }
try { await workflow('return 1', deep); } catch (e) { caught.args = e.message; }
try { await agent('never sent', { label: 'far too deep', schema: (() => { let v = 1; for (let i = 0; i < 100000; i++) v = {a: v}; return v; })() }); }
catch (e) { caught.huge = e.message; }
return caught;
"""

MODEL = """
const schema = { type: 'object' };
const answers = {};
for (const n of [3000, %d, 40]) {
  try { answers[n] = await agent('answer [[deep:' + n + ']]', { schema, label: 'deep ' + n }); }
  catch (e) { answers[n] = 'threw: ' + e.message; }
}
return answers;
"""


@pytest.mark.timeout(240)
async def test_deep_json_against_the_daemon_process(tmp_path: Path, nursery: trio.Nursery, claude_bin: str) -> None:
    api = await nursery.start(FakeAnthropic().serve)
    path, tokens = claude_config(tmp_path, api.url, claude_bin)
    async with cli_daemon(path) as d:
        with trio.fail_after(200):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                # A return value one level too deep, and one V8 itself cannot serialise:
                # that run fails, naming the limit; the daemon carries on.
                for n in (LIMIT + 1, 4000):
                    st = await run_and_wait(h, f"let v = 1; for (let i = 0; i < {n}; i++) v = [v]; return v;")
                    assert st["status"] == "failed", st
                    assert st["error"] == f"TypeError: the return value: nested deeper than {LIMIT} levels (the limit)"
                ok = await run_and_wait(h, f"let v = 1; for (let i = 0; i < {LIMIT}; i++) v = [v]; return v;")
                assert ok["status"] == "completed" and await result_of(h, ok["runId"]) == nested(LIMIT)

                # Agent options and workflow args: the script's catch gets the error.
                st = await run_and_wait(h, CATCHES % 2000)
                assert st["status"] == "completed", st
                caught = await result_of(h, st["runId"])
                assert caught == {
                    "opts": f"agent() options: nested deeper than {LIMIT} levels (the limit)",
                    "args": f"workflow() args: nested deeper than {LIMIT} levels (the limit)",
                    "huge": f"agent() options: nested deeper than {LIMIT} levels (the limit)"}
                assert st["agents"]["total"] == 0                  # nothing was started for them

                # The run tool's args (MCPL): one level too deep is refused by name; far too
                # deep for the frame parser is refused by the frame's own bound.
                refused = await h.tool("run", {"script": "return 1", "args": nested(LIMIT + 1)})
                assert refused["isError"] and f"args: nested deeper than {LIMIT} levels" in refused["content"][0]["text"]

                # A model's structured answer, from the real CLI: that agent fails (agent()
                # resolves null), the script goes on and the run completes.
                st = await run_and_wait(h, MODEL % (LIMIT + 2))
                assert st["status"] == "completed", st
                answers = await result_of(h, st["runId"])
                assert answers["3000"] is None and answers[str(LIMIT + 2)] is None
                nested_40: Any = answers["40"]
                for _ in range(40):
                    nested_40 = nested_40["a"]
                assert nested_40 == 1
                errors = {row["label"]: row.get("error") for p in st["phases"] for row in p["agents"]}
                assert "nested deeper than 100 levels" in errors["deep 3000"], errors
                assert errors[f"deep {LIMIT + 2}"] == f"the structured output nests deeper than {LIMIT} levels (the limit)"
                assert errors["deep 40"] is None

                assert await h.request("ping") == {}
    stderr = d.stderr.decode(errors="replace")
    assert "Traceback" not in stderr and "RecursionError" not in stderr, stderr[-3000:]
