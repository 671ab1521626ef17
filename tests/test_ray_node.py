"""The node side of Ray placement, run here without Ray: the guardian ends an agent's
group when its worker dies, the task body's cleanup, the reaper, shipped workspaces; and
the daemon side's config and agent() options for placement."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from swarmbase import config
from swarmbase.identity import SandboxUser
from swarmbase.launch.sandbox import HostLayout
from swarmbase.node import confine
from swarmbase.node import agent as node_agent
from swarmbase.node import state, workspace
from swarmbase.node.guardian import Guarded
from swarmbase.daemon import build_engines
from swarmbase.runs.agent_opts import OptionError, resolve
from swarmbase.runs.model import Run
from swarmbase.runs.records import Redactor
from swarmbase.runs.store import RunStore

from .conftest import process_table
from .ray_daemon import STATUS_PROBE


def alive(pid: int) -> bool:
    entry = process_table().get(pid)
    return entry is not None and entry[1] not in ("Z", "X")


def wait_until(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# A CLI stand-in: prints the pid of a grandchild that ignores TERM and holds stdout, then
# its own pid, then hangs.
HANGING_CLI = ["/bin/sh", "-c", "(trap '' TERM; while :; do sleep 1; done) & echo $!; echo $$; cat; sleep 600"]


@pytest.mark.slow
def test_the_guardian_kills_the_group_when_the_worker_dies(tmp_path: Path) -> None:
    """Ray kills only the worker and its direct children; the guardian, forked inside the
    agent's group, sees the lifeline close and takes the whole group down."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("")
    g = Guarded(HANGING_CLI, env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path), stdin_file=str(prompt))
    lines = g.lines()
    batch = next(lines)
    while len(batch) < 2:
        batch += next(lines)
    grandchild, leader = int(batch[0]), int(batch[1])
    assert leader == g.pid and alive(grandchild)
    os.close(g._life_w)                   # what the worker's death does to the lifeline
    g._life_w = -1
    assert wait_until(lambda: not alive(grandchild) and not alive(leader), 10)
    g.proc.wait()


@pytest.mark.slow
def test_reading_ends_soon_after_the_leader_exits_even_if_stdout_stays_open(tmp_path: Path) -> None:
    g = Guarded(["/bin/sh", "-c", "(trap '' TERM; sleep 600) & echo hi; exit 3"], env={"PATH": os.environ["PATH"]},
                cwd=str(tmp_path), stdin_file=None)
    got = [line for batch in g.lines() for line in batch]
    assert got == [b"hi"]
    g.kill()
    assert g.proc.returncode == 3
    assert not [p for p, (ppid, st, cmd) in process_table().items() if ppid == g.pid and st not in ("Z", "X")]


