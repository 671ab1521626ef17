"""`python -m swarmbase` as a real process for tests, with its stderr drained all along
(a full pipe would block the daemon) and kept for assertions."""

from __future__ import annotations

import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import attrs
import trio

from .conftest import start_cli_daemon


@attrs.define
class CliDaemon:
    proc: trio.Process
    ws: str
    stderr: bytearray


@asynccontextmanager
async def cli_daemon(cfg_path: Path) -> AsyncIterator[CliDaemon]:
    startup: list[str] = []
    with trio.fail_after(60):
        proc, ws = await start_cli_daemon(cfg_path, startup=startup)
    d = CliDaemon(proc, ws, bytearray("".join(startup).encode()))     # from its first line on
    try:
        async with trio.open_nursery() as n:
            async def drain() -> None:
                while chunk := await proc.stderr.receive_some(65536):
                    d.stderr.extend(chunk)
            n.start_soon(drain)
            try:
                yield d
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(15):
                    await proc.wait()
                n.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
