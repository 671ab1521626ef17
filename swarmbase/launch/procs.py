"""Child processes in their own process group, killed as a group however they end, and
the records that let a later boot reap groups a dead daemon left behind.

Why not trio.run_process's default: it signals only the direct child, and it cancels
deliver_cancel as soon as the leader exits, so a grandchild that ignores SIGTERM (or
holds stdout open) survives. Here the group always gets a final SIGKILL sweep, and
readers never rely on stdout EOF alone. Children start from the spawning thread
(spawn.py), so their parent-death signal follows the daemon's life.
"""

from __future__ import annotations

import os
import signal
from contextlib import asynccontextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, ContextManager, Mapping, Sequence

import trio

from .. import fsutil
from .spawn import Child, Limits, open_child

TERM_GRACE_S = 2.0


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@asynccontextmanager
async def group_process(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
                        stdin: int | None = None, stdout: int | None = -1, stderr: int | None = None,
                        grace: float = TERM_GRACE_S, limits: Limits = Limits(),
                        record: Path | None = None, record_extra: Mapping[str, Any] | None = None,
                        parent_death: bool = True, pass_fds: Sequence[int] = (),
                        around_fork: Callable[[], ContextManager[Any]] = nullcontext) -> AsyncIterator[Child]:
    """Start argv as the leader of a new session; on exit TERM the group, wait up to
    `grace`, then KILL the group, even if the leader already exited. With `record`, the
    group's pgid and start time are written there for the boot reaper while it lives."""
    proc = await open_child(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, limits=limits,
                            parent_death=parent_death, pass_fds=pass_fds, around_fork=around_fork)
    try:
        if record is not None:
            fsutil.write_json(record, {"pgid": proc.pid, "startTime": process_start_time(proc.pid),
                                       "argv0": os.path.basename(argv[0]), **(record_extra or {})}, durable=False)
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                kill_group(proc.pid, signal.SIGTERM)
                with trio.move_on_after(grace):
                    await proc.wait()
            kill_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            await proc.aclose_streams()
            if record is not None:
                await trio.to_thread.run_sync(partial(record.unlink, missing_ok=True))


def reap_recorded_groups(procs_dir: Path) -> tuple[list[int], list[Path]]:
    """Kill groups left by a daemon that died uncleanly. A record's pgid is killed only if
    that process still has the recorded start time (a reused pid never is). Returns the
    killed groups and the records that could not be read (the caller quarantines them)."""
    killed: list[int] = []
    unreadable: list[Path] = []
    if not procs_dir.is_dir():
        return killed, unreadable
    for rec in sorted(procs_dir.glob("*.json")):
        try:
            data = fsutil.read_json(rec)
        except (ValueError, OSError):
            unreadable.append(rec)
            continue
        if not isinstance(data, dict):
            unreadable.append(rec)
            continue
        pgid, start = data.get("pgid"), data.get("startTime")
        if isinstance(pgid, int) and pgid > 1 and start is not None and process_start_time(pgid) == start:
            kill_group(pgid)
            killed.append(pgid)
        rec.unlink(missing_ok=True)
    return killed, unreadable


class LineReader:
    """Split a byte stream into lines without trusting the peer's line length.
    A plain async iterator (not a generator), so breaking out of it leaves nothing to finalize."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_line: int = 16 * 1024 * 1024) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._at = 0             # where the next line starts: consumed lines are dropped in bulk
        self._max = max_line
        self._eof = False
        self.overflowed = False

    def __aiter__(self) -> "LineReader":
        return self

    def has_line(self) -> bool:
        """Whether the next line is already here (reading it will not wait)."""
        return self._buf.find(b"\n", self._at) >= 0

    async def __anext__(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n", self._at)
            if nl >= 0:
                line = bytes(self._buf[self._at:nl])
                self._at = nl + 1
                return line
            if self._at:
                # Deleting each line from the front moved the rest every time: a chunk of
                # 300 short lines was copied 300 times.
                del self._buf[:self._at]
                self._at = 0
            if self._eof:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line
                raise StopAsyncIteration
            if len(self._buf) > self._max:
                self.overflowed = True
                raise StopAsyncIteration
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                self._eof = True
            self._buf += chunk
