"""Warm spare script runners: a runner started ahead of need (sandboxed, no network, its
limits set), waiting for its script, so a run does not pay Node's start-up.

Rules, each guarding isolation or a limit:
- Single use. `take()` hands a spare out once and forgets it; it runs exactly one script
  and is killed with its group when that script ends, like a runner started cold. A
  replacement starts at once. A spare never sees two scripts, never outlives its run, and
  is never shared by two runs or two callers.
- Nothing run- or caller-specific exists in a spare before it is taken: it is the very
  LaunchSpec a cold start would use (argv, env, read paths, RLIMIT_DATA/CPU, no network),
  only its key differs; the script, args and budget are sent after `take()`.
- A spare that dies while waiting is replaced, after a growing pause if they keep dying
  (a broken node must not become a fork loop). One found dead at `take()` is not handed out.
- With no spare ready (a burst of runs, start-up) a run starts its runner cold.

Each spare lives in a keeper task of the pool's nursery, inside `launcher.open` (the
process record for the boot reaper, the group kill). The run that takes it borrows the
process; when the run lets go, the keeper leaves `open`, which kills and reaps the group,
and the run waits for that before it goes on — the same order as a cold runner.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, Mapping

import trio

from .. import fsutil
from ..jsonvalue import Json
from ..launch.spawn import Child
from ..launch.spec import LaunchSpec, ProcessOpener

log = logging.getLogger("swarmbase.spares")

GRACE_S = 0.5                 # the same TERM grace as a cold runner
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 60.0


def alive(proc: Child) -> bool:
    """Whether the process has not exited (without reaping it: its keeper does that)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


class Spare:
    def __init__(self, proc: Child, key: str) -> None:
        self.proc = proc
        self.key = key
        self.taken = False
        self.used = False
        self.waiting = trio.CancelScope()     # cancelled by take(): the keeper stops watching for a death
        self.released = trio.Event()          # the run is done with it: kill it
        self.closed = trio.Event()            # its group is dead and reaped

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Child]:
        """The process, for one script. On exit the keeper kills the group; this waits for it."""
        if self.used or not self.taken:
            raise RuntimeError("a spare runner is used once, after take()")
        self.used = True
        try:
            yield self.proc
        finally:
            self.released.set()
            with trio.CancelScope(shield=True):
                await self.closed.wait()


class SpareRunners:
    """A pool of `size` ready runners, kept full while `serve()` runs."""

    def __init__(self, launcher: ProcessOpener, spec: Callable[[str], LaunchSpec], size: int = 1) -> None:
        self.launcher = launcher
        self.spec = spec                      # key -> the runner's LaunchSpec
        self.size = size
        self.ready: list[Spare] = []
        self.started = 0                      # spares started since boot
        self.handed_out = 0
        self.died = 0                         # spares that died while waiting

    def take(self, record: Mapping[str, Json] | None = None) -> Spare | None:
        """A ready spare, now owned by the caller alone; None if none is ready. `record`:
        fields (the run id) added to its process record, which until now said `spare`."""
        while self.ready:
            spare = self.ready.pop(0)
            spare.taken = True
            spare.waiting.cancel()
            if alive(spare.proc):
                self.handed_out += 1
                self._note_taken(spare, record or {})
                return spare
            spare.released.set()              # dead already: its keeper reaps it and starts another
        return None

    def _note_taken(self, spare: Spare, record: Mapping[str, Json]) -> None:
        path = self.launcher.procs / f"{spare.key}.json"
        try:
            data = fsutil.read_json(path) or {}
            fsutil.write_json(path, {**data, **record, "spare": "taken"}, durable=False)
        except (OSError, ValueError) as e:      # the record is for the boot reaper's pgid; that stays
            log.warning("could not note the run in %s: %s", path.name, e)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.size):
                nursery.start_soon(self._keep)
            task_status.started()

    async def _keep(self) -> None:
        pause = RETRY_FIRST_S
        while True:
            try:
                handed_out = await self._one()
            except OSError as e:             # node or bwrap could not start: as if it died
                log.warning("a spare script runner could not start: %s", e)
                handed_out = False
            if handed_out:
                pause = RETRY_FIRST_S
                continue
            self.died += 1
            await trio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_S)

    async def _one(self) -> bool:
        """Start one spare and keep it until its run lets go of it (True) or it dies
        waiting (False)."""
        key = f"spare-{secrets.token_hex(8)}"
        spare: Spare | None = None
        try:
            async with self.launcher.open(self.spec(key), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, grace=GRACE_S) as proc:
                spare = Spare(proc, key)
                self.started += 1
                self.ready.append(spare)
                with spare.waiting:
                    await proc.wait()
                if spare in self.ready:
                    self.ready.remove(spare)
                if not spare.taken:
                    log.warning("a spare script runner exited while waiting (code %s); starting another",
                                proc.returncode)
                    return False
                # Taken: its run owns it now. Shielded so a shutdown never kills a runner
                # under a live run; every run lets go of its runner when it ends.
                with trio.CancelScope(shield=True):
                    await spare.released.wait()
                return spare.used
        finally:
            if spare is not None:
                if spare in self.ready:
                    self.ready.remove(spare)
                spare.closed.set()