def test_the_cli_reads_the_prompt_and_never_holds_the_lifeline(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the prompt\n")
    g = Guarded(["/bin/sh", "-c", "cat; ls /proc/$$/fd"], env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                stdin_file=str(prompt))
    got = [line for batch in g.lines() for line in batch]
    g.kill()
    assert got[0] == b"the prompt"
    assert sorted(got[1:]) == [b"0", b"1", b"2"]          # no fd 3: only the guardian holds the lifeline


# What a root daemon sends for its caller's agent (the uid identity.py allocated it).
CALLER_UID = {"uid": 600001, "gid": 600001, "name": "caller alice"} if os.geteuid() == 0 else None


def payload(tmp_path: Path, argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"v": node_agent.PAYLOAD_VERSION, "user": CALLER_UID, "owner": "own1", "boot": "b1", "key": "run_x-1", "argv": argv,
            "env": {"PATH": os.environ["PATH"], "HOME": "@AGENT_DIR@/home", "SECRET": "k-123456"},
            "cwd": str(tmp_path / "cwd"), "files": {"prompt.txt": b"hello node"}, "dirs": ["home", "tmp"],
            "stdin_file": "prompt.txt", "read": [str(tmp_path / "cwd")], "write": [], "network": True,
            "rlimits": [], "sandbox": "none", "placeholder": "@AGENT_DIR@", "return_workspace": False, **extra}


@pytest.fixture
def node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "node"
    monkeypatch.setenv("SWARMBASE_NODE_DIR", str(d))
    monkeypatch.setattr(node_agent, "where", lambda: ("nodeid1", "w1"))
    (tmp_path / "cwd").mkdir()
    return d


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_the_task_body_streams_and_cleans_up(tmp_path: Path, node_dir: Path, sandbox: str) -> None:
    if sandbox == "bwrap" and not shutil.which("bwrap"):
        pytest.fail("bubblewrap is required for this test (tests/install.sh installs it)")
    items = list(node_agent.run_agent(payload(tmp_path, ["/bin/sh", "-c", 'cat; echo; echo "$HOME"; pwd'],
                                              sandbox=sandbox)))
    started, *batches, end = items
    assert started == {"kind": "started", "node": "nodeid1", "name": "w1", "pgid": started["pgid"], "sandbox": sandbox}
    lines = [line for b in batches for line in b]
    home = "/run/swarmbase/agent/home" if sandbox == "bwrap" else str(node_dir / "homes/own1/b1/run_x-1/home")
    assert lines == [b"hello node", home.encode(), str(tmp_path / "cwd").encode()]
    assert end == {"kind": "exit", "code": 0}
    assert not (node_dir / "homes/own1/b1/run_x-1").exists()
    assert not list((node_dir / "procs").rglob("*.json"))


def greeter() -> tuple[socket.socket, threading.Thread]:
    """A loopback listener on this host that says hello to each connection."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(1024)          # the probe's request first: no reset on close
                conn.sendall(b"hello")
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, t


def test_a_root_node_gives_the_agent_a_local_agents_sandbox(tmp_path: Path, node_dir: Path) -> None:
    """The caller's uid (as root, CI; a plain node's own otherwise), no capability, no new
    privileges, the seccomp filter, and a network namespace whose one door leads where the
    payload says: another loopback port of the node is unreachable."""
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap is required for this test (tests/install.sh installs it)")
    allowed, t1 = greeter()
    other, t2 = greeter()
    try:
        a, o = allowed.getsockname()[1], other.getsockname()[1]
        items = list(node_agent.run_agent(payload(
            tmp_path, ["/usr/bin/python3", "-c", STATUS_PROBE, str(a), str(o)], sandbox="bwrap", stdin_file=None,
            egress=[["127.0.0.1", a]])))
    finally:
        allowed.close()
        other.close()
    started, *batches, end = items
    lines = [line.decode() for b in batches for line in b]
    assert started["kind"] == "started" and end == {"kind": "exit", "code": 0}, items
    assert f"Uid: {CALLER_UID['uid'] if CALLER_UID else os.geteuid()}" in lines and "CapEff: 0000000000000000" in lines, lines
    assert "Seccomp: 2" in lines and "NoNewPrivs: 1" in lines, lines
    assert f"port {a} open hello" in lines, lines              # through the door
    assert f"port {o} closed ConnectionRefusedError" in lines, lines    # no door: nothing listens inside
    assert not (node_dir / "homes/own1/b1/run_x-1").exists()


def test_a_node_refuses_what_it_cannot_confine(tmp_path: Path, node_dir: Path) -> None:
    """Never a weaker sandbox in silence: the agent is refused with the reason."""
    items = list(node_agent.run_agent(payload(tmp_path, ["/bin/true"], sandbox="bwrap",
                                              user=None if os.geteuid() == 0 else CALLER_UID)))
    assert [i["kind"] for i in items] == ["spawn-error"]
    assert ("the daemon named no uid" if os.geteuid() == 0 else "which cannot switch to it") in items[0]["detail"]
    assert not (node_dir / "homes/own1/b1/run_x-1").exists()


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_a_node_checks_the_paths_right_before_the_start(tmp_path: Path, node_dir: Path, sandbox: str) -> None:
    """As the daemon does for a local agent (launch/pins.py): a caller's cwd on a shared root
    swapped for a symlink after agent() (here to the node's own state dir, where other
    agents' homes are) is refused, and so is a path that leads into the node's state."""
    roots = tmp_path / "roots"
    (roots / "repo").mkdir(parents=True)
    state.makedirs(node_dir / "homes" / "own1" / "other-boot" / "someone-else")
    cwd = roots / "repo"
    checks = {"cwd_roots": [str(roots)], "caller_paths": [str(cwd)], "forbidden": [str(tmp_path / "daemon-state")]}
    ok = list(node_agent.run_agent(payload(tmp_path, ["/bin/true"], sandbox=sandbox, cwd=str(cwd), read=[str(cwd)],
                                           stdin_file=None, **checks)))
    assert [i["kind"] for i in ok] == ["started", "exit"], ok
    cwd.rmdir()
    cwd.symlink_to(node_dir / "homes")
    swapped = list(node_agent.run_agent(payload(tmp_path, ["/bin/true"], sandbox=sandbox, cwd=str(cwd),
                                                read=[str(cwd)], stdin_file=None, **checks)))
    assert [i["kind"] for i in swapped] == ["spawn-error"], swapped
    assert "changed between the agent() call and its launch" in swapped[0]["detail"]
    (tmp_path / "daemon-state").mkdir()
    into = list(node_agent.run_agent(payload(tmp_path, ["/bin/true"], sandbox=sandbox, cwd=str(tmp_path / "cwd"),
                                             write=[str(tmp_path / "daemon-state")], stdin_file=None, **checks)))
    assert [i["kind"] for i in into] == ["spawn-error"] and "the daemon's state" in into[0]["detail"], into


LAYOUT = HostLayout(symlinks=(), dirs=(), bwrap="/usr/bin/bwrap", setpriv="/usr/bin/setpriv")
USER = SandboxUser(uid=600003, gid=600003, name="caller bob")


@pytest.mark.parametrize("wanted, layout, euid, user, said", [
    ("none", attrs.evolve(LAYOUT, bwrap=None), 0, None, None),             # the operator chose no sandbox
    ("bwrap", LAYOUT, 0, USER, None),                                       # a root node drops to the caller's uid
    ("bwrap", LAYOUT, 1000, None, None),                                    # a plain node runs agents as itself
    ("bwrap", attrs.evolve(LAYOUT, bwrap=None), 0, USER, "bubblewrap is not installed"),
    ("bwrap", LAYOUT, 0, None, "would run as root in its namespace"),
    ("bwrap", LAYOUT, 1000, USER, "runs as uid 1000, which cannot switch to it"),
    ("bwrap", LAYOUT, 600003, USER, None),                                  # already that uid: no switch
    ("bwrap", attrs.evolve(LAYOUT, setpriv=None), 0, USER, "setpriv (util-linux) is not installed"),
])
def test_what_a_node_refuses(wanted: str, layout: HostLayout, euid: int, user: SandboxUser | None,
                             said: str | None) -> None:
    why = confine.refusal(wanted, layout, euid, user, "w1")
    assert (why is None) if said is None else (said in (why or "") and "w1" in (why or "")), why


def test_the_boot_check_says_when_a_node_would_refuse_agents(tmp_path: Path, node_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes page and the daemon's log learn it at the node's boot check, not from
    the first agent's failure."""
    from swarmbase.node import probe
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap is required for this test (tests/install.sh installs it)")
    monkeypatch.setattr(probe, "where", lambda: ("nodeid1", "w1"))
    root = os.geteuid() == 0
    ok = probe.check_node("own1", "b1", sys.executable, [], "bwrap", confine.payload_user(USER) if root else None)
    assert ok["sandbox"] == "bwrap", ok
    refused = probe.check_node("own1", "b1", sys.executable, [], "bwrap", None if root else confine.payload_user(USER))
    assert refused["sandbox"].startswith(probe.REFUSES), refused
    assert ("the daemon named no uid" if root else "cannot switch to it") in refused["sandbox"], refused


def test_the_payload_carries_the_uid_and_the_door_both_ways() -> None:
    from swarmbase.launch.egress import Endpoint
    eps = (Endpoint("127.0.0.1", 18080), Endpoint("api.example.com", 443))
    sent = json.loads(json.dumps({"user": confine.payload_user(USER), "egress": confine.payload_egress(eps)}))
    assert confine.user_of(sent) == USER and confine.egress_of(sent) == eps
    assert confine.user_of({"user": None}) is None and confine.egress_of({"egress": None}) is None


# Run by a node agent: what it holds, a request through its key door with what it holds,
# whether the model API's own port is reachable, then wait for the test's `go` file.
KEY_PROBE = """
import os, socket, sys, time, urllib.request
print('bearer', os.environ['ANTHROPIC_API_KEY'])
print('url', os.environ['ANTHROPIC_BASE_URL'])
req = urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages?beta=true', data=b'{}',
                             headers={'x-api-key': os.environ['ANTHROPIC_API_KEY']})
print('answer', urllib.request.urlopen(req, timeout=10).read().decode())
try:
    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()
    print('api port open')
except OSError as e:
    print('api port closed', type(e).__name__)
sys.stdout.flush()
while not os.path.exists('go'):
    time.sleep(0.02)
"""


def model_api() -> tuple[Any, list[dict[str, str]]]:
    """A loopback stand-in for the model API that records each request's path and headers."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
def test_the_callers_key_stays_in_the_nodes_key_door(tmp_path: Path, node_dir: Path, sandbox: str) -> None:
    """Issue 31 #3 on a node: the payload's key goes to a key door the node runs for the
    agent (engines/key_door.py), the CLI holds that door's bearer and URL, and the model
    API gets the key as x-api-key from the door; no process of the agent has the key in
    its environment or argv while it runs. In the sandbox the agent's one door leads to
    the key door: the API's own port is out of reach."""
    from swarmbase.launch.spec import KEY_DOOR_BEARER, KEY_DOOR_URL
    from .ray_daemon import marked_processes
    if sandbox == "bwrap" and not shutil.which("bwrap"):
        pytest.fail("bubblewrap is required for this test (tests/install.sh installs it)")
    canary = "sk-ant-nodecanary-" + os.urandom(8).hex()
    srv, seen = model_api()
    port = srv.server_address[1]
    given = "daemon-made-bearer-" + os.urandom(8).hex()
    p = payload(tmp_path, ["/usr/bin/python3", "-c", KEY_PROBE, str(port)], sandbox=sandbox, stdin_file=None,
                egress=[], keyDoor={"key": canary, "upstream": f"http://127.0.0.1:{port}/gw", "bearer": given})
    p["env"].update(ANTHROPIC_API_KEY=KEY_DOOR_BEARER, ANTHROPIC_BASE_URL=KEY_DOOR_URL)
    body = node_agent.run_agent(p)
    try:
        started = next(body)
        assert started["kind"] == "started", started
        lines: list[str] = []
        while not any(line.startswith("api port") for line in lines):
            lines += [line.decode() for line in next(body)]
        mark = f"{state.MARKER_ENV}={state.marker('own1', 'b1', 'run_x-1')}\0".encode()
        agent = [pid for pid in marked_processes() if mark in Path(f"/proc/{pid}/environ").read_bytes()]
        held = {pid: Path(f"/proc/{pid}/environ").read_bytes() + Path(f"/proc/{pid}/cmdline").read_bytes()
                for pid in agent}
        (tmp_path / "cwd" / "go").touch()
        rest = list(body)
    finally:
        body.close()
        srv.shutdown()
        srv.server_close()
    said = dict(line.split(" ", 1) for line in lines if " " in line)
    assert agent and not [pid for pid, text in held.items() if canary.encode() in text], held
    assert any(b"ANTHROPIC_API_KEY=" + said["bearer"].encode() in text for text in held.values())
    assert said["bearer"] == given and said["url"].startswith("http://127.0.0.1:"), said   # the daemon's bearer
    assert said["answer"] == '{"ok": true}', lines
    assert [(r["path"], r["x-api-key"]) for r in seen] == [("/gw/v1/messages?beta=true", canary)], seen
    if sandbox == "bwrap":
        assert "api port closed ConnectionRefusedError" in lines, lines
    assert rest[-1] == {"kind": "exit", "code": 0}, rest
    assert canary not in json.dumps([lines, [str(i) for i in rest]])


def test_the_payload_carries_the_key_for_the_key_door_only(tmp_path: Path) -> None:
    """Off the daemon's machine the claude CLI's env holds placeholders the node fills with
    its key door's bearer and URL; the key is in `keyDoor`, its door is the node's to add."""
    from swarmbase.engines.base import AgentJob
    from swarmbase.engines.claude_agent import ClaudeEngine
    from swarmbase.launch.egress import Endpoint
    from swarmbase.launch.ray import RayLauncher
    from swarmbase.launch.spec import KEY_DOOR_BEARER, KEY_DOOR_URL
    cfg = ray_config(tmp_path, engines={"claude": {"bin": "/bin/true", "baseUrl": "https://gw.example:8443/a"}})
    job = AgentJob(run_id="r", n=1, label="", engine="claude", model=None, effort=None, profile="write", schema=None,
                   prompt="p", cwd=str(tmp_path), api_key="sk-canary-1", max_usd=1, max_tokens=1,
                   caller_max_profile="write", timeout_ms=1, network=("pypi.org:443",))
    bearer = "bearer-canary-" + os.urandom(8).hex()
    spec = ClaudeEngine(cfg).spec(job, bearer, beside=True)
    assert spec.env["ANTHROPIC_API_KEY"] == KEY_DOOR_BEARER and spec.env["ANTHROPIC_BASE_URL"] == KEY_DOOR_URL
    with pytest.raises(ValueError):             # off this machine never without the bearer (nor with the key)
        ClaudeEngine(cfg).spec(job, beside=True)
    assert spec.egress == (Endpoint("pypi.org", 443),)          # no door to the API itself
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    sent = RayLauncher(cfg)._payload(spec, False)
    outside = repr({k: v for k, v in sent.items() if k != "keyDoor"})
    assert "sk-canary-1" not in outside and bearer not in outside
    assert confine.model_key_of(json.loads(json.dumps({"keyDoor": sent["keyDoor"]}))) == spec.model_key
    assert spec.model_key is not None and spec.model_key.upstream == "https://gw.example:8443/a"
    assert spec.model_key.bearer == bearer and sent["keyDoor"]["bearer"] == bearer
    assert "sk-canary-1" not in repr(spec) and bearer not in repr(spec)
    assert confine.model_key_of({}) is None


# A claude CLI stand-in that says what it holds as its key, in its stream and its result.
ECHO_KEY_CLI = """#!{python}
import json, os, sys
sys.stdin.read()
key = os.environ["ANTHROPIC_API_KEY"]
print(json.dumps({{"type": "system", "subtype": "init", "model": "claude-fake", "apiKey": key}}))
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "result": "my key is " + key,
                  "total_cost_usd": 0.01, "usage": {{"input_tokens": 1, "output_tokens": 1}}}}))
"""


class NodeStandIn:
    """A Ray placement without Ray: RayLauncher's payload for the spec, run by the node's
    task body here (its key door included), its lines fed back as the launcher feeds them."""
    initial_state = "running"
    confined = False
    spawned = 0
    on_daemon_host = False

    def __init__(self, cfg: config.Config) -> None:
        from swarmbase.launch.ray import RayLauncher
        self.ray = RayLauncher(cfg)
        self.payloads: list[dict[str, Any]] = []
        self.raw: list[bytes] = []

    async def run(self, spec: Any, on_line: Any, started: Any = None) -> Any:
        import trio
        from swarmbase.launch.spec import ProcResult
        payload = self.ray._payload(spec, False)
        self.payloads.append(payload)
        items = await trio.to_thread.run_sync(lambda: list(node_agent.run_agent(payload)))
        res = ProcResult()
        for item in items:
            if isinstance(item, list):
                for line in item:
                    self.raw.append(line)
                    res.final_seen = on_line(line) or res.final_seen
            elif item.get("kind") == "exit":
                res.exit_code = item["code"]
            elif item.get("kind") == "spawn-error":
                res.spawn_error = item["detail"]
        return res


async def test_a_node_agents_bearer_is_redacted_while_it_lives(tmp_path: Path, node_dir: Path) -> None:
    """Issue 31 #3: the daemon makes a node agent's bearer and its redactor holds it for
    the agent's life, as for a local agent: an agent that echoes its ANTHROPIC_API_KEY
    leaves the redaction mark in its transcript and its result, never the bearer (which
    it really held: its raw stream has it), and the bearer is dropped once it ended."""
    from swarmbase.engines.base import AgentIO, AgentJob
    from swarmbase.engines.claude_agent import ClaudeEngine
    from swarmbase.runs.records import Transcript
    cli = tmp_path / "claude"
    cli.write_text(ECHO_KEY_CLI.format(python=sys.executable))
    cli.chmod(0o755)
    cfg = ray_config(tmp_path, engines={"claude": {"bin": str(cli)}})
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    redact = Redactor(["sk-canary-node-1"])
    job = AgentJob(run_id="r", n=1, label="", engine="claude", model=None, effort=None, profile="write", schema=None,
                   prompt="p", cwd=str(tmp_path / "cwd"), api_key="sk-canary-node-1", max_usd=1, max_tokens=1,
                   caller_max_profile="write", timeout_ms=1)
    node = NodeStandIn(cfg)
    transcript = Transcript(tmp_path / "transcript.jsonl", redact)
    verdict = await ClaudeEngine(cfg, redact=redact).run(job, AgentIO(launcher=node, transcript=transcript.append))
    transcript.close()
    bearer = node.payloads[0]["keyDoor"]["bearer"]
    assert bearer and any(bearer.encode() in line for line in node.raw), node.raw   # the CLI held it
    written = (tmp_path / "transcript.jsonl").read_text()
    assert bearer not in written and '"apiKey":"[redacted]"' in written, written
    assert verdict.ok and verdict.value == "my key is [redacted]", verdict
    assert bearer not in json.dumps([verdict.value, verdict.text, verdict.error])
    assert bearer not in redact.secrets and "sk-canary-node-1" in redact.secrets   # dropped with the agent


def test_a_cancelled_task_kills_the_group_and_what_left_it(tmp_path: Path, node_dir: Path) -> None:
    """Ray's ordinary cancel is a KeyboardInterrupt in the task: `finally` kills the group,
    and a background job that left the group (its own pgid) by its marker."""
    cli = ["/bin/sh", "-c", "setsid sh -c 'echo $$; exec sleep 600' & sleep 600"]
    body = node_agent.run_agent(payload(tmp_path, cli))
    started = next(body)
    record = node_dir / "procs/own1/b1/run_x-1.json"
    assert json.loads(record.read_text())["pgid"] == started["pgid"]
    escaped = int(next(body)[0])
    assert alive(escaped) and os.getpgid(escaped) != started["pgid"]
    with pytest.raises(KeyboardInterrupt):
        body.throw(KeyboardInterrupt)
    assert wait_until(lambda: not alive(escaped) and not alive(started["pgid"]), 5)
    assert not record.exists() and not (node_dir / "homes/own1/b1/run_x-1").exists()


def test_forget_cleans_up_after_a_worker_killed_mid_task(tmp_path: Path, node_dir: Path) -> None:
    """A force cancel kills the worker wherever it was: its `finally` never runs. The
    clean-up task the daemon sends then kills the group and what left it, and removes the
    record and the private dir (the next boot's reaper is no longer needed for them)."""
    cli = ["/bin/sh", "-c", "setsid sh -c 'echo $$; exec sleep 600' & sleep 600"]
    body = node_agent.run_agent(payload(tmp_path, cli))
    started = next(body)
    escaped = int(next(body)[0])
    record = node_dir / "procs/own1/b1/run_x-1.json"
    assert record.exists() and alive(escaped)
    # The generator is left suspended: as far as the node's files know, a dead worker.
    got = state.forget("own1", "b1", "run_x-1")
    assert got["record"] and got["killed"] >= 2
    assert wait_until(lambda: not alive(escaped) and not alive(started["pgid"]), 5)
    assert not record.exists() and not (node_dir / "homes/own1/b1/run_x-1").exists()
    assert state.forget("own1", "b1", "run_x-1") == {"killed": 0, "record": False}    # twice is harmless
    body.close()


def test_a_cli_that_cannot_start_is_reported(tmp_path: Path, node_dir: Path) -> None:
    items = list(node_agent.run_agent(payload(tmp_path, ["/nonexistent/claude"], stdin_file=None)))
    assert items == [{"kind": "spawn-error", "detail": "the executable is missing on node w1: /nonexistent/claude"}]
    assert not (node_dir / "homes/own1/b1/run_x-1").exists()


def test_an_old_payload_version_is_refused(tmp_path: Path, node_dir: Path) -> None:
    with pytest.raises(RuntimeError, match=f"payload v{node_agent.PAYLOAD_VERSION}, the daemon sent v99"):
        next(node_agent.run_agent({**payload(tmp_path, ["true"]), "v": 99}))


def test_the_reaper_kills_an_earlier_lifes_leftovers_only(tmp_path: Path) -> None:
    root = tmp_path / "node"

    def leftover(owner: str, boot: str, key: str, own_group: bool = True) -> subprocess.Popen[bytes]:
        mark = state.marker(owner, boot, key)
        p = subprocess.Popen(["sleep", "600"], start_new_session=own_group, env={state.MARKER_ENV: mark})
        rec, home, _ = state.agent_dirs(owner, boot, key, root)
        state.write_record(rec, {"pgid": p.pid, "startTime": state.start_time(p.pid), "marker": mark})
        state.makedirs(home)
        return p

    old = leftover("own1", "old", "run_a-1")
    current = leftover("own1", "now", "run_b-1")
    other = leftover("own2", "old", "run_c-1")
    try:
        out = state.reap("own1", "now", root)
        assert out["records"] == 1 and out["killed"] >= 1
        assert old.wait(5) == -signal.SIGKILL
        assert current.poll() is None and other.poll() is None       # this life's, another daemon's: kept
        assert not (root / "procs/own1/old").exists() and not (root / "homes/own1/old").exists()
        assert (root / "procs/own1/now/run_b-1.json").exists()
    finally:
        for p in (current, other):
            p.kill()
            p.wait()


def test_a_reused_pid_is_never_killed(tmp_path: Path) -> None:
    root = tmp_path / "node"
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        rec, _, _ = state.agent_dirs("own1", "old", "run_a-1", root)
        # The recorded leader had another start time; the bystander carries no marker.
        state.write_record(rec, {"pgid": bystander.pid, "startTime": 1, "marker": "own1/old/run_a-1"})
        state.reap("own1", "now", root)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_shipped_workspace_comes_back_as_changes(tmp_path: Path) -> None:
    daemon, node = tmp_path / "daemon", tmp_path / "node"
    (daemon / "sub").mkdir(parents=True)
    (daemon / "keep.txt").write_text("keep")
    (daemon / "edit.txt").write_text("old")
    (daemon / "sub" / "gone.txt").write_text("x")
    workspace.unpack(workspace.pack(daemon), node)
    before = workspace.manifest(node)
    (node / "edit.txt").write_text("new text")
    (node / "sub" / "gone.txt").unlink()
    (node / "new" / "deep").mkdir(parents=True)
    (node / "new" / "deep" / "f.txt").write_text("f")
    tar, deleted = workspace.changes(node, before)
    names = tarfile.open(fileobj=io.BytesIO(tar)).getnames()
    assert "keep.txt" not in names and "edit.txt" in names and deleted == ["sub/gone.txt"]
    (daemon / "other.txt").write_text("another agent's edit meanwhile")
    workspace.apply(daemon, tar, deleted)
    assert (daemon / "edit.txt").read_text() == "new text" and (daemon / "keep.txt").read_text() == "keep"
    assert not (daemon / "sub" / "gone.txt").exists() and (daemon / "new/deep/f.txt").read_text() == "f"
    assert (daemon / "other.txt").exists()


def test_hostile_workspace_returns_cannot_escape(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("precious")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.TarError):
        workspace.apply(root, buf.getvalue(), [])
    workspace.apply(root, workspace.pack(root), ["../outside.txt", "/etc/hostname"])
    assert (tmp_path / "outside.txt").read_text() == "precious" and not (tmp_path / "escape.txt").exists()


def test_a_too_large_workspace_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workspace, "MAX_BYTES", 10)
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(workspace.WorkspaceTooLarge):
        workspace.pack(tmp_path)


