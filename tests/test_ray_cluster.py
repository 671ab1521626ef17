"""Agents placed on a real Ray cluster: a head (no agent slots) and one worker node (the
`swarmbase_agents` resource, token auth on), the daemon as a real process, the fake API
and the real claude CLI — all inside one network namespace holding only `lo`, since Ray
binds every interface otherwise.

Rules: the cluster is shared by the module and stopped by pid (never `ray stop`, which
kills every Ray on the machine by name); the tests run in file order and the last one
kills the worker node. Waits are bounded with fail_after; nothing asserts a duration.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio

from .conftest import give_to_sandbox
from .fakes.anthropic_api import FakeAnthropic
from .ray_daemon import (API_PORT, DAEMON_PORT, KEY, STATUS_PROBE, Daemon, ended, http_get, marked_processes, mcpl,
                         rows, serve_api, start_run, wait_status, write_config)
from .raycluster import RayCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[RayCluster]:
    if not (Path(__file__).parent / ".tools" / "node_modules" / ".bin" / "claude").exists():
        pytest.fail("the Claude Code CLI is not installed: run bash tests/install.sh")
    c = RayCluster(root=tmp_path_factory.mktemp("ray")).start()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def daemon_state(cluster: RayCluster) -> Iterator[Daemon]:
    d = Daemon(cluster, write_config(cluster.root / "d1", cluster)).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def daemon(daemon_state: Daemon) -> Daemon:
    """The module's daemon, started again if a test killed it."""
    if not daemon_state.alive:
        daemon_state.start()
    return daemon_state


@pytest.fixture
async def api(cluster: RayCluster, nursery: trio.Nursery) -> FakeAnthropic:
    fake = FakeAnthropic()
    await nursery.start(serve_api, cluster, fake.app())
    return fake


THREE = """
const prompts = ['[[usage:1000,200]] one', '[[usage:2000,100]] two', '[[text:three]]'];
const out = await parallel(prompts.map(p => () => agent(p, {placement: PLACEMENT, detail: true})));
return out.map(r => ({ok: r.ok, text: r.text, cost: r.costUsd, tokens: r.tokens, estimated: r.estimated}));
"""


async def test_three_agents_placed_on_the_worker_settle_as_locally(
        cluster: RayCluster, daemon: Daemon, api: FakeAnthropic) -> None:
    async with mcpl(cluster, daemon.token) as host:
        ray_run = await start_run(host, THREE.replace("PLACEMENT", "'ray'"))
        local_run = await start_run(host, THREE.replace("PLACEMENT", "'local'"))
        st = await wait_status(host, ray_run, ended, timeout=120)
        local = await wait_status(host, local_run, ended, timeout=120)
        assert st["status"] == "completed", st
        assert local["status"] == "completed", local
        res = json.loads((await host.tool("result", {"runId": ray_run}))["structuredContent"]["text"])
        res_local = json.loads((await host.tool("result", {"runId": local_run}))["structuredContent"]["text"])
    assert [r["ok"] for r in res] == [True, True, True], rows(st)
    assert res[2]["text"] == "three"
    assert res == res_local                      # same results, same costs and tokens as local agents
    assert res[0]["cost"] > 0 and res[1]["cost"] > 0
    assert st["spentUsd"] == local["spentUsd"]
    worker_id = next(n for n in cluster_nodes(cluster) if n["Labels"].get("swarmbase/name") == "w1")["NodeID"]
    for row in rows(st):
        assert row["node"] == f"w1 ({worker_id})"          # status names the node
        assert daemon.agent(ray_run, row["n"])["node"] == row["node"]    # and so does the record
        history = [h["state"] for h in daemon.agent(ray_run, row["n"])["history"]]
        assert history[-3:] == ["waiting-node", "running", "done"], history
    for row in rows(local):
        assert row["node"] is None
    # The caller's key went to the node inside the task's arguments only.
    assert cluster.session_logs()
    logs = "".join(p.read_text(errors="replace") for p in cluster.session_logs())
    assert KEY not in logs and KEY not in daemon.stderr.decode(errors="replace")


