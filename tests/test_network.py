"""An agent's network is an allow-list (issue 20, item 4), against a real daemon process,
the real Claude Code and Codex CLIs and their shells, as root.

One daemon, one run, three agents at once: a claude write agent whose Bash and a codex
write agent whose shell curl everything on the host they could want (the daemon's own
dashboard, another loopback service, the other engine's API, codex's upstream behind the
meter), the caller's `network` hosts (a loopback port listed as an IP literal: reached; one
listed as `localhost`, a name resolving to loopback: refused) and a name not on the list; and a claude read agent,
parked on the fake API, whose namespace is read from outside: it has the key door's door
and nothing else. Every agent's own model API works (each one's answer came through it),
claude's only through the key door.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from pathlib import Path

import pytest
import trio

from swarmbase.client import connect

from .clidaemon import cli_daemon
from .conftest import CLAUDE, CODEX, descendants, process_table, write_config
from .fakes.anthropic_api import FakeAnthropic
from .fakes.responses_api import FakeResponses
from .sockets import listener, serve_hello

KEY = "sk-ant-net-" + secrets.token_hex(12)


def listening(pid: int) -> set[str]:
    """host:port of every TCP socket listening in the network namespace of `pid`."""
    out = set()
    for name, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":
                continue
            addr, port = local.split(":")
            raw = bytes.fromhex(addr)
            if width == 8:
                host = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                host = "[" + socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))) + "]"
            out.add(f"{host}:{int(port, 16)}")
    return out


def probe_command(urls: list[str]) -> str:
    return ("for u in " + " ".join(urls) + "; do curl -sS -m 20 -o /dev/null -w '%{http_code}' $u 2>/dev/null; "
            "echo \" rc=$? $u\"; done")


def outcome(text: str, url: str) -> int:
    """curl's exit status for `url` in an agent's answer."""
    for line in text.splitlines():
        if line.endswith(" " + url) and " rc=" in line:
            return int(line.rsplit(" rc=", 1)[1].split()[0])
    raise AssertionError(f"no probe of {url} in {text!r}")


@pytest.mark.timeout(240)
async def test_agents_reach_their_model_api_and_nothing_else_on_the_host(tmp_path: Path, nursery: trio.Nursery) -> None:
    for tool in (CLAUDE, CODEX):
        if not tool.exists():
            pytest.fail(f"{tool} is missing: run bash tests/install.sh")
    assert shutil.which("curl") and shutil.which("bwrap"), "curl and bubblewrap come with tests/install.sh"
    anthropic = await nursery.start(FakeAnthropic().serve)
    responses = await nursery.start(FakeResponses().serve)
    allowed, allowed_port = listener()
    other, other_port = listener()
    nursery.start_soon(serve_hello, allowed, b"allowed")
    nursery.start_soon(serve_hello, other, b"other")
    state = tmp_path / "state"
    state.mkdir()
    (state / "alice.key").write_text(KEY)
    (state / "alice.key").chmod(0o600)
    path, tokens = write_config(
        state, callers=["alice"],
        engines={"claude": {"bin": str(CLAUDE), "baseUrl": anthropic.url},
                 "codex": {"bin": str(CODEX), "baseUrl": responses.url, "maxTokensDefault": 200_000}},
        caller_extra={"apiKeyFile": str(state / "alice.key"), "maxProfile": "write",
                      "defaultModels": {"codex": "gpt-5.5"},
                      "network": [f"127.0.0.1:{allowed_port}", f"localhost:{other_port}", "listed.invalid:9"]})
    anthropic_api, responses_api = anthropic.url + "/v1/messages", responses.url + "/responses"
    async with cli_daemon(path) as d:
        dashboard = d.ws.replace("ws://", "http://").removesuffix("/mcpl") + "/"
        common = [dashboard, f"http://127.0.0.1:{other_port}/", f"http://localhost:{allowed_port}/",
                  "http://unlisted.invalid/", f"http://localhost:{other_port}/"]
        claude_probes = [*common, anthropic_api, responses_api, "$ANTHROPIC_BASE_URL/v1/messages"]
        codex_probes = [*common, anthropic_api, responses_api]
        script = (f"return await parallel(["
                  f"() => agent({json.dumps('[[bash:' + probe_command(claude_probes) + ']]')}, {{profile: 'write'}}),"
                  f"() => agent({json.dumps('[[shell:' + probe_command(codex_probes) + ']]')}, "
                  f"{{engine: 'codex', profile: 'write'}}),"
                  f"() => agent('[[gate]] read', {{profile: 'read'}})])")
        with trio.fail_after(200):
            async with connect(d.ws, tokens["alice"]) as h:
                await h.handshake()
                rid = (await h.tool("run", {"script": script, "budgetUsd": 10}))["structuredContent"]["runId"]
                while not any("[[gate]]" in r["prompt"] for r in anthropic.requests):
                    await trio.sleep(0.05)
                table = process_table()
                reader = [p for p in descendants(d.proc.pid) if b"--tools=Read,Grep,Glob,WebFetch,WebSearch\0"
                          in table.get(p, (0, "", b""))[2]]
                assert reader, "the read agent's CLI is not running"
                read_doors = listening(reader[0])
                read_ns = os.readlink(f"/proc/{reader[0]}/ns/net")
                read_env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{reader[0]}/environ").read_bytes().split(b"\0")
                                if b"=" in kv)
                anthropic.gate.set()
                await h.wait_notice(f"{rid}:end")
                result = json.loads((await h.tool("result", {"runId": rid}))["structuredContent"]["text"])
    claude_out, codex_out, read_out = result
    # The read agent: one door, to the key door (which holds the key; the agent holds a
    # bearer), not the caller's hosts; not the daemon's namespace.
    key_door = read_env[b"ANTHROPIC_BASE_URL"].decode()
    assert read_doors == {key_door.removeprefix("http://")} and key_door != anthropic.url
    assert KEY.encode() not in b"".join(read_env.values())
    assert read_ns != os.readlink("/proc/self/ns/net")
    assert read_out.startswith("echo:")
    # The write agents: the model API answered (their tool output came back through it) ...
    assert claude_out.startswith("tool said:") and codex_out.startswith("tool said:"), (claude_out, codex_out)
    for out, api in ((claude_out, anthropic_api), (codex_out, None)):
        # ... the caller's host is reachable, a name not on the list does not resolve, and
        # nothing else on the host answers: the dashboard, another loopback service.
        assert outcome(out, f"http://localhost:{allowed_port}/") == 0, out
        assert outcome(out, "http://unlisted.invalid/") == 6, out
        assert outcome(out, dashboard) == 7, out
        # A listed *name* that resolves to loopback (`localhost`, by the host's resolver)
        # gets its door, but the daemon refuses to carry it there (issue 31 #4): the
        # connection is closed without a byte (curl 52/56), the service never answers.
        for url in (f"http://127.0.0.1:{other_port}/", f"http://localhost:{other_port}/"):
            assert outcome(out, url) in (52, 56), out
        if api:
            assert outcome(out, api) == 7, out            # claude's API directly: no door leads there
    assert outcome(claude_out, responses_api) == 7, claude_out
    # The key door answers the agent's Bash, but without the agent's bearer it refuses.
    assert f"401 rc=0 {key_door}/v1/messages" in claude_out, claude_out
    assert all(r["headers"].get("x-api-key") == KEY for r in anthropic.requests)   # swapped in by the door
    # codex reaches neither the gateway behind its meter nor the other engine's API.
    assert outcome(codex_out, responses_api) == 7 and outcome(codex_out, anthropic_api) == 7, codex_out
    assert all(r["path"] == "/responses" and r["headers"].get("authorization") == f"Bearer {KEY}"
               for r in responses.requests)               # every upstream request came through the meter
