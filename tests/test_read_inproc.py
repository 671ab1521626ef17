"""Read agents inside the daemon (issue 33 item 1): the daemon's own model loop against the
fake Messages API on loopback, Read/Grep/Glob run by the tool host in the agent's sandbox
(toolhost/read_host.py), through the real daemon's run path (daemon.serve, the supervisor,
the Node runner). `inProcessRead: false` keeps the real `claude -p`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config

from .conftest import CLAUDE, Env, agent_json, result_of, run_to_end, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic
from .think_daemon import CANARY, requests_for, transcript

HOST = "swarmbase.toolhost.read_host"
REVIEWER = "---\nname: reviewer\ndescription: Reviews\ntools: Read, Grep\n---\nYou are the REVIEWER-BODY-4410 agent.\n"


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)

def project(root: Path) -> Path:
    proj = root / "proj"
    (proj / "sub").mkdir(parents=True, exist_ok=True)
    (proj / "a.py").write_text("import os\nneedle = 1\n")
    (proj / "sub" / "b.py").write_text("def f():\n    return 'needle'\n")
    (proj / ".env").write_text(f"KEY={CANARY}\n")
    (root / "outside.txt").write_text("outside the project\n")
    (proj / ".claude" / "agents").mkdir(parents=True, exist_ok=True)
    (proj / ".claude" / "agents" / "reviewer.md").write_text(REVIEWER)
    return proj


async def read_daemon(nursery: trio.Nursery, root: Path, url: str, *, in_process: bool = True,
                      **claude: Any) -> Env:
    """A daemon on root/state with one caller, alice (key CANARY, cwdRoots root/proj)."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    key_file = root / "alice.key"
    key_file.write_text(CANARY + "\n")
    key_file.chmod(0o600)
    engines = {"claude": {"bin": str(CLAUDE), "baseUrl": url, "inProcessRead": in_process, **claude}}
    path, tokens = write_config(state, callers=["alice"], engines=engines, perRunConcurrency=8, caller_extra={
        "apiKeyFile": str(key_file), "maxProfile": "read", "cwdRoots": [str(root / "proj")],
        "projects": {"default": str(root / "proj")}})
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    return env


def calls(*listed: tuple[str, dict[str, Any]]) -> str:
    return "CALLS: " + json.dumps([{"name": n, "input": i} for n, i in listed]) + " :END [[tools]]"


def hosts() -> list[int]:
    """The pids of live tool hosts on this machine (the Python process itself, not the
    sandbox's stages, whose argv holds it too)."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd[1:5] == [b"-I", b"-S", b"-B", b"-c"] and HOST.encode() in cmd[5]:
            out.append(int(pid))
    return out


async def test_read_agents_run_their_tools_in_a_host(tmp_path: Path, nursery: trio.Nursery,
                                                     api: FakeAnthropic) -> None:
    proj = project(tmp_path)
    env = await read_daemon(nursery, tmp_path, api.url, readMaxTurns=3)
    p = str(proj)
    prompts = {
        "tools": calls(("Read", {"file_path": f"{p}/a.py"}), ("Grep", {"pattern": "needle", "output_mode": "count"}),
                       ("Glob", {"pattern": "**/*.py"})),
        "denied": calls(("Read", {"file_path": str(tmp_path / "outside.txt")}), ("Read", {"file_path": f"{p}/.env"}),
                        ("Read", {"file_path": f"{p}/sub/../../alice.key"}), ("Bash", {"command": "id"})),
        "loop": f"[[readloop:{p}/a.py]]",
        "nogrep": calls(("Grep", {"pattern": "needle"})),
    }
    script = f"""
