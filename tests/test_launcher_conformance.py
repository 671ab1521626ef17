"""Every placement keeps the Launcher contract (swarmbase/launch/spec.py) the agent service
relies on without asking which launcher it has: the same members, and the same answer to
one agent — its lines in order, the final event seen, the exit code, `started` told where
it runs (with its process group), one more process counted. Checked against the local
launcher (a real process, sandboxed with bwrap as root, as agents run) and the Ray
launcher over the scripted stand-in for Ray (the real cluster: test_ray_cluster.py)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable

import pytest
import trio

from swarmbase.launch.local import LocalLauncher
from swarmbase.launch.spec import LaunchSpec, Launcher, LocalPlacement, ProcessOpener

from .fakes.ray_stand_in import STARTED, FakeGen, make_launcher

LINES = [b'{"type":"system"}', b'{"type":"assistant"}', b'{"type":"result"}']
EMIT = 'for line in "$@"; do printf "%s\\n" "$line"; done'


def protocol_members(proto: type) -> list[str]:
    return [name for name in vars(proto) if not name.startswith("_")]


def local(tmp_path: Path) -> tuple[LocalLauncher, LaunchSpec, Callable[[], None]]:
    launcher = LocalLauncher(mode="bwrap", homes=tmp_path / "homes", procs=tmp_path / "procs")
    (tmp_path / "procs").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    spec = LaunchSpec(argv=("/bin/sh", "-c", EMIT, "sh", *(line.decode() for line in LINES)), env={"PATH": "/usr/bin"},
                      cwd=str(work), key="run_conf-1", read=(str(work),), network=False)
    return launcher, spec, lambda: None


def ray(tmp_path: Path) -> tuple[Any, LaunchSpec, Callable[[], None]]:
    gen = FakeGen()
    launcher, _ = make_launcher(tmp_path, gen)

    def script() -> None:
        for item in (STARTED, LINES[:2], LINES[2:], {"kind": "exit", "code": 0}, StopIteration):
            gen.q.put(item)
    spec = LaunchSpec(argv=("/usr/bin/claude", "-p"), env={}, cwd=str(tmp_path / "shared"), key="run_conf-1",
                      read=(str(tmp_path / "shared"),))
    return launcher, spec, script


@pytest.mark.parametrize("make", [local, ray], ids=["local", "ray"])
async def test_every_launcher_keeps_the_contract(tmp_path: Path, make: Callable[..., Any]) -> None:
    launcher, spec, script = make(tmp_path)
    for name in protocol_members(Launcher):
        assert hasattr(launcher, name), f"{type(launcher).__name__} lacks Launcher.{name}"
    assert launcher.initial_state in ("running", "waiting-node")
    assert isinstance(launcher.confined, bool) and launcher.spawned == 0
    # Only this machine's agents reach the daemon's loopback relays (the key door).
    assert launcher.on_daemon_host is (make is local)
    assert inspect.iscoroutinefunction(launcher.run)
    seen: list[bytes] = []
    where: list[dict[str, Any]] = []
    script()
    with trio.fail_after(120):
        res = await launcher.run(spec, lambda line: (seen.append(line), b"result" in line)[1], where.append)
    assert res.spawn_error is None and res.error is None, (res.spawn_error, res.error)
    assert seen == LINES and res.lines == 3 and res.final_seen and res.exit_code == 0
    assert len(where) == 1 and isinstance(where[0]["pgid"], int)
    assert launcher.spawned == 1


def test_the_local_launcher_also_opens_processes(tmp_path: Path) -> None:
    launcher, _, _ = local(tmp_path)
    for name in protocol_members(ProcessOpener) + protocol_members(LocalPlacement):
        assert hasattr(launcher, name), f"LocalLauncher lacks {name}"
    assert launcher.confined and launcher.procs == tmp_path / "procs"