async def test_workspaces_shared_root_and_shipped_work_dir(cluster: RayCluster, daemon: Daemon,
                                                           api: FakeAnthropic) -> None:
    shared = cluster.root / "d1" / "shared" / "repo"
    shared.mkdir(exist_ok=True)
    (shared / "seen.txt").write_text("on the shared mount\n")
    (shared / "gone.txt").write_text("x")
    give_to_sandbox(shared, daemon.state)       # a write agent writes as its caller's uid, on a node too
    script = f"""
    const a = await agent('[[bash:cat seen.txt && echo edited > mine.txt]]', {{placement: 'ray', profile: 'write',
                          cwd: {json.dumps(str(shared))}}});
    const b = await agent('[[bash:ls && echo shipped > made.txt && mkdir -p sub && echo deep > sub/f.txt && rm gone.txt]]',
                          {{placement: 'ray', profile: 'write'}});
    return {{a, b}};
    """
    async with mcpl(cluster, daemon.token) as host:
        # The run's own work dir is not shared: it travels to the node as a tarball and the
        # edits come back. A file put there by an earlier agent travels along.
        run = await start_run(host, "await agent('[[bash:echo x > gone.txt]]', {profile: 'write'});\n" + script,
                              keepWork=True)
        st = await wait_status(host, run, ended, timeout=120)
        assert st["status"] == "completed", st
        out = json.loads((await host.tool("result", {"runId": run}))["structuredContent"]["text"])
        refused = await start_run(host, "return await agent('x', {placement: 'ray', cwd: CWD})".replace(
            "CWD", json.dumps(str(cluster.root / "d1" / "shared"))))
        ok = await wait_status(host, refused, ended)
    assert "on the shared mount" in out["a"]
    assert (shared / "mine.txt").read_text() == "edited\n"
    assert "gone.txt" in out["b"]
    work = daemon.run_dir(run) / "work"
    assert (work / "made.txt").read_text() == "shipped\n"
    assert (work / "sub" / "f.txt").read_text() == "deep\n"
    assert not (work / "gone.txt").exists()
    assert ok["status"] == "completed"          # the shared root itself is a valid cwd


async def test_a_cwd_off_the_shared_roots_is_refused(cluster: RayCluster, daemon: Daemon, api: FakeAnthropic) -> None:
    outside = cluster.root / "d1" / "shared" / ".." / "elsewhere"
    async with mcpl(cluster, daemon.token) as host:
        # cwdRoots allows it, sharedRoots does not: refused before anything is placed.
        run = await start_run(host, "try { await agent('x', {placement: 'ray', cwd: CWD}) } catch (e) { return String(e) }"
                              .replace("CWD", json.dumps(str(outside))))
        st = await wait_status(host, run, ended)
        text = (await host.tool("result", {"runId": run}))["structuredContent"]["text"]
    assert st["status"] == "completed"
    assert "not inside this caller's cwdRoots" in text or "sharedRoots" in text


async def test_cancel_mid_stream_leaves_no_process_on_the_node(cluster: RayCluster, daemon: Daemon,
                                                              api: FakeAnthropic) -> None:
    mark = "sb-bg-" + os.urandom(4).hex()
    # A background command in a group of its own (the agent's shell does that), then a hang.
    command = f"(exec -a {mark} tail -f /dev/null) > /dev/null 2>&1 & echo started"
    async with mcpl(cluster, daemon.token) as host:
        run = await start_run(host, f"return await agent({json.dumps('[[bashhang:' + command + ']]')}, "
                                    "{placement: 'ray', profile: 'write'})")
        with trio.fail_after(90):
            while not named(mark) or len(api.requests) < 2:
                await trio.sleep(0.05)
        st = await wait_status(host, run, lambda s: rows(s) and rows(s)[0]["state"] == "running")
        assert rows(st)[0]["node"].startswith("w1 (")
        # The nodes page: the worker takes agents, passed its boot check, runs this agent.
        with trio.fail_after(30):
            while not (w1 := worker_row(json.loads((await http_get(cluster, "/nodes.json"))[1]))).get("check", {}).get("cli"):
                await trio.sleep(0.2)
        assert w1["eligible"] and w1["alive"] and w1["slots"] == cluster.slots
        with trio.fail_after(15):                     # the watcher's view: one of the slots is taken
            while worker_row(json.loads((await http_get(cluster, "/nodes.json"))[1])).get("free") != cluster.slots - 1:
                await trio.sleep(0.2)
        assert w1["check"]["cli"]["ok"] and w1["check"]["sandbox"] == "bwrap"
        assert [r["ok"] for r in w1["check"]["roots"]] == [True]
        assert [a["runId"] for a in w1["running"]] == [run]
        status, page = await http_get(cluster, "/nodes")
        assert status == 200 and f'href="/runs/{run}/agents/1"' in page
        running = marked_processes()
        assert running                                        # the CLI and its children, on the node
        # The key is in no process's argv (it is in the CLI's environment only).
        assert not [p for p in all_pids() if KEY.encode() in cmdline(p)]
        await host.tool("cancel", {"runId": run})
        st = await wait_status(host, run, ended)
        # The processes and the node's record go (the task's `finally`, or after a force
        # cancel the clean-up task): the record may outlive the processes by a moment.
        with trio.fail_after(10):
            while marked_processes() or named(mark) or list((cluster.node_dir / "procs").rglob("*.json")):
                await trio.sleep(0.05)
    assert st["status"] == "cancelled"
    assert rows(st)[0]["state"] == "cancelled"


