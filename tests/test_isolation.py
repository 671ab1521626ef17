"""Isolation v2 against the real CLIs and the real runner, inside the sandbox: one caller's
write agent cannot read another caller's secrets or touch the state dir, a runner has no
network, a background command of a skipped agent dies with it, and whatever leaks through
an unsandboxed agent's output is redacted against every caller's secrets."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config
from swarmbase.launch.local import LocalLauncher
from swarmbase.script.runner import RUNNER_ENV, run_script, runner_spec

from .conftest import CLAUDE, Env, agent_json, descendants, process_table, result_of, run_to_end, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic
from .script_host import Host

ALICE_KEY = "sk-ant-alice-" + secrets.token_hex(16)
BOB_KEY = "sk-ant-bob-" + secrets.token_hex(16)


@pytest.fixture
async def api(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic().serve)


async def two_callers(tmp_path: Path, nursery: trio.Nursery, base_url: str, **extra: Any) -> Env:
    """alice and bob, each with a key file in the state dir; bob may write in his root."""
    state = tmp_path / "state"
    state.mkdir()
    roots = {}
    for name, key in (("alice", ALICE_KEY), ("bob", BOB_KEY)):
        (state / f"{name}.key").write_text(key + "\n")
        (state / f"{name}.key").chmod(0o600)
        roots[name] = tmp_path / f"{name}-files"
        roots[name].mkdir()
    (roots["alice"] / "plans.txt").write_text("alice's private plans\n")
    path, tokens = write_config(state, engines={"claude": {"bin": str(CLAUDE), "baseUrl": base_url}}, **extra)
    raw = json.loads(path.read_text())
    for c in raw["callers"]:
        c.update(apiKeyFile=str(state / f"{c['name']}.key"), maxProfile="write", cwdRoots=[str(roots[c["name"]])])
    path.write_text(json.dumps(raw))
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    return await start_daemon(nursery, env)


@pytest.mark.timeout(150)
async def test_a_write_agent_cannot_read_another_callers_secrets_or_touch_state(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str, api: FakeAnthropic) -> None:
    env = await two_callers(tmp_path, nursery, api.url)
    state = env.state
    token_a = (state / "mcpl-alice.token").read_text()
    attack = (f"cat {state}/alice.key; cat {state}/mcpl-alice.token; cat {state}/config.json; ls -a {state}; "
              f"ls {tmp_path}/alice-files; cat {tmp_path}/alice-files/plans.txt; echo x > {state}/x; "
              f"echo mine > ./mine.txt && echo WROTE-OWN; echo DONE")
    # Encoded, so the CLI's own permission rules cannot see the paths: the sandbox must hold.
    encoded = base64.b64encode(attack.encode()).decode()
    command = f"echo {encoded} | base64 -d > /tmp/a.sh; bash /tmp/a.sh"
    run = await run_to_end(env, f"return await agent({json.dumps('[[bash:' + command + ']]')}, {{profile: 'write'}})",
                           caller="bob", keepWork=True, timeout=120)
    assert run.status == "completed", run.error
    out = result_of(env, run)
    assert "DONE" in out and "WROTE-OWN" in out                     # the shell ran, and wrote in its cwd
    assert (env.services.store.work_dir(run) / "mine.txt").read_text() == "mine\n"
    for secret in (ALICE_KEY, token_a, "tokenSha256", "alice's private plans", "outbox", "procs"):
        assert secret not in out, secret
    assert "No such file or directory" in out
    # Of the state dir only the path down to the agent's own cwd exists (mount points).
    listing = out.split("\n.\n..\n", 1)[1].split("\n")[0]
    assert listing == "runs"
    assert not (state / "x").exists()
    everything = "".join(p.read_text(errors="replace") for p in state.rglob("*") if p.is_file())
    assert ALICE_KEY not in everything.replace((state / "alice.key").read_text(), "")


@pytest.mark.timeout(150)
async def test_skipping_an_agent_kills_its_background_command(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str, api: FakeAnthropic) -> None:
    env = await two_callers(tmp_path, nursery, api.url)
    marker = "bg-" + secrets.token_hex(6)
    sup = env.services.supervisor
    # `cmd &` gets its own process group in the agent's shell and survived the group kill
    # before the sandbox: its argv[0] is the marker, so the test can find it.
    command = f"(exec -a {marker} tail -f /dev/null) > /dev/null 2>&1 & echo started"
    run = sup.start(env.cfg.caller("bob"), {"script": f"return await agent('[[bashhang:{command}]]', {{profile: 'write'}})"})

    def background() -> list[int]:
        return [p for p, (_, st, cmd) in process_table().items() if cmd.startswith(marker.encode() + b"\0")
                and st not in ("Z", "X")]

    with trio.fail_after(90):
        while not background() or len(api.requests) < 2:
            await trio.sleep(0.05)
        assert sup.skip_agent(run, 1)
        await sup.live[run.id].finished.wait() if run.id in sup.live else None
        while background():
            await trio.sleep(0.05)
    assert run.status == "completed" and agent_json(env, run, 1)["state"] == "skipped"


@pytest.mark.timeout(150)
async def test_unsandboxed_output_is_redacted_against_every_caller(
        tmp_path: Path, nursery: trio.Nursery, claude_bin: str, api: FakeAnthropic) -> None:
    env = await two_callers(tmp_path, nursery, api.url, sandbox="none")
    token_a = (env.state / "mcpl-alice.token").read_text()
    leak = base64.b64encode(f"cat {env.state}/alice.key {env.state}/mcpl-alice.token".encode()).decode()
    run = await run_to_end(env, f"return await agent('[[bash:echo {leak} | base64 -d | bash]]', {{profile: 'write'}})",
                           caller="bob", timeout=120)
    assert run.status == "completed", run.error
    out = result_of(env, run)
    assert "[redacted]" in out and ALICE_KEY not in out and token_a not in out
    records = "".join(p.read_text() for p in env.services.store.dir(run).rglob("*") if p.is_file())
    assert ALICE_KEY not in records and token_a not in records and "[redacted]" in records


async def test_a_runner_has_no_network(tmp_path: Path) -> None:
    """From inside the runner process (not the vm), a TCP connect to a listening loopback
    port fails, and the runner's network namespace is not the daemon's."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs")
    (tmp_path / "procs").mkdir()
    spec = runner_spec(key="probe-runner", memory_mb=256, cpu_seconds=60, record={},
                       env={**RUNNER_ENV, "SWARMBASE_TEST_PROBE": "1"})
    host = Host()
    gate = host.gates.setdefault("park", trio.Event())
    result: dict[str, Any] = {}
    code = f"""
const net = await import('node:net');
return await new Promise((resolve) => {{
  const s = net.connect({port}, '127.0.0.1');
  s.on('connect', () => {{ s.destroy(); resolve('connected'); }});
  s.on('error', (e) => resolve('refused: ' + e.code));
}});"""
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as n:
                async def run() -> None:
                    result["outcome"] = await run_script("return await agent('park')", None, host,
                                                         launcher=launcher, spec=spec)
                n.start_soon(run)
                while host.bridge is None or "park" not in host.reached:
                    await trio.sleep(0.02)
                result["probe"] = await host.bridge.probe(code)
                table = process_table()
                node = [p for p in descendants(os.getpid()) if table.get(p, (0, "", b""))[2].startswith(b"/usr/bin/node")
                        or b"node\0" in table.get(p, (0, "", b""))[2][:64]]
                result["ns"] = {os.readlink(f"/proc/{p}/ns/net") for p in node}
                gate.set()
    finally:
        listener.close()
    assert result["probe"].startswith("refused"), result["probe"]
    assert result["ns"] and os.readlink("/proc/self/ns/net") not in result["ns"]
