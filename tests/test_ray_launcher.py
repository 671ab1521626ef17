"""The Ray launcher's own logic against a scripted stand-in for Ray (the real cluster is in
test_ray_cluster.py): what it submits, waiting for a node and its start timeout, the idle
watchdog, cancel then force, node loss, infeasible requests, cwd rules. Timeouts run
under MockClock with autojump (a blocked stand-in lets the clock jump)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from swarmbase.launch import ray_stream
from swarmbase.launch.spec import LaunchSpec


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    """Autojump, but only after 0.5 s of real idleness: the stand-in's items come through
    a real thread, which must not look like idleness to the clock."""
    return trio.testing.MockClock(autojump_threshold=0.5)
from .fakes.ray_stand_in import (  # noqa: F401
    HEAD,
    KEY,
    STARTED,
    WORKER,
    FakeGen,
    FakeRay,
    NodeDiedError,
    TaskCancelledError,
    make_launcher,
    spec,
)


async def test_an_agent_streams_lines_and_reports_where_it_ran(tmp_path: Path) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    for item in (STARTED, [b'{"type":"system"}', b'{"type":"assistant"}'], [b'{"type":"result"}'],
                 {"kind": "exit", "code": 0}, StopIteration):
        gen.q.put(item)
    lines: list[bytes] = []
    where: list[dict[str, Any]] = []
    with trio.fail_after(10):
        res = await launcher.run(spec(tmp_path), lambda line: (lines.append(line), b"result" in line)[1], where.append)
    assert lines == [b'{"type":"system"}', b'{"type":"assistant"}', b'{"type":"result"}']
    assert res.final_seen and res.exit_code == 0 and res.error is None and res.lines == 3
    assert where == [{"node": f"w1 ({WORKER['NodeID']})", "pgid": 4242, "placement": "ray"}]
    assert res.node == where[0]["node"] and gen.cancels == []          # it ended by itself
    assert launcher.running == {}
    opts, (payload, shipped) = fake.submitted[0]
    assert opts == {"num_returns": "streaming", "max_retries": 0, "num_cpus": 0, "resources": {"swarmbase_agents": 1},
                    "name": "swarmbase-agent-run_abc-1", "label_selector": {"swarmbase/cli": "claude"}}
    # The key travels in the task's arguments (the CLI's env) only: not in the options
    # (no runtime_env), not in argv.
    assert KEY not in json.dumps(opts) and not any(KEY in a for a in payload["argv"])
    assert payload["env"]["ANTHROPIC_API_KEY"] == KEY and shipped is None
    assert payload["placeholder"] == "@AGENT_DIR@" and payload["files"] == {"prompt.txt": b"hello"}


async def test_the_payload_carries_what_the_nodes_sandbox_needs(tmp_path: Path) -> None:
    """The caller's uid from the local launcher's allocation, the door's one destination,
    the seccomp profile: what node/confine.py reads back."""
    import attrs

    from swarmbase.identity import SandboxUser
    from swarmbase.launch.egress import Endpoint
    from swarmbase.node import confine
    from swarmbase.node.agent import PAYLOAD_VERSION
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    users = {"alice": SandboxUser(uid=600001, gid=600001, name="caller alice")}
    launcher.user_for = users.get
    api = Endpoint("127.0.0.1", 18080)
    for item in (STARTED, {"kind": "exit", "code": 0}, StopIteration):
        gen.q.put(item)
    with trio.fail_after(10):
        await launcher.run(attrs.evolve(spec(tmp_path), owner="alice", egress=(api,)), lambda line: False)
    _, (payload, _) = fake.submitted[0]
    assert payload["v"] == PAYLOAD_VERSION and payload["nesting"] is False
    assert confine.user_of(payload) == users["alice"] and confine.egress_of(payload) == (api,)


async def test_no_node_can_take_it_fails_at_once_without_submitting(tmp_path: Path) -> None:
    launcher, fake = make_launcher(tmp_path, FakeGen(), nodes=[HEAD, {**WORKER, "Labels": {}}])
    res = await launcher.run(spec(tmp_path), lambda line: False)
    assert "no alive node of the Ray cluster can take this agent" in (res.error or "")
    assert "have the resource but not the labels" in res.error
    assert fake.submitted == []
    launcher, fake = make_launcher(tmp_path, FakeGen(), nodes=[HEAD, {**WORKER, "Alive": False}])
    res = await launcher.run(spec(tmp_path), lambda line: False)
    assert "(1 node(s) alive)" in (res.error or "") and fake.submitted == []


async def test_a_cwd_nodes_cannot_see_is_refused(tmp_path: Path) -> None:
    launcher, fake = make_launcher(tmp_path, FakeGen())
    (tmp_path / "private").mkdir()
    res = await launcher.run(spec(tmp_path, cwd=tmp_path / "private"), lambda line: False)
    assert "is not under placement.ray.sharedRoots" in (res.error or "") and fake.submitted == []


async def test_a_runs_work_dir_travels_as_a_tarball(tmp_path: Path) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    work = tmp_path / "runs" / "20260101T000000Z-run_abc" / "work"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("hi")
    s = spec(tmp_path, cwd=work)
    s = LaunchSpec(**{**{a: getattr(s, a) for a in ("argv", "env", "cwd", "key", "files", "stdin_file", "read")},
                      "write": (str(work),)})
    from swarmbase.node import workspace
    node_copy = tmp_path / "node-copy"
    for item in (STARTED, [b"x"]):
        gen.q.put(item)
    # What the node sends back after the CLI edited its copy.
    got: list[Any] = []

    def on_line(line: bytes) -> bool:
        _, (payload, shipped) = fake.submitted[0]
        workspace.unpack(shipped, node_copy)
        before = workspace.manifest(node_copy)
        (node_copy / "notes.txt").unlink()
        (node_copy / "new.txt").write_text("made on the node")
        tar, deleted = workspace.changes(node_copy, before)
        got.append(payload["return_workspace"])
        gen.q.put({"kind": "exit", "code": 0, "workspace": tar, "deleted": deleted})
        gen.q.put(StopIteration)
        return False

    with trio.fail_after(10):
        res = await launcher.run(s, on_line)
    assert res.exit_code == 0 and got == [True]
    assert (work / "new.txt").read_text() == "made on the node" and not (work / "notes.txt").exists()


async def test_start_timeout_cancels_an_unplaced_task(tmp_path: Path, jump_clock: trio.testing.MockClock) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen, startTimeoutMs=120_000)
    t0 = trio.current_time()
    res = await launcher.run(spec(tmp_path), lambda line: False)
    assert "within 120000 ms" in (res.error or "")
    assert trio.current_time() - t0 >= 120
    assert gen.cancels[:1] == [False]             # an ordinary cancel first (it ends a pending task)


async def test_idle_watchdog_then_cancel_then_force(tmp_path: Path, jump_clock: trio.testing.MockClock) -> None:
    gen = FakeGen(ignore_cancel=True)             # the task ignores an ordinary cancel
    launcher, fake = make_launcher(tmp_path, gen)
    gen.q.put(STARTED)
    gen.q.put([b"one line"])
    t0 = trio.current_time()
    res = await launcher.run(spec(tmp_path, idle=30.0), lambda line: False)
    assert res.idle_timeout and res.lines == 1 and res.error is None
    assert gen.cancels == [False, True]           # ordinary first, force after the grace
    assert trio.current_time() - t0 >= 30 + ray_stream.CANCEL_GRACE_S
    # The killed worker's `finally` may not have run: a task on its node forgets the agent.
    assert fake.forgotten() == [(WORKER["NodeID"], (launcher.owner, launcher.boot, "run_abc-1"))]


async def test_cancelling_the_agent_cancels_its_task(tmp_path: Path) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    gen.q.put(STARTED)
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            await launcher.run(spec(tmp_path), lambda line: False, lambda where: scope.cancel())
    assert gen.cancels == [False] and launcher.running == {}
    assert fake.forgotten() == []                  # the task's own `finally` cleans up


async def test_a_cancel_while_submitting_still_cancels_the_task(
        tmp_path: Path, jump_clock: trio.testing.MockClock) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    submitting, release = threading.Event(), threading.Event()
    submit = fake.remote

    def slow_remote(*args: Any) -> FakeGen:
        submitting.set()
        release.wait(10)
        return submit(*args)

    fake.remote = slow_remote            # type: ignore[method-assign]
    threading.Timer(0.3, release.set).start()
    with trio.move_on_after(1):          # the clock jumps while the submission blocks
        await launcher.run(spec(tmp_path), lambda line: False)
    # (under autojump a real thread's few ms can look like the 3 s grace: a force may follow)
    assert submitting.is_set() and len(fake.submitted) == 1 and gen.cancels[:1] == [False]


async def test_node_death_is_node_lost(tmp_path: Path) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    gen.q.put(STARTED)
    gen.q.put([b'{"type":"system"}'])
    gen.q.put(NodeDiedError("node ab… died"))
    with trio.fail_after(10):
        res = await launcher.run(spec(tmp_path), lambda line: False)
    assert res.error == f"node lost: the Ray node running the agent died (w1 ({WORKER['NodeID']}))"
    assert res.lines == 1 and gen.cancels == []


async def test_a_cli_that_cannot_start_on_the_node_is_a_spawn_error(tmp_path: Path) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    gen.q.put({"kind": "spawn-error", "detail": "No such file or directory: /usr/bin/claude"})
    gen.q.put(StopIteration)
    with trio.fail_after(10):
        res = await launcher.run(spec(tmp_path), lambda line: False)
    assert res.spawn_error == "No such file or directory: /usr/bin/claude" and res.node is None


async def test_many_streams_are_not_capped_by_trios_default_thread_limit(tmp_path: Path) -> None:
    """60 agents streaming at once: each holds a reader thread for its whole life."""
    n = 60
    gens = [FakeGen() for _ in range(n)]
    launcher, fake = make_launcher(tmp_path, gens[0])
    launcher.limiter.total_tokens = n * 2
    remote_calls = iter(gens)
    fake.remote = lambda *args: next(remote_calls)       # type: ignore[method-assign]

    async def one(i: int, g: FakeGen) -> None:
        g.q.put(STARTED)
        g.q.put([b"hello"])
        await launcher.run(spec(tmp_path, key=f"run_abc-{i}"), lambda line: False)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i, g in enumerate(gens):
                nursery.start_soon(one, i, g)
            while len(launcher.running) < n:
                await trio.sleep(0.01)
            assert len(launcher.running) == n          # all 60 started: none waits for a thread
            nursery.cancel_scope.cancel()


async def test_a_head_that_does_not_answer_fails_ray_agents_not_the_daemon(
        tmp_path: Path, jump_clock: trio.testing.MockClock) -> None:
    gen = FakeGen()
    launcher, fake = make_launcher(tmp_path, gen)
    gone = threading.Event()
    fake.nodes = lambda: (gone.wait(30), [])[1]           # type: ignore[method-assign]
    res = await launcher.run(spec(tmp_path), lambda line: False)
    assert "does not answer" in (res.error or "") and fake.submitted == []
    assert launcher.view()["error"] == res.error
    res = await launcher.run(spec(tmp_path), lambda line: False)   # the one call still in flight is shared
    assert "does not answer" in (res.error or "")
    gone.set()
