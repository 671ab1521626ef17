"""spawn.py without Python in the child: the parent-death signal and the resource limits
set by exec wrappers (setpriv, prlimit) reach the real process, and a child still dies
with the thread-owning process that started it."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from swarmbase.launch import spawn
from swarmbase.launch.spawn import Limits, exec_wrapped, open_child


def test_wrappers_replace_the_preexec_function() -> None:
    limits = Limits(data_bytes=64 << 20, cpu_seconds=7).rlimits()
    argv, setup = exec_wrapped(["node", "x.mjs"], limits, parent_death=True)
    assert setup is None
    assert argv == [spawn.SETPRIV, "--pdeathsig", "KILL", "--", spawn.PRLIMIT,
                    f"--data={64 << 20}:{64 << 20}", "--cpu=7:12", "--", "node", "x.mjs"]
    # bubblewrap sets the signal itself (--die-with-parent); no limits: nothing around argv.
    assert exec_wrapped(["bwrap", "--die-with-parent", "--", "claude"], [], parent_death=False) == (
        ["bwrap", "--die-with-parent", "--", "claude"], None)


def test_without_the_wrappers_the_preexec_path_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn, "SETPRIV", None)
    argv, setup = exec_wrapped(["node"], [], parent_death=True)
    assert argv == ["node"] and callable(setup)
    monkeypatch.setattr(spawn, "SETPRIV", "/usr/bin/setpriv")
    monkeypatch.setattr(spawn, "PRLIMIT", None)
    argv, setup = exec_wrapped(["node"], Limits(cpu_seconds=3).rlimits(), parent_death=False)
    assert argv == ["node"] and callable(setup)


async def test_the_limits_bind_the_started_process() -> None:
    child = await open_child([sys.executable, "-c", "import resource as r; print(r.getrlimit(r.RLIMIT_DATA), "
                              "r.getrlimit(r.RLIMIT_CPU))"], env=dict(os.environ), stdout=subprocess.PIPE,
                             limits=Limits(data_bytes=256 << 20, cpu_seconds=30))
    out = b""
    assert child.stdout is not None
    with trio.fail_after(20):
        while chunk := await child.stdout.receive_some(4096):
            out += chunk
        assert await child.wait() == 0
    await child.aclose_streams()
    assert out.decode().strip() == f"({256 << 20}, {256 << 20}) (30, 35)"
    # The limits are the child's only: this process keeps its own.
    assert resource.getrlimit(resource.RLIMIT_CPU)[0] != 30


def test_a_child_dies_with_the_process_that_started_it() -> None:
    """A middle process starts a sleeper through open_child and is SIGKILLed: the sleeper
    (which has no other reason to die) gets the parent-death signal."""
    code = textwrap.dedent("""
        import os, sys, trio
        from swarmbase.launch.spawn import open_child
        async def main():
            c = await open_child(["sleep", "300"], env=dict(os.environ))
            print(c.pid, flush=True)
            await trio.sleep_forever()
        trio.run(main)
    """)
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert middle.stdout is not None
        sleeper = int(middle.stdout.readline())
        for _ in range(500):        # through the wrappers' execs to the program itself
            if Path(f"/proc/{sleeper}/cmdline").read_bytes().startswith(b"sleep\0"):
                break
            trio.run(trio.sleep, 0.01)
        else:
            raise AssertionError("the child never became `sleep`")
        middle.send_signal(signal.SIGKILL)
        middle.wait(timeout=10)
        for _ in range(200):
            try:
                state = Path(f"/proc/{sleeper}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                break
            if state in ("Z", "X"):
                break
            trio.run(trio.sleep, 0.02)
        else:
            os.kill(sleeper, signal.SIGKILL)
            raise AssertionError("the child outlived the process that started it")
    finally:
        middle.kill()
        middle.wait(timeout=10)
        if middle.stdout is not None:
            middle.stdout.close()
