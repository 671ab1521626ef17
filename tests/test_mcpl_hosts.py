"""Real host builds' quirks against the daemon over real WebSockets: the featureSets form
each host parses, refusals that hold one notice without blocking the rest, the
dashboard links (publicUrl) handed to callers, and the README's client beside a resident
host of the same caller."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config
from swarmbase.client import connect
from swarmbase.mcpl import features
from swarmbase.mcpl import selection
from swarmbase.script.runner import RunnerLimits

from .conftest import Env, fake_daemon, run_to_end, start_daemon, write_config
from .hosts import AgentFrameworkLike, AgentFrameworkV05Branches, HarnessCrashed, HarnessLike
from .sockets import free_port

# -- featureSets form per host ---------------------------------------------------------

def test_agent_framework_like_host_refuses_the_array_form() -> None:
    """The in-test host reproduces the reported failure when handed the array form."""
    host = AgentFrameworkLike()
    host.declare({"capabilities": {"experimental": {"mcpl": {"featureSets": features.declarations_for(
        "0.4", "mcpl-harness")}}}})
    assert set(host.sets) == {"0", "1"}
    answer = host.answer({"eventId": "run_x:end", "featureSet": "swarmbase.notify"})
    assert answer == {"result": {"accepted": False, "reason": "Unknown feature set: swarmbase.notify"}}


@pytest.mark.parametrize("version,name,form", [
    ("0.4", "agent-framework", dict), ("0.5", "agent-framework", dict),
    ("0.4", "mcpl-harness", list), ("0.4", "mcpl-harness-web", list),
    ("0.5", "mcpl-harness-web", dict),          # a 0.5 host parses the 0.5 form, whatever its name
    ("0.4", "some-unknown-host", dict), ("0.3", None, dict), ("0.5", "x", dict),
])
def test_declaration_form_table(version: str, name: str | None, form: type) -> None:
    assert isinstance(features.declarations_for(version, name), form)


async def test_agent_framework_like_host_gets_every_notice_first_try(running: Env) -> None:
    host = AgentFrameworkLike()
    count = 10
    with trio.fail_after(60):
        async with connect(running.ws, running.tokens["alice"], push_answer=host.answer) as h:
            init = await host.handshake(h)
            assert isinstance(init["capabilities"]["experimental"]["mcpl"]["featureSets"], dict)
            assert set(host.sets) == {"swarmbase", "swarmbase.notify"}
            run_ids: list[str] = []
            while len(run_ids) < count:           # maxActiveRuns is 3: three at a time
                batch = [(await h.tool("run", {"script": f"return {len(run_ids) + i}"}))["structuredContent"]["runId"]
                         for i in range(min(3, count - len(run_ids)))]
                for rid in batch:
                    await h.wait_notice(f"{rid}:end")
                run_ids += batch
    assert {f"{rid}:end": 1 for rid in run_ids} == dict(host.attempts)
    assert running.services.outbox.pending("alice") == []


async def test_harness_like_host_crashes_on_objects_so_it_gets_arrays(running: Env,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "PRE_05_GRACE_S", 0.3)   # the host never sends featureSets/update
    with trio.fail_after(30):
        # What the harness does with the object form: it dies. (Shown by a harness that
        # calls itself agent-framework, so the daemon sends it objects.)
        disguised = HarnessLike(client_name="agent-framework")
        async with connect(running.ws, running.tokens["alice"], push_answer=disguised.answer) as h:
            with pytest.raises(HarnessCrashed):
                await disguised.handshake(h)

        harness = HarnessLike()
        async with connect(running.ws, running.tokens["alice"], push_answer=harness.answer) as h:
            init = await harness.handshake(h)
            sets = init["capabilities"]["experimental"]["mcpl"]["featureSets"]
            assert [s["name"] for s in sets] == ["swarmbase", "swarmbase.notify"]
            run_id = (await h.tool("run", {"script": "return 'harness'"}))["structuredContent"]["runId"]
            notice = await h.wait_notice(f"{run_id}:end")
            assert "swarmbase:completed" in notice["tags"]
    assert harness.attempts == {f"{run_id}:end": 1}
    assert running.services.outbox.pending("alice") == []


# -- refusals do not block the queue -------------------------------------------------------

async def offline_notices(env: Env, count: int) -> list[str]:
    """`count` runs that end while their caller is offline; their eventIds, oldest first."""
    ids = []
    for i in range(count):
        run = await run_to_end(env, f"return {i}")
        ids.append(f"{run.id}:end")
    assert [n["eventId"] for n in env.services.outbox.pending("alice")] == ids
    return ids


class RefuseOne:
    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.refusing = True
        self.pushes: list[tuple[float, str]] = []

    def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        self.pushes.append((trio.current_time(), params["eventId"]))
        if params["eventId"] == self.refused and self.refusing:
            return {"result": {"accepted": False, "reason": "not in this context"}}
        return {"result": {"accepted": True}}


async def test_refused_notice_is_held_until_a_new_grant(running: Env) -> None:
    ids = await offline_notices(running, 4)
    host = RefuseOne(ids[0])
    with trio.fail_after(30):
        async with connect(running.ws, running.tokens["alice"], push_answer=host.answer) as h:
            t0 = trio.current_time()
            await h.handshake()
            with trio.fail_after(5):               # the next three arrive within a few seconds
                for eid in ids[1:]:
                    await h.wait_notice(eid)
            assert [e for _, e in host.pushes] == ids
            assert all(t - t0 < 5 for t, _ in host.pushes)
            await trio.sleep(1.5)
            assert [e for _, e in host.pushes].count(ids[0]) == 1      # no retry loop
            host.refusing = False
            await h.request("featureSets/update", {"effectiveCapabilities": ["pushEvents", "tools"],
                                                   "enabled": ["swarmbase", "swarmbase.notify"]})
            await h.wait_notice(ids[0])
    assert running.services.outbox.pending("alice") == []


async def test_refused_notice_is_held_until_a_reconnect(running: Env) -> None:
    ids = await offline_notices(running, 2)
    host = RefuseOne(ids[0])
    with trio.fail_after(30):
        async with connect(running.ws, running.tokens["alice"], push_answer=host.answer) as h:
            await h.handshake()
            await h.wait_notice(ids[1])
        host.refusing = False
        async with connect(running.ws, running.tokens["alice"], push_answer=host.answer) as h:
            await h.handshake()
            await h.wait_notice(ids[0])
    assert [e for _, e in host.pushes] == [ids[0], ids[1], ids[0]]


# -- links handed to callers ----------------------------------------------------------------

@pytest.mark.parametrize("public_url", [None, "https://swarm.example.ts.net/"])
async def test_run_status_list_and_notices_carry_the_dashboard_url(tmp_path: Path, nursery: trio.Nursery,
                                                                   public_url: str | None) -> None:
    extra = {"publicUrl": public_url} if public_url else {}
    path, tokens = write_config(tmp_path / "state", callers=["alice"], **extra)
    env = Env(state=tmp_path / "state", tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env, limits=RunnerLimits(slice_ms=1000))
    base = public_url.rstrip("/") if public_url else env.url
    assert base.startswith("https://") or base.startswith("http://127.0.0.1:") and not base.endswith(":0")
    with trio.fail_after(30):
        async with connect(env.ws, tokens["alice"]) as h:
            await h.handshake()
            started = (await h.tool("run", {"script": "return 1"}))["structuredContent"]
            run_id = started["runId"]
            url = f"{base}/runs/{run_id}"
            assert started["url"] == url
            notice = await h.wait_notice(f"{run_id}:end")
            assert notice["origin"]["url"] == url
            assert f"Dashboard: {url}" in notice["payload"]["content"][0]["text"]
            assert (await h.tool("status", {"runId": run_id}))["structuredContent"]["url"] == url
            [row] = (await h.tool("list"))["structuredContent"]["runs"]
            assert row["url"] == url
            resumed = (await h.tool("resume", {"runId": run_id}))["structuredContent"]
            assert resumed["url"] == f"{base}/runs/{resumed['runId']}"
            await h.wait_notice(f"{resumed['runId']}:end")
    if public_url is None:
        import httpx
        async with httpx.AsyncClient() as c:         # the loopback link is the run's page
            assert (await c.get(url)).status_code == 200


# -- the operator's client beside the resident host ---------------------------------------

async def client_run(env: Env, script: str, *flags: str) -> trio.Process:
    """`python -m swarmbase.client alice run …` as the README gives it, stdout piped."""
    argv = [sys.executable, "-m", "swarmbase.client", "alice", "run", json.dumps({"script": script}), *flags]
    return await trio.lowlevel.open_process(argv, env=dict(os.environ, SWARMBASE_CONFIG=str(env.state / "config.json")),
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def read_until(proc: trio.Process, text: str, marker: str | re.Pattern[str]) -> str:
    assert proc.stdout is not None
    while not (re.search(marker, text) if isinstance(marker, re.Pattern) else marker in text):
        chunk = await proc.stdout.receive_some(65536)
        assert chunk, text
        text += chunk.decode()
    return text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("build", ["agent-framework 0.4", "agent-framework 0.5 branches"])
async def test_the_readme_client_never_disturbs_the_resident_host(tmp_path: Path, nursery: trio.Nursery,
                                                                  build: str) -> None:
    # Issue 32.15: a resident host of alice stays attached while the operator runs
    # `python -m swarmbase.client alice run … --wait` (and a one-shot `run`) from a shell.
    # The client gets its own run's end notice and nothing else; the resident gets its own
    # run's and the one-shot's (whose connection is gone), each exactly once, and is
    # never closed.
    env = await fake_daemon(tmp_path, nursery, port=free_port())
    gates = {name: tmp_path / name for name in ("resident", "shell")}
    for g in gates.values():
        g.write_text("")
    host: Any = AgentFrameworkLike() if build.endswith("0.4") else AgentFrameworkV05Branches(
        ["swarmbase", "swarmbase.notify"])
    with trio.fail_after(100):
        async with connect(env.ws, env.tokens["alice"], push_answer=host.answer) as h:
            await host.handshake(h)

            async def tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                if isinstance(host, AgentFrameworkV05Branches):
                    return await host.tool(h, name, arguments)
                return await h.tool(name, arguments)
            mine = (await tool("run", {"script": f"return await agent('waitfile:{gates['resident']}')"})
                    )["structuredContent"]["runId"]

            waiting = await client_run(env, f"return await agent('waitfile:{gates['shell']}')", "--wait")
            try:
                text = await read_until(waiting, "", re.compile(r"run_[0-9a-f]{12}"))
                theirs = re.findall(r"run_[0-9a-f]{12}", text)[0]
                # The resident's run ends while the client waits: its notice is the resident's.
                gates["resident"].unlink()
                await h.wait_notice(f"{mine}:end")
                # A one-shot run from the shell: its connection is gone before it ends.
                one_shot = await client_run(env, "return 'from the shell'")
                out, _ = await one_shot.stdout.receive_some(65536), await one_shot.wait()   # type: ignore[union-attr]
                shot = re.findall(r"run_[0-9a-f]{12}", out.decode())[0]
                await h.wait_notice(f"{shot}:end")
                gates["shell"].unlink()
                text = await read_until(waiting, text, f"{theirs}:end")
                assert await waiting.wait() == 0
            finally:
                if waiting.returncode is None:
                    waiting.kill()
            assert not h.closed_event.is_set()
            assert await h.request("ping") == {}
            assert f"{mine}:end" not in text and f"{shot}:end" not in text      # the client's own only
            assert dict(host.attempts) == {f"{mine}:end": 1, f"{shot}:end": 1}  # the resident's, once each
            assert env.services.outbox.pending("alice") == []                   # every one acknowledged