async def test_kill9_of_the_daemon_leaves_no_process_and_boot_reaps(cluster: RayCluster, daemon: Daemon,
                                                                   api: FakeAnthropic) -> None:
    async with mcpl(cluster, daemon.token) as host:
        await start_run(host, "return await parallel([1, 2].map(i => () => agent('[[hang]] ' + i, {placement: 'ray'})))")
        with trio.fail_after(90):
            while len(marked_processes()) < 2 or api.live < 2:
                await trio.sleep(0.05)
    assert len(list((cluster.node_dir / "procs").rglob("*.json"))) == 2     # one record per running agent
    daemon.kill9()
    await trio.sleep(3)
    assert marked_processes() == []                 # Ray killed the workers; the guardians ended the groups
    # A leftover the guardian could not have caught (planted): the next boot's reaper kills it.
    stray = plant_leftover(cluster.node_dir, (daemon.state / "ray-owner").read_text().strip())
    daemon.start()
    with trio.fail_after(60):
        while stray.poll() is None or list((cluster.node_dir / "procs").rglob("*.json")):
            await trio.sleep(0.1)


def plant_leftover(node_dir: Path, owner: str) -> "subprocess.Popen[bytes]":
    """A process in a session of its own with an agent's marker and a record in an old
    boot's dir, as a daemon whose guardians failed would leave."""
    mark = f"{owner}/old-boot/planted"
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True, env={"SWARMBASE_NODE_AGENT": mark})
    from swarmbase.node import state
    path = node_dir / "procs" / owner / "old-boot" / "planted.json"
    state.write_record(path, {"pgid": proc.pid, "startTime": state.start_time(proc.pid), "marker": mark})
    return proc


async def test_a_node_agent_gets_the_sandbox_of_a_local_agent(cluster: RayCluster, daemon: Daemon,
                                                               api: FakeAnthropic) -> None:
    """Issue 31 #5: on a root node the agent runs as its caller's uid (the daemon's
    allocation), without capabilities, under the seccomp filter, in a network namespace
    whose one door leads to its key door on the node (#3): the daemon's dashboard on the
    same loopback is out of reach, and so is the model API itself, which the CLI reaches
    through the key door only."""
    probe = base64.b64encode(STATUS_PROBE.encode()).decode()
    command = f"echo {probe} | base64 -d > probe.py; python3 probe.py {DAEMON_PORT} {API_PORT}"
    async with mcpl(cluster, daemon.token) as host:
        run = await start_run(host, f"return await agent({json.dumps('[[bash:' + command + ']]')}, "
                                    "{placement: 'ray', profile: 'write'})")
        st = await wait_status(host, run, ended, timeout=120)
        text = json.loads((await host.tool("result", {"runId": run}))["structuredContent"]["text"])
    assert st["status"] == "completed" and rows(st)[0]["node"].startswith("w1 ("), st
    said = {line.split(":")[0]: line.split(":", 1)[1].strip()
            for line in text.replace("tool said: ", "\n").splitlines() if ":" in line}
    uid = json.loads((daemon.state / "identities.json").read_text())["callers"]["alice"]
    assert uid != 0 and said.get("Uid") == str(uid), text
    assert said.get("CapEff") == "0000000000000000" and said.get("Seccomp") == "2", text
    assert said.get("NoNewPrivs") == "1", text
    assert f"port {DAEMON_PORT} closed ConnectionRefusedError" in text, text      # no door to the dashboard
    assert f"port {API_PORT} closed ConnectionRefusedError" in text, text         # nor the API but by the key door
    assert len(api.requests) >= 2                  # which the CLI reached (its two turns)


def agent_processes() -> dict[int, bytes]:
    """Every live process of a node agent (its marker, or in the group of one that has it)
    -> its environment and argv."""
    marked = marked_processes()
    groups = {os.getpgid(pid) for pid in marked if os.path.exists(f"/proc/{pid}")}
    out = {}
    for d in Path("/proc").iterdir():
        try:
            pid = int(d.name)
            if pid in marked or os.getpgid(pid) in groups:
                out[pid] = (d / "environ").read_bytes() + b"\n" + (d / "cmdline").read_bytes()
        except (ValueError, OSError):          # not a pid, or gone meanwhile
            continue
    return out