# -- config and agent() options ---------------------------------------------------------

def ray_config(tmp_path: Path, mode: int = 0o600, **extra: Any) -> config.Config:
    token = tmp_path / "ray-token"
    token.write_text("x" * 40)
    token.chmod(mode)
    (tmp_path / "roots" / "shared").mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {"sandbox": "none", "engines": {"claude": {"bin": sys.executable}},
                           "placement": {"ray": {"address": "10.0.0.5:6379", "tokenFile": str(token),
                                                 "sharedRoots": [str(tmp_path / "roots" / "shared")]}},
                           "callers": [{"name": "alice", "tokenSha256": "a" * 64,
                                        "cwdRoots": [str(tmp_path / "roots")]}]}
    for k, v in extra.items():
        raw[k] = v
    return config.parse(json.dumps(raw), tmp_path / "state" / "config.json")


def fault(tmp_path: Path, **extra: Any) -> str:
    with pytest.raises(config.ConfigError) as ei:
        ray_config(tmp_path, **extra)
    return str(ei.value)


def test_config_refuses_a_ray_cluster_without_a_private_token(tmp_path: Path) -> None:
    cfg = ray_config(tmp_path)
    assert cfg.placement.ray is not None and cfg.placement.ray.resource == "swarmbase_agents"
    assert cfg.callers[0].placements == ["local", "ray"] and cfg.default_placement(cfg.callers[0]) == "local"
    assert "must be mode 0600" in fault(tmp_path, mode=0o640)
    assert "refuses a Ray cluster without token authentication" in fault(
        tmp_path, placement={"ray": {"address": "10.0.0.5:6379"}})
    assert "Ray Client (ray://) is not supported" in fault(
        tmp_path, placement={"ray": {"address": "ray://10.0.0.5:10001", "tokenFile": str(tmp_path / "ray-token")}})
    assert 'placement.default: "ray" needs placement.ray' in fault(tmp_path, placement={"default": "ray"})
    assert "placements[0]" in fault(tmp_path, placement={}, callers=[
        {"name": "a", "tokenSha256": "a" * 64, "placements": ["ray"]}])
    assert "contains the daemon's state dir" in fault(tmp_path, placement={"ray": {
        "address": "h:1", "tokenFile": str(tmp_path / "ray-token"), "sharedRoots": [str(tmp_path / "state")]}})


