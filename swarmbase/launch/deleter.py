"""Deleting children's private dirs (their HOME, TMPDIR, CODEX_HOME under homesDir) after
they end, without the child's owner waiting for it.

A CLI agent's home holds hundreds of files: deleting it was a quarter of the daemon's own
CPU per agent, and the agent's end (its record, the script's answer) waited for it. While
`serve` runs, `discard` moves the dir aside under a name no later child can take (one
rename, so an agent started again with the same key gets a fresh dir) and returns; a few
workers delete what was moved aside in worker threads, each taking every path waiting at
once (a burst of ends is a few thread hops, not one per agent). A stop or a crash leaves
what was not deleted yet for the boot sweep (runs/boot.py deletes everything in homesDir).
Without `serve` (the sandbox self-check at start-up, a launcher used alone) `discard`
deletes in a worker thread and returns when the dir is gone.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
from pathlib import Path
from typing import Callable

import trio

log = logging.getLogger("swarmbase.launch")

# Two cores' worth: the deletes are disk-bound, and more threads would only contend.
WORKERS = 2
BATCH_MAX = 64

Remove = Callable[[Path], None]


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class Deleter:
    def __init__(self, remove: Remove = remove_tree, workers: int = WORKERS) -> None:
        self.remove = remove
        self.workers = workers
        self._send: trio.MemorySendChannel[Path] | None = None
        self.pending = 0          # moved aside and not deleted yet (tests wait on it)

    async def discard(self, path: Path) -> None:
        if self._send is None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self.remove, path)
            return
        aside = path.with_name(f".gone-{path.name}-{secrets.token_hex(4)}")
        try:
            os.rename(path, aside)
        except OSError:
            aside = path          # gone already, or not ours to move: deleted where it is
        self.pending += 1
        self._send.send_nowait(aside)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send, recv = trio.open_memory_channel[Path](math.inf)
        self._send = send
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.workers):
                    nursery.start_soon(self._work, recv)
                task_status.started()
        finally:
            self._send = None

    async def _work(self, recv: trio.MemoryReceiveChannel[Path]) -> None:
        async for first in recv:
            batch = [first]
            while len(batch) < BATCH_MAX:
                try:
                    batch.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
            # Not abandoned on cancel: a stop waits for the batch under way, not for the queue.
            await trio.to_thread.run_sync(self._remove_all, batch)
            self.pending -= len(batch)

    def _remove_all(self, paths: list[Path]) -> None:
        for p in paths:
            try:
                self.remove(p)
            except OSError as e:          # a remover that raises: the boot sweep has it
                log.warning("could not delete %s: %s", p, e)
