"""One daemon per state dir: an exclusive lock taken before anything reads runs or reaps
processes. A second start on the same state dir touches nothing and says who holds it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class LockHeld(Exception):
    pass


class StateLock:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / "swarmbase.lock"
        self._fd: int | None = None

    def acquire(self) -> "StateLock":
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            finally:
                os.close(fd)
            raise LockHeld(f"another swarmbase (pid {holder}) is running on {self.state_dir}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)        # closing drops the flock
            self._fd = None
