"""`python -m swarmbase.client ... --wait` as a real process: live progress, one line per
change into a pipe, one line rewritten in place on a pseudo-terminal, and a quiet exit when
its reader goes away (`| head -1`)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import trio

from swarmbase.client_progress import progress_line

from .conftest import Env, fake_daemon, pty_env
from .sockets import free_port

SCRIPT = """phase('first');
await agent('waitfile:{g1}');
phase('second');
await parallel([() => agent('waitfile:{g2}'), () => agent('waitfile:{g2}')]);
return 'all done';"""


async def gated(tmp_path: Path, nursery: trio.Nursery) -> tuple[Env, list[str], list[Path]]:
    env = await fake_daemon(tmp_path, nursery, port=free_port())
    gates = [tmp_path / "g1", tmp_path / "g2"]
    for g in gates:
        g.write_text("")
    script = SCRIPT.format(g1=gates[0], g2=gates[1])
    argv = [sys.executable, "-m", "swarmbase.client", "alice", "run",
            json.dumps({"script": script, "label": "progress"}), "--wait"]
    return env, argv, gates


def client_env(env: Env) -> dict[str, str]:
    return dict(os.environ, SWARMBASE_CONFIG=str(env.state / "config.json"))


def test_progress_line_reads_what_status_has() -> None:
    st = {"runId": "run_1", "status": "running", "agents": {"done": 1, "total": 3, "running": 2},
          "spentUsd": 0.4213, "spentEstimated": True, "reservedUsd": 0.5, "budgetUsd": 5,
          "phases": [{"title": "a"}, {"title": "review"}]}
    assert progress_line(st) == ("run_1 running · agents 1/3 done (2 running) · $0.4213 (est.) + $0.5000 reserved "
                                 "of $5.0000 · phase: review")
    assert progress_line({"runId": "run_2", "status": "queued", "budgetUsd": 1}) == (
        "run_2 queued · agents 0/0 done · $0.0000 of $1.0000")


@pytest.mark.timeout(90)
async def test_wait_into_a_pipe_prints_one_line_per_change(tmp_path: Path, nursery: trio.Nursery) -> None:
    env, argv, gates = await gated(tmp_path, nursery)
    proc = await trio.lowlevel.open_process(argv, env=client_env(env), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE)
    text = ""
    try:
        with trio.fail_after(60):
            async def until(marker: str) -> None:
                nonlocal text
                while marker not in text:
                    chunk = await proc.stdout.receive_some(65536)
                    assert chunk, text
                    text += chunk.decode()
            await until("phase: first")
            await trio.sleep(2.5)                 # polls that see no change print nothing
            gates[0].unlink()
            await until("phase: second")
            gates[1].unlink()
            await until(":end")
            while chunk := await proc.stdout.receive_some(65536):
                text += chunk.decode()
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
    assert b"Traceback" not in await proc.stderr.receive_some(65536)
    progress = [ln for ln in text.splitlines() if ln.startswith("run_")]
    assert all(a != b for a, b in zip(progress, progress[1:])), progress     # only changes
    assert "\r" not in text and "\x1b" not in text
    assert any("agents 0/1 done" in ln and "phase: first" in ln for ln in progress), progress
    assert any("phase: second" in ln for ln in progress), progress
    assert "completed · agents 3/3 done" in progress[-1] and "$0.0300 of $5.0000" in progress[-1]
    assert '"swarmbase:completed"' in text


@pytest.mark.timeout(90)
async def test_wait_on_a_terminal_rewrites_one_line(tmp_path: Path, nursery: trio.Nursery) -> None:
    env, argv, gates = await gated(tmp_path, nursery)
    master, slave = pty.openpty()
    # A wide terminal: the line is cut to the terminal's width, and the phase comes last.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    os.set_blocking(master, False)
    proc = await trio.lowlevel.open_process(argv, env=pty_env(SWARMBASE_CONFIG=str(env.state / "config.json")),
                                            stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    raw = b""
    try:
        with trio.fail_after(60):
            async def until(marker: bytes) -> None:
                nonlocal raw
                while marker not in raw:
                    await trio.lowlevel.wait_readable(master)
                    try:
                        raw += os.read(master, 65536)
                    except OSError as e:          # EIO: the terminal's last writer is gone
                        assert e.errno == errno.EIO, e
                        return
            await until(b"phase: first")
            gates[0].unlink()
            await until(b"phase: second")
            gates[1].unlink()
            await until(b"agents 3/3 done")
            assert await proc.wait() == 0
            await until(b"\x00never")             # read what is left, to EIO
    finally:
        if proc.returncode is None:
            proc.kill()
        os.close(master)
    text = raw.decode()
    frames = text.split("\r\x1b[K")
    shown = [f for f in frames if f.startswith("run_")]
    assert len(shown) >= 3
    # Progress frames follow each other in place: no newline between two of them.
    first = next(i for i, f in enumerate(frames) if "phase: first" in f)
    second = next(i for i, f in enumerate(frames) if "phase: second" in f)
    assert all("\n" not in frames[i] for i in range(first, second)), frames[first:second + 1]
    assert '"swarmbase:completed"' in text            # the notice is printed whole, above the line
    assert text.rstrip("\r\n").endswith(shown[-1].rstrip("\r\n")) and "completed" in shown[-1]
    assert text.endswith("\n")


@pytest.mark.timeout(90)
async def test_wait_piped_into_head_exits_quietly(tmp_path: Path, nursery: trio.Nursery) -> None:
    env, argv, gates = await gated(tmp_path, nursery)
    cmd = " ".join(f"'{a}'" if not a.startswith("{") else "'" + a.replace("'", "'\\''") + "'" for a in argv)
    shell = f"{cmd} | head -1; exit ${{PIPESTATUS[0]}}"
    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            async def release() -> None:
                await trio.sleep(3)               # head has long gone; the next writes hit a closed pipe
                gates[0].unlink()
            n.start_soon(release)
            out = await trio.run_process(["bash", "-c", shell], env=client_env(env), capture_stdout=True,
                                         capture_stderr=True, check=False)
    assert out.stdout == b"{\n"
    assert out.stderr == b"", out.stderr.decode()
    assert out.returncode == 141
    gates[1].unlink()


@pytest.mark.timeout(90)
async def test_a_client_the_daemon_closes_prints_the_daemons_reason(tmp_path: Path, nursery: trio.Nursery) -> None:
    # Issue 32.5: the client waiting on a run is the caller's oldest session when eight more
    # connect; it is closed with 4000, and says why in the daemon's words (it printed
    # "close code 4000, private reserved").
    from contextlib import AsyncExitStack

    from swarmbase.client import connect
    from swarmbase.mcpl.session import MAX_SESSIONS_PER_CALLER
    env, argv, gates = await gated(tmp_path, nursery)
    proc = await trio.lowlevel.open_process(argv, env=client_env(env), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE)
    try:
        with trio.fail_after(60):
            out = b""
            while b"phase: first" not in out:          # connected, its run going
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, out.decode()
                out += chunk
            waited = json.loads(out[:out.index(b"}") + 1])["runId"]
            async with AsyncExitStack() as stack:
                for _ in range(MAX_SESSIONS_PER_CALLER):
                    h = await stack.enter_async_context(connect(env.ws, env.tokens["alice"]))
                    await h.handshake()
                err = b""
                while chunk := await proc.stderr.receive_some(65536):
                    err += chunk
                assert await proc.wait() == 1
    finally:
        if proc.returncode is None:
            proc.kill()
    assert err.decode().strip().splitlines() == [
        f"swarmbase.client: lost the connection to the daemon (close code 4000: replaced: caller alice has more "
        f"than 8 sessions open; the oldest is closed) while waiting for {waited}; its end notice stays queued "
        f"for this caller"], err.decode()
    for g in gates:
        g.unlink()