async def test_the_callers_key_never_enters_a_node_agent(cluster: RayCluster, daemon: Daemon,
                                                          api: FakeAnthropic) -> None:
    """Issue 31 #3 on Ray: while the node agent's request is held at the API, no process of
    it has the caller's key in its environment or argv and no file in the node's agent
    homes has it; the CLI holds a bearer and the URL of its node's key door (its own
    `env`, sent back to the model, says so), and the API gets the key from that door.
    That bearer was made by the daemon, whose redactor held it: the run's transcript,
    records and status show the redaction mark where the agent printed it."""
    prompt = "[[gate]] [[bash:env; tr '\\0' '\\n' < /proc/$PPID/environ]]"
    async with mcpl(cluster, daemon.token) as host:
        run = await start_run(host, f"return await agent({json.dumps(prompt)}, {{placement: 'ray', profile: 'write'}})")
        with trio.fail_after(90):
            while not api.requests:              # the CLI is up on the node, waiting on its first answer
                await trio.sleep(0.05)
        held = agent_processes()
        homes = {p: p.read_bytes() for p in (cluster.node_dir / "homes").rglob("*") if p.is_file()}
        api.gate.set()
        st = await wait_status(host, run, ended, timeout=120)
    assert st["status"] == "completed" and rows(st)[0]["node"].startswith("w1 ("), st
    clis = [pid for pid, text in held.items() if b"ANTHROPIC_BASE_URL=" in text]
    assert clis and not [pid for pid, text in held.items() if KEY.encode() in text], held
    assert homes and not [p for p, data in homes.items() if KEY.encode() in data]
    told = json.dumps([r["body"] for r in api.requests])
    assert "ANTHROPIC_API_KEY=" in told and "ANTHROPIC_BASE_URL=http://127.0.0.1:" in told
    assert KEY not in told
    assert len(api.requests) >= 2 and all(r["headers"].get("x-api-key") == KEY for r in api.requests)
    bearers = {m.decode() for pid in clis for m in re.findall(rb"ANTHROPIC_API_KEY=([^\0\n]+)", held[pid])}
    written = "".join(f.read_text(errors="replace") for d in daemon.state.glob(f"runs/*{run}")
                      for f in d.rglob("*") if f.is_file())
    assert bearers and all(b in told for b in bearers), bearers        # the agent really printed it
    assert "ANTHROPIC_API_KEY=[redacted]" in written, written[-2000:]
    assert not [b for b in bearers if b in written or b in json.dumps(st)], bearers


async def test_node_death_fails_its_agent_and_the_run_completes(cluster: RayCluster, daemon: Daemon,
                                                               api: FakeAnthropic) -> None:
    script = """
    const a = await agent('[[hang]] on a node that dies', {placement: 'ray', detail: true});
    const b = await agent('[[text:local still works]]', {placement: 'local'});
    return {a: a.ok, error: a.error, b};
    """
    async with mcpl(cluster, daemon.token) as host:
        run = await start_run(host, script)
        with trio.fail_after(90):
            while not marked_processes() or api.live < 1:
                await trio.sleep(0.05)
        cluster.kill_worker_node()
        st = await wait_status(host, run, ended, timeout=60)
        out = json.loads((await host.tool("result", {"runId": run}))["structuredContent"]["text"])
        with trio.fail_after(10):
            while marked_processes():
                await trio.sleep(0.05)
        # No alive node has an agent slot now: a Ray agent fails at once, before any wait.
        lone = await start_run(host, "return await agent('x', {placement: 'ray', detail: true})")
        st2 = await wait_status(host, lone, ended, timeout=30)
        out2 = json.loads((await host.tool("result", {"runId": lone}))["structuredContent"]["text"])
    assert st["status"] == "completed", st
    assert out["a"] is False and out["error"].startswith("node lost"), out
    assert out["b"] == "local still works"
    assert rows(st)[0]["state"] == "failed" and rows(st)[0]["node"].startswith("w1 (")
    assert out2["ok"] is False and "no alive node of the Ray cluster can take this agent" in out2["error"], out2
    assert rows(st2)[0]["startedAt"] is None and rows(st2)[0]["costUsd"] == 0


def worker_row(view: dict[str, Any]) -> dict[str, Any]:
    return next((n for n in view.get("nodes", []) if n["name"] == "w1"), {})


def all_pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def named(mark: str) -> list[int]:
    return [p for p in all_pids() if cmdline(p).startswith(mark.encode() + b"\0")]


def cluster_nodes(cluster: RayCluster) -> list[dict[str, Any]]:
    import subprocess
    import sys
    probe = ("import json, ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(json.dumps(ray.nodes()))")
    out = subprocess.run(cluster.ns.argv([sys.executable, "-c", probe, cluster.address]), env=cluster.env(),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
