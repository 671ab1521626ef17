"""SwarmBase and the agent-framework builds that can be fetched.

- The README's wake rule, read from README.md, through each build's gate and push handler
  (ported in tests/agent_framework_gate.py, with the files and commits they follow): it
  must wake every build, with a broad "don't wake" rule after it and a "don't wake"
  default, for the notice the real daemon sent.
- agent-framework feature/mcpl-v05-state-branches (1d0fd23), which advertises MCPL 0.5 but
  selects its feature sets only with a notification, against the real daemon process over
  a real WebSocket (tests/hosts.py plays its messages): it gets its notices, across a
  reconnect, and the daemon says once what it assumed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase.client import connect
from swarmbase.mcpl import selection

from . import agent_framework_gate as gate
from .clidaemon import cli_daemon
from .conftest import write_config
from .hosts import AgentFrameworkV05Branches

README = Path(__file__).resolve().parent.parent / "README.md"
NOTICE = {"featureSet": "swarmbase.notify", "eventId": "run_0123456789ab:end", "timestamp": "2026-12-01T00:00:00.000Z",
          "origin": {"source": "swarmbase", "kind": "run-end", "runId": "run_0123456789ab",
                     "url": "http://127.0.0.1:7360/runs/run_0123456789ab"},
          "tags": ["surface:done", "swarmbase:run-end", "swarmbase:completed"],
          "payload": {"content": [{"type": "text", "text": "Run untitled (run_0123456789ab) completed: 0 agents."}]}}


def readme_wake_rule() -> dict[str, Any]:
    text = README.read_text()
    blocks = re.findall(r"```json\n(\{[^\n]*\"swarmbase-wake\"[^\n]*\})\n```", text)
    assert len(blocks) == 1, "the README shows one wake rule"
    return json.loads(blocks[0])


def quiet_gate(build: gate.Build, rule: dict[str, Any]) -> dict[str, Any]:
    """A deployment that wakes on little: the rule, then a broad don't-wake rule, and a
    don't-wake default (in the words of that build's gate)."""
    quiet = "defer" if build.gate and "defer" in gate.GATES[build.gate]["strings"] else "skip"
    return {"policies": [rule, {"name": "everything-else", "match": {}, "behavior": quiet}], "default": quiet}


@pytest.mark.parametrize("build", gate.BUILDS, ids=[b.commit for b in gate.BUILDS])
def test_readme_wake_rule_wakes_every_build(build: gate.Build) -> None:
    rule = readme_wake_rule()
    if build.gate is None:
        # No gate (before fec59c7): every accepted event wakes, no rule is read.
        assert gate.wakes(build, quiet_gate(build, rule), "swarmbase", NOTICE) == (True, None)
        assert gate.wakes(build, quiet_gate(build, rule), "other", NOTICE) == (True, None)
        return
    assert gate.wakes(build, quiet_gate(build, rule), "swarmbase", NOTICE) == (True, "swarmbase-wake")
    # `source` is the key the server is registered under: another key is another server.
    assert gate.wakes(build, quiet_gate(build, rule), "other", NOTICE) == (False, "everything-else")


def test_a_scoped_rule_wakes_only_the_builds_that_use_its_label() -> None:
    """What the README said before: the rule named `mcpl:push-event` and woke nobody on the
    builds that label the event `push:event` (or not at all)."""
    scoped = {"name": "swarmbase-wake", "match": {"scope": ["mcpl:push-event"], "source": "swarmbase"},
              "behavior": "always"}
    woken = {b.commit: gate.wakes(b, quiet_gate(b, scoped), "swarmbase", NOTICE)[0] for b in gate.BUILDS}
    # The two builds without a gate wake on everything; 0329c03's gate sees "push:event".
    assert woken == {"58af1a24bd16": True, "1d0fd23": True, "0329c03": False,
                     "a13fece07619": True, "3666acde5a63": True}


def test_tag_narrowing_is_honoured_where_tags_exist_and_harmless_elsewhere() -> None:
    narrow = {"name": "swarmbase-wake", "match": {"source": "swarmbase", "tagsAny": ["swarmbase:run-end"]},
              "behavior": "always"}
    warning = {**NOTICE, "eventId": "run_0123456789ab:budget-warning", "tags": ["swarmbase:budget-warning"]}
    for b in gate.BUILDS:
        assert gate.wakes(b, quiet_gate(b, narrow), "swarmbase", NOTICE)[0] is True
        # Builds without tag matching drop the field and wake on the warning too.
        assert gate.wakes(b, quiet_gate(b, narrow), "swarmbase", warning)[0] is (not b.sends_tags)


def test_the_gate_port_keeps_the_sources_quirks() -> None:
    """Checks of the port itself against what the sources say."""
    g1 = next(b for b in gate.BUILDS if b.commit == "0329c03")
    # G1's validatePolicy: an unknown behaviour string becomes "always".
    assert gate.validate_policy({"name": "x", "behavior": "defer"}, "G1")["behavior"] == "always"
    with pytest.raises(gate.GateConfigError):
        gate.validate_config({"default": "defer"}, "G1")
    assert gate.validate_config({"default": "defer"}, "G3")["default"] == "defer"
    # First match wins; an empty match matches everything.
    first = {"policies": [{"name": "a", "match": {}, "behavior": "skip"},
                          {"name": "b", "match": {"source": "swarmbase"}, "behavior": "always"}]}
    assert gate.wakes(g1, first, "swarmbase", NOTICE) == (False, "a")
    # Globs are anchored; `*` spans anything.
    assert gate.compile_glob("swarm*").search("swarmbase") and not gate.compile_glob("swarm").search("swarmbase")
    assert gate.push_metadata(g1, "swarmbase", NOTICE)["eventType"] == "push:event"


# -- the 0.5 build that only notifies, against the real daemon process ------------------------

@pytest.mark.timeout(150)
async def test_v05_host_that_only_notifies_gets_its_notices_from_the_real_daemon(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg_path, tokens = write_config(state, callers=["alice"])
    note = "sent its feature-set selection only as a featureSets/update notification"
    async with cli_daemon(cfg_path) as d:
        with trio.fail_after(60 + selection.NOTIFIED_05_GRACE_S):
            host = AgentFrameworkV05Branches(["swarmbase", "swarmbase.notify"])
            async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
                init = await host.handshake(h)
                assert init["capabilities"]["experimental"]["mcpl"]["version"] == "0.5"
                assert host.sent[2] == ('{"jsonrpc":"2.0","method":"featureSets/update","params":'
                                        '{"enabled":["swarmbase","swarmbase.notify"]}}')
                first = (await host.tool(h, "run", {"script": "return 6 * 7"}))["structuredContent"]["runId"]
                notice = await h.wait_notice(f"{first}:end")
            # Every README build wakes on the notice the daemon really sent.
            rule = readme_wake_rule()
            assert all(gate.wakes(b, quiet_gate(b, rule), "swarmbase", notice)[0] for b in gate.BUILDS)

            # Offline: a run started by a plain MCP client, its notice queued for alice.
            async with connect(d.ws, tokens["alice"]) as plain:
                await plain.handshake(None)
                second = (await plain.tool("run", {"script": "return 'queued'"}))["structuredContent"]["runId"]
                while (await plain.tool("status", {"runId": second}))["structuredContent"]["status"] != "completed":
                    await trio.sleep(0.05)
            again = AgentFrameworkV05Branches(["swarmbase", "swarmbase.notify"])
            async with connect(d.ws, tokens["alice"], push_answer=again.answer) as h:
                await again.handshake(h)
                await h.wait_notice(f"{second}:end")
    assert host.attempts[f"{first}:end"] == 1 and again.attempts[f"{second}:end"] == 1
    log = d.stderr.decode()
    assert log.count(note) == 1, log                      # said once, not per connection
    assert "host agent-framework" in log and "active sets: swarmbase, swarmbase.notify" in log


@pytest.mark.timeout(120)
async def test_v05_host_that_disables_notify_by_notification_gets_nothing(tmp_path: Path) -> None:
    """The same build with only the tools set listed: its notification disables
    swarmbase.notify, and that is honoured when the selection is assumed."""
    state = tmp_path / "state"
    cfg_path, tokens = write_config(state, callers=["alice"])
    async with cli_daemon(cfg_path) as d:
        with trio.fail_after(60 + selection.NOTIFIED_05_GRACE_S):
            host = AgentFrameworkV05Branches(["swarmbase"])
            async with connect(d.ws, tokens["alice"], push_answer=host.answer) as h:
                await host.handshake(h)
                assert json.loads(host.sent[2])["params"] == {"enabled": ["swarmbase"],
                                                              "disabled": ["swarmbase.notify"]}
                run_id = (await host.tool(h, "run", {"script": "return 1"}))["structuredContent"]["runId"]
                # Past the grace period, with the run long over: still nothing pushed.
                while "active sets: swarmbase)" not in d.stderr.decode():
                    await trio.sleep(0.05)
                status = (await host.tool(h, "status", {"runId": run_id}))["structuredContent"]["status"]
                assert status == "completed"
    assert host.attempts == {}