def resolve_for(cfg: config.Config, opts: dict[str, Any], caller: config.Caller | None = None) -> Any:
    run = Run(id="run_x", caller="alice", dir_name="d", created_at=0.0)
    engines, _, _ = build_engines(cfg, Redactor(), RunStore(cfg.state_dir), {})
    return resolve("p", opts, run, caller or cfg.callers[0], cfg, 1, 60_000, engines)


def test_opts_placement(tmp_path: Path) -> None:
    cfg = ray_config(tmp_path)
    assert resolve_for(cfg, {}).placement == "local"
    assert resolve_for(cfg, {"placement": "ray"}).placement == "ray"
    shared = tmp_path / "roots" / "shared"
    assert resolve_for(cfg, {"placement": "ray", "cwd": str(shared)}).cwd == str(shared)
    with pytest.raises(OptionError, match="not under placement.ray.sharedRoots"):
        resolve_for(cfg, {"placement": "ray", "cwd": str(tmp_path / "roots")})
    with pytest.raises(OptionError, match="must be one of local, ray"):
        resolve_for(cfg, {"placement": "moon"})
    local_only = config.Caller(name="bob", tokenSha256="b" * 64, placements=["local"], engines=["claude"])
    with pytest.raises(OptionError, match="not allowed for caller 'bob'"):
        resolve_for(cfg, {"placement": "ray"}, local_only)
    import attrs
    ray_first = attrs.evolve(cfg, placement=attrs.evolve(cfg.placement, default="ray"))
    assert resolve_for(ray_first, {}).placement == "ray"
    assert resolve_for(ray_first, {}, local_only).placement == "local"