const P = {json.dumps(prompts)};
const [tools, denied, loop, nogrep, typed, capped] = await parallel([
  () => agent(P.tools, {{ cwd: {json.dumps(p)}, label: "tools" }}),
  () => agent(P.denied, {{ cwd: {json.dumps(p)} }}),
  () => agent(P.loop, {{ cwd: {json.dumps(p)}, detail: true }}),
  () => agent(P.nogrep, {{ cwd: {json.dumps(p)}, disallowedTools: ["Grep"] }}),
  () => agent("[[text:looks right]] review-4410", {{ agentType: "reviewer" }}),
  () => agent("[[drip:400]]", {{ detail: true, maxUsd: 0.02 }}),
]);
return {{ tools, denied, loop, nogrep, typed, capped }};
"""
    run = await run_to_end(env, script, timeout=120)            # the default profile: read
    assert run.status == "completed", run.error
    res = result_of(env, run)
    assert all(r["headers"]["user-agent"].startswith("swarmbase") for r in api.requests)   # no CLI
    # Three parallel calls in one reply, answered in one message, each in the CLI's text.
    said = res["tools"].removeprefix("tool said: ").split(" || ")
    assert said[0] == "     1\timport os\n     2\tneedle = 1"
    assert said[1].endswith("Found 2 total occurrences across 2 files.")
    assert set(said[2].split("\n")) == {f"{p}/a.py", f"{p}/sub/b.py"}
    first, second = [r for r in api.requests if r["prompt"] == prompts["tools"]]
    assert [t["name"] for t in first["body"]["tools"]] == ["Read", "Grep", "Glob"]
    assert first["body"]["tools"][0]["input_schema"]["required"] == ["file_path"]
    assert p in json.dumps(first["body"]["system"])                      # the cwd is in the system prompt
    results = second["body"]["messages"][-1]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_t0", "toolu_t1", "toolu_t2"]
    lines = [ln["type"] for ln in transcript(env, run, 1)]
    assert lines == ["system", "assistant", "user", "assistant", "result"]
    a1 = agent_json(env, run, 1)
    assert a1["state"] == "done" and a1["estimated"] is False and a1["tokens"]["input"] == 2000
    # The path rules: outside the cwd, a credential file, a climb out; an unknown tool.
    denied = res["denied"].removeprefix("tool said: ").split(" || ")
    assert all(d.startswith("ERR <tool_use_error>") for d in denied), denied
    assert "denied" in denied[0] and "denied" in denied[1] and "denied" in denied[2]
    assert "No such tool" in denied[3]
    assert CANARY not in json.dumps([r["body"] for r in api.requests])   # the .env never reached the model
    # maxTurns (readMaxTurns: 3): three requests, then the CLI's error_max_turns.
    assert res["loop"]["ok"] is False and "maximum number of turns (3)" in res["loop"]["error"]
    assert len(requests_for(api, "[[readloop")) == 3
    assert transcript(env, run, 3)[-1]["subtype"] == "error_max_turns"
    # A disallowed tool is not offered; called anyway, the host refuses it.
    nogrep = [r for r in api.requests if r["prompt"] == prompts["nogrep"]]
    assert [t["name"] for t in nogrep[0]["body"]["tools"]] == ["Read", "Glob"]
    assert res["nogrep"].startswith("tool said: ERR") and "No such tool available: Grep" in res["nogrep"]
    # A project agent type: its body is the system prompt (before the read agent's note), its tools offered.
    typed = [r["body"] for r in api.requests if "review-4410" in r["prompt"]]
    assert res["typed"] == "looks right" and len(typed) == 1
    system = [b["text"] for b in typed[0]["system"]]
    assert system[0].startswith("You are the REVIEWER-BODY-4410 agent.") and "the Read and Grep tools" in system[0]
    assert [t["name"] for t in typed[0]["tools"]] == ["Read", "Grep"]
    # The budget is checked as the reply streams: stopped at the cap, charged what streamed.
    assert res["capped"]["ok"] is False and "maxUsd" in res["capped"]["error"]
    assert api.drip_sent < 400 and agent_json(env, run, 6)["estimated"] is True
    assert hosts() == []                                         # every host ended with its agent
    for f in env.state.rglob("*"):
        if f.is_file():
            assert CANARY not in f.read_text(errors="replace"), f


async def test_the_host_is_confined_and_cancel_kills_it(tmp_path: Path, nursery: trio.Nursery,
                                                        api: FakeAnthropic) -> None:
    """While its agent waits on the model, the host lives: not root, no secret in its
    environment, no network but loopback; cancelling the run ends the request and the host."""
    proj = project(tmp_path)
    env = await read_daemon(nursery, tmp_path, api.url)
    prompt = calls(("Read", {"file_path": f"{proj}/a.py"})) + " [[gatelater]]"
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": f"return await agent({json.dumps(prompt)}, "
                                                        f"{{cwd: {json.dumps(str(proj))}}});"})
    live = sup.live[run.id]
    with trio.fail_after(60):
        while len(api.requests) < 2 or not hosts():       # the second request waits at the gate
            await trio.sleep(0.05)
    pids = hosts()
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert CANARY.encode() not in environ
        assert {e.split(b"=", 1)[0] for e in environ.split(b"\0") if e} <= {b"LANG", b"PWD"}   # PWD: bwrap's --chdir
        uid = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
        assert uid.split()[1] != "0"                              # the caller's uid, not the daemon's
        devs = [ln.split(":")[0].strip() for ln in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
        assert devs == ["lo"]
    sup.cancel(run)
    with trio.fail_after(30):
        await live.finished.wait()
        while hosts():
            await trio.sleep(0.05)
    assert agent_json(env, run, 1)["state"] == "cancelled"
    api.gate.set()


async def test_resume_replays_across_the_read_paths(tmp_path: Path, api: FakeAnthropic) -> None:
    """A run of read agents made inside the daemon resumes on the CLI path with every agent
    replayed, and the reverse; the CLI path really starts `claude -p`."""
    proj = project(tmp_path)
    script = (f"const r = await parallel([1, 2].map((i) => () => agent(`item ${{i}} [[text:ok ${{i}}]]`, "
              f"{{cwd: {json.dumps(str(proj))}}})));\nreturn r.join(',');")

    async def one(in_process: bool, resume_of: Any = None) -> tuple[Any, int, int]:
        async with trio.open_nursery() as n:
            env = await read_daemon(n, tmp_path, api.url, in_process=in_process)
            sup = env.services.supervisor
            before = len(api.requests)
            if resume_of is None:
                run = await run_to_end(env, script, timeout=120)
            else:
                run = sup.resume(env.cfg.caller("alice"), resume_of.id, {})
                with trio.fail_after(120):
                    await sup.live[run.id].finished.wait()
                assert all(agent_json(env, run, i)["replayed"] for i in (1, 2))
            assert run.status == "completed", run.error
            assert result_of(env, run) == "ok 1,ok 2"
            mine = api.requests[before:]
            n.cancel_scope.cancel()
        return run, sum("claude-cli" in r["headers"].get("user-agent", "") for r in mine), len(mine)

    inside, spawned, asked = await one(True)
    assert spawned == 0 and asked == 2
    _, spawned, asked = await one(False, inside)
    assert asked == 0
    cli, spawned, asked = await one(False)
    assert spawned == 2 and asked == 2
    _, spawned, asked = await one(True, cli)
    assert asked == 0


async def test_a_refused_host_fails_the_agent_saying_why(tmp_path: Path, nursery: trio.Nursery,
                                                         api: FakeAnthropic) -> None:
    """The host's launch is checked as a CLI's is: a cwd swapped for a link while the agent
    waited on the model is refused, and the agent fails with the reason."""
    proj = project(tmp_path)
    env = await read_daemon(nursery, tmp_path, api.url)
    prompt = "[[gate]] " + calls(("Read", {"file_path": f"{proj}/a.py"}))
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller("alice"), {"script": f"return await agent({json.dumps(prompt)}, "
                                                        f"{{cwd: {json.dumps(str(proj))}}});"})
    with trio.fail_after(60):
        while not api.requests:
            await trio.sleep(0.05)
    proj.rename(tmp_path / "proj-real")
    proj.symlink_to(tmp_path / "proj-real")
    api.gate.set()
    with trio.fail_after(60):
        await sup.live[run.id].finished.wait()
    a = agent_json(env, run, 1)
    assert a["state"] == "failed"
    assert "could not start the read agent's tool host" in a["error"] and "changed between" in a["error"]
    assert len(api.requests) == 1 and hosts() == []
