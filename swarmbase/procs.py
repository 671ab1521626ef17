"""Child processes in their own process group, killed as a group however they end.

Why not trio.run_process's default: it signals only the direct child, and it cancels
deliver_cancel as soon as the leader exits, so a grandchild that ignores SIGTERM (or
holds stdout open) survives. Here the group always gets a final SIGKILL sweep, and
readers never rely on stdout EOF alone.
"""

from __future__ import annotations

import os
import signal
from contextlib import asynccontextmanager
from typing import AsyncIterator, Mapping, Sequence

import trio

TERM_GRACE_S = 2.0


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@asynccontextmanager
async def group_process(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
                        stdin: int | None = None, stderr: int | None = None,
                        grace: float = TERM_GRACE_S) -> AsyncIterator[trio.Process]:
    """Start argv as the leader of a new session; on exit TERM the group, wait up to
    `grace`, then KILL the group, even if the leader already exited."""
    proc = await trio.lowlevel.open_process(
        list(argv), stdin=stdin, stdout=-1, stderr=stderr, env=dict(env), cwd=cwd,
        start_new_session=True)
    try:
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                kill_group(proc.pid, signal.SIGTERM)
                with trio.move_on_after(grace):
                    await proc.wait()
            kill_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()


class LineReader:
    """Split a byte stream into lines without trusting the peer's line length.
    A plain async iterator (not a generator), so breaking out of it leaves nothing to finalize."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_line: int = 16 * 1024 * 1024) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._max = max_line
        self._eof = False
        self.overflowed = False

    def __aiter__(self) -> "LineReader":
        return self

    async def __anext__(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                return line
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