def test_codex_agents_stay_on_this_machine(tmp_path: Path) -> None:
    """A codex agent's requests go through the daemon's meter on loopback: never placed on Ray."""
    cfg = ray_config(tmp_path, sandbox="bwrap", engines={"claude": {"bin": sys.executable},
                                        "codex": {"bin": sys.executable, "baseUrl": "http://127.0.0.1:9",
                                                  "defaultModel": "gpt-test"}})
    with pytest.raises(OptionError, match="placement 'ray' runs claude agents only"):
        resolve_for(cfg, {"engine": "codex", "placement": "ray"})
    import attrs
    ray_first = attrs.evolve(cfg, placement=attrs.evolve(cfg.placement, default="ray"))
    assert resolve_for(ray_first, {"engine": "codex"}).placement == "local"
    assert resolve_for(ray_first, {"engine": "claude"}).placement == "ray"


def test_the_daemon_loads_ray_only_to_use_it(tmp_path: Path) -> None:
    """Services built with and without placement.ray (not yet connected): Ray is not imported."""
    cfg = ray_config(tmp_path)
    code = ("import sys, json, pathlib\n"
            "from swarmbase import config, daemon\n"
            "cfg = config.parse(sys.argv[1], pathlib.Path(sys.argv[2]))\n"
            "s = daemon.build_services(cfg)\n"
            "print(json.dumps({'ray': 'ray' in sys.modules, 'launcher': type(s.ray).__name__,\n"
            "                  'placements': sorted(s.supervisor.agents.launchers)}))\n")
    raw = json.loads(json.dumps({"sandbox": "none", "engines": {"claude": {"bin": sys.executable}},
                                 "placement": {"ray": {"address": "10.0.0.5:6379",
                                                       "tokenFile": str(tmp_path / "ray-token")}}}))
    (tmp_path / "state").mkdir(exist_ok=True)
    for placement, launcher in ((raw["placement"], "RayLauncher"), ({}, "NoneType")):
        out = subprocess.run([sys.executable, "-c", code, json.dumps({**raw, "placement": placement}),
                              str(tmp_path / "state" / "config.json")], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent.parent, timeout=60)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["ray"] is False and got["launcher"] == launcher
        assert got["placements"] == (["local", "ray"] if placement else ["local"])
    assert cfg.placement.ray is not None
