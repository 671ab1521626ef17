"""The local launcher: a process on this machine, inside the sandbox, in its own process
group, recorded for the boot reaper, read line by line under an idle watchdog.

Never waits on stdout EOF alone: once the CLI printed its final event (or the leader
exited) the group gets a short grace and then SIGKILL, so a grandchild holding stdout
open cannot keep the agent alive. Under the sandbox the group leader is bubblewrap; its
death takes the PID namespace, and every process in it, down.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import AsyncIterator, Sequence

import trio

from .. import fsutil
from ..procs import LineReader, group_process
from ..sandbox import Confinement, HostLayout, inside_path, wrap
from ..spawn import Child, on_spawner
from .netns import Namespace, relaying, thread_can_unshare
from .spec import LaunchSpec, OnLine, ProcResult, Started, placed

log = logging.getLogger("swarmbase.launch")

REAP_AFTER_FINAL_S = 1.0


class LocalLauncher:
    def __init__(self, *, mode: str, homes: Path, procs: Path, forbidden: Sequence[Path] = (),
                 layout: HostLayout | None = None, netns_kind: str | None = None) -> None:
        self.mode = mode
        # How agents' namespaces are made (launch/netns.py); None: "thread" if the spawning
        # thread may make one, else "helper" (found out at the first agent).
        self.netns_kind = netns_kind
        self.homes = homes
        self.procs = procs
        self.layout = layout or HostLayout.probe()
        # Paths no sandbox may show, not even as part of a parent dir asked for.
        self.forbidden = [os.path.realpath(p) for p in forbidden]
        self.spawned = 0

    @property
    def confined(self) -> bool:
        """Whether processes see only what they asked for (engines may skip deny-lists)."""
        return self.mode != "none"

    def _allowed(self, path: str) -> bool:
        real = os.path.realpath(path)
        return not any(f == real or f.startswith(real.rstrip("/") + "/") for f in self.forbidden)

    def confinement(self, spec: LaunchSpec, private: Path | None, hosts_fd: int | None = None) -> Confinement:
        read = [p for p in spec.read if self._allowed(p)]
        for p in spec.read:
            if p not in read:
                log.warning("not mounting %s for %s: it contains the daemon's state", p, spec.key)
        write = [p for p in spec.write if self._allowed(p)]
        if len(write) != len(spec.write):
            raise PermissionError(f"refusing to let {spec.key} write a directory holding the daemon's state")
        return Confinement(cwd=spec.cwd, read=tuple(read), write=tuple(write),
                           private=str(private) if private else None, network=spec.network, hosts_fd=hosts_fd)

    def _prepare(self, spec: LaunchSpec) -> Path | None:
        if not (spec.dirs or spec.files or spec.stdin_file):
            return None
        private = self.homes / spec.key
        private.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in spec.dirs:
            (private / d).mkdir(parents=True, exist_ok=True, mode=0o700)
        for rel, data in spec.files.items():
            target = private / rel
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fsutil.write_atomic(target, data, durable=False)
        return private

    @asynccontextmanager
    async def open(self, spec: LaunchSpec, *, stdin: int | None = None, stdout: int | None = subprocess.PIPE,
                   stderr: int | None = None, grace: float = 1.0) -> AsyncIterator[Child]:
        """The process with the pipes asked for, killed as a group on exit; its private
        dir is made before and deleted after (in a worker thread: a burst of agents made
        and removed hundreds of files on the event loop)."""
        private = await trio.to_thread.run_sync(self._prepare, spec) if (spec.dirs or spec.files or spec.stdin_file) else None
        ns = None
        try:
            if self.mode == "bwrap" and spec.network and spec.egress is not None:
                if self.netns_kind is None:
                    self.netns_kind = "thread" if await on_spawner(thread_can_unshare) else "helper"
                    log.info("agents' network namespaces are made %s", "by the daemon" if self.netns_kind == "thread"
                             else "by a helper process (the daemon may not make them)")
                ns = Namespace(spec.egress, self.netns_kind)
            conf = self.confinement(spec, private, ns.hosts_fd if ns else None)
            argv, env = placed(spec, inside_path(conf, self.mode, str(private)) if private else "")
            command = wrap(self.mode, self.layout, conf, argv)
            stdin_file = None
            if spec.stdin_file is not None and private is not None:
                stdin_file = open(private / spec.stdin_file, "rb")
                stdin = stdin_file.fileno()
            try:
                async with relaying(ns, spec.key) as relay, \
                        group_process(ns.argv(command) if ns else command, env=env, cwd=spec.cwd,
                                      stdin=stdin, stdout=stdout, stderr=stderr, grace=grace,
                                      limits=spec.limits, record=self.procs / f"{spec.key}.json",
                                      record_extra=spec.record,
                                      # bubblewrap's --die-with-parent sets the signal itself
                                      parent_death=self.mode == "none",
                                      pass_fds=ns.pass_fds if ns else (),
                                      around_fork=ns.around_fork if ns else nullcontext) as proc:
                    await relay.start()
                    self.spawned += 1
                    yield proc
            finally:
                if stdin_file is not None:
                    stdin_file.close()
        finally:
            if ns is not None:
                ns.close()
            if private is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(shutil.rmtree, private, True)

    async def run(self, spec: LaunchSpec, on_line: OnLine, started: Started | None = None) -> ProcResult:
        """Run until the final event, the leader's exit, or the idle watchdog. Cancelling
        the caller kills the group."""
        res = ProcResult()
        try:
            async with self.open(spec, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT) as proc:
                if started:
                    started({"pgid": proc.pid})
                await _pump(proc, on_line, spec.idle_timeout, res)
            res.exit_code = proc.returncode
        except OSError as e:
            res.spawn_error = f"{e.strerror or e}" + (f": {e.filename}" if getattr(e, "filename", None) else "")
        return res


async def _pump(proc: Child, on_line: OnLine, idle_timeout: float, res: ProcResult) -> None:
    last = [trio.current_time()]
    async with trio.open_nursery() as nursery:
        async def watchdog() -> None:
            while True:
                due = last[0] + idle_timeout
                if trio.current_time() >= due:
                    res.idle_timeout = True
                    nursery.cancel_scope.cancel()
                    return
                await trio.sleep(due - trio.current_time())

        async def leader_exit() -> None:
            await proc.wait()
            # The leader is gone; whatever is still writing is a stray.
            await trio.sleep(REAP_AFTER_FINAL_S)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watchdog)
        nursery.start_soon(leader_exit)
        assert proc.stdout is not None
        async for line in LineReader(proc.stdout):
            last[0] = trio.current_time()
            res.lines += 1
            if on_line(line):
                res.final_seen = True
                with trio.move_on_after(REAP_AFTER_FINAL_S):
                    await proc.wait()
                break
        nursery.cancel_scope.cancel()
