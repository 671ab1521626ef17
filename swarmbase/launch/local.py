"""The local launcher: a process on this machine, inside the sandbox, in its own process
group, recorded for the boot reaper, read line by line under an idle watchdog.

Right before each start (after every wait an agent had) its paths are pinned as open
directories and checked where they really are (pins.py), and those fds are what the
sandbox binds; a daemon running as root runs the child as its caller's uid (the spec's
`owner`), and the dirs it makes for the child (the private dir, and what `adopt` is
given) become that uid's (identity.py).

Never waits on stdout EOF alone: once the CLI printed its final event (or the leader
exited) the group gets a short grace and then SIGKILL, so a grandchild holding stdout
open cannot keep the agent alive. Under the sandbox the group leader is bubblewrap; its
death takes the PID namespace, and every process in it, down.
"""

from __future__ import annotations

import logging
import os
import subprocess
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import AsyncIterator, Sequence

import attrs
import trio

from .. import fsutil, identity, seccomp
from .deleter import Deleter
from .procs import LineReader, group_process
from .sandbox import Confinement, HostLayout, inside_path, wrap
from .spawn import Child, on_spawner
from .netns import Namespace, relaying, thread_can_unshare
from .pins import Pinned, pin
from .spec import LauncherBase, LaunchSpec, OnLine, ProcResult, Started, placed

log = logging.getLogger("swarmbase.launch")

REAP_AFTER_FINAL_S = 1.0


class SandboxUnavailable(Exception):
    """The host cannot run children in the sandbox; the message says why and what to do."""


class LocalLauncher(LauncherBase):
    on_daemon_host = True
    def __init__(self, *, mode: str, homes: Path, procs: Path, forbidden: Sequence[Path] = (),
                 layout: HostLayout | None = None, sandbox_user: str | None = None,
                 identities: identity.Identities | None = None, netns_kind: str | None = None,
                 deleter: Deleter | None = None) -> None:
        self.mode = mode
        # Deletes children's private dirs after them; the daemon serves it so that no child's
        # end waits for its dir's files to go.
        self.deleter = deleter or Deleter()
        # How agents' namespaces are made (launch/netns.py); None: "thread" if the spawning
        # thread may make one, else "helper" (found out at the first agent).
        self.netns_kind = netns_kind
        self.homes = homes
        self.procs = procs
        self.layout = layout or HostLayout.probe()
        # Paths no sandbox may show, not even as part of a parent dir asked for.
        self.forbidden = [os.path.realpath(p) for p in forbidden]
        self.spawned = 0
        # Who children run as when the daemon is root: each caller's own uid, or the one
        # shared `sandboxUser` where that older setting is used; neither: the daemon's user.
        # A root launcher never runs a child as root for want of a setting: without one
        # given, the allocation lives beside its process records (the state dir's).
        self.shared = identity.resolve(sandbox_user)
        self.identities = None
        if self.shared is None and os.geteuid() == 0:
            self.identities = identities or identity.Identities(procs.parent / identity.ALLOCATIONS,
                                                                identity.UidRange.parse(identity.DEFAULT_UIDS))

    def user_for(self, owner: str | None) -> identity.SandboxUser | None:
        if self.shared is not None or self.identities is None:
            return self.shared
        return self.identities.user_for(owner) if owner is not None else self.identities.runner()

    def adopt(self, path: str | os.PathLike[str], owner: str | None) -> None:
        """Make a dir the daemon made for `owner`'s children (a run's work/, a worktree's
        checkout) theirs: owned by that caller's uid when the daemon is root."""
        identity.adopt(self.user_for(owner), path)

    def describe_users(self) -> str:
        """Who children run as, for the start-up log line."""
        if self.shared is not None:
            return f"{self.shared.describe()}, shared by every caller (sandboxUser)"
        if self.identities is not None:
            return f"a uid of each caller's own from {self.identities.range.describe()} ({self.identities.path})"
        return "the daemon's user, shared by every caller"

    async def self_check(self) -> None:
        """Start one trivial child in the sandbox; SandboxUnavailable naming the cause if the host
        cannot (no user namespaces, bwrap refused, no libseccomp), so the daemon never runs
        agents with privilege silently."""
        if self.mode == "none":
            return
        if self.identities is not None:
            try:
                self.identities.check()
            except identity.IdentityError as e:
                raise SandboxUnavailable(str(e)) from None
        limit = identity.userns_limit()
        user = self.user_for(None)
        who = user.describe() if user is not None else "the daemon's user"
        if limit == 0:
            raise SandboxUnavailable("the sandbox needs user namespaces, and /proc/sys/user/max_user_namespaces "
                                     "is 0 on this host: allow them, or set \"sandbox\": \"none\" (agents then "
                                     "run unconfined)")
        try:
            seccomp.program("strict")
        except seccomp.SeccompUnavailable as e:
            raise SandboxUnavailable(f"the sandbox's seccomp filter cannot be built: {e}") from None
        lines: list[bytes] = []

        def on_line(line: bytes) -> bool:
            lines.append(line)
            return False
        spec = LaunchSpec(argv=("/usr/bin/env", "true"), env={"PATH": "/usr/bin:/bin"}, cwd="/usr",
                          key="self-check", dirs=(), idle_timeout=60.0)
        res = await self.run(spec, on_line)
        if res.spawn_error or res.exit_code != 0:
            said = b" ".join(lines).decode(errors="replace")[:500] or res.spawn_error or f"exit {res.exit_code}"
            raise SandboxUnavailable(f"the sandbox cannot start a child as {who}: {said} "
                                     f"(/proc/sys/user/max_user_namespaces: {limit}). Unprivileged user "
                                     "namespaces must be allowed (on Ubuntu 24.04+ also for bwrap under AppArmor), "
                                     "or set \"sandbox\": \"none\" (agents then run unconfined)")

    @property
    def confined(self) -> bool:
        """Whether processes see only what they asked for (engines may skip deny-lists)."""
        return self.mode != "none"

    def _pin(self, spec: LaunchSpec, private: Path | None) -> Pinned:
        return pin(key=spec.key, cwd=spec.cwd, read=spec.read, write=spec.write,
                   private=str(private) if private is not None else None, forbidden=self.forbidden,
                   state_dirs=spec.state_dirs, cwd_roots=spec.cwd_roots, caller_paths=spec.caller_paths)

    def confinement(self, spec: LaunchSpec, private: Path | None, pinned: Pinned) -> Confinement:
        """What the child may see; with the sandbox, bound by the pinned fds, with its
        seccomp filter and overlay files in fresh fds (closed by the caller)."""
        conf = Confinement(cwd=spec.cwd, read=tuple(pinned.read), write=tuple(pinned.write),
                           private=str(private) if private else None, network=spec.network)
        if self.mode == "none":
            return conf
        data = tuple((_memfd(body), path) for path, body in spec.overlays.items())
        return attrs.evolve(conf, fds=dict(pinned.fds), data=data, nesting=spec.nesting, user=self.user_for(spec.owner),
                            seccomp_fd=seccomp.program_fd("nesting" if spec.nesting else "strict"))

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
        identity.adopt_tree(self.user_for(spec.owner), private)
        return private

    @asynccontextmanager
    async def open(self, spec: LaunchSpec, *, stdin: int | None = None, stdout: int | None = subprocess.PIPE,
                   stderr: int | None = None, grace: float = 1.0) -> AsyncIterator[Child]:
        """The process with the pipes asked for, killed as a group on exit; its private
        dir is made before (in a worker thread: a burst of agents made hundreds of files on
        the event loop) and handed to the deleter after. Its paths are pinned here, after
        every wait the caller had."""
        private = await trio.to_thread.run_sync(self._prepare, spec) if (spec.dirs or spec.files or spec.stdin_file) else None
        to_close: set[int] = set()
        ns = None
        try:
            pinned = self._pin(spec, private)
            to_close.update(pinned.fds.values())
            conf = self.confinement(spec, private, pinned)
            to_close.update(conf.passed_fds())
            if self.mode == "bwrap" and spec.network and spec.egress is not None:
                if self.netns_kind is None:
                    self.netns_kind = "thread" if await on_spawner(thread_can_unshare) else "helper"
                    log.info("agents' network namespaces are made %s", "by the daemon" if self.netns_kind == "thread"
                             else "by a helper process (the daemon may not make them)")
                ns = Namespace(spec.egress, self.netns_kind)
                # The namespace owns (and closes) its /etc/hosts fd: not in to_close.
                conf = attrs.evolve(conf, hosts_fd=ns.hosts_fd)
            argv, env = placed(spec, inside_path(conf, self.mode, str(private)) if private else "")
            command = wrap(self.mode, self.layout, conf, argv)
            stdin_file = None
            if spec.stdin_file is not None and private is not None:
                stdin_file = await trio.to_thread.run_sync(open, private / spec.stdin_file, "rb")
                stdin = stdin_file.fileno()
            try:
                # Under the sandbox bwrap's --chdir places the child; bwrap itself starts in /.
                async with relaying(ns, spec.key) as relay, \
                        group_process(ns.argv(command) if ns else command, env=env,
                                      cwd=spec.cwd if self.mode == "none" else "/",
                                      stdin=stdin, stdout=stdout, stderr=stderr, grace=grace,
                                      limits=spec.limits, record=self.procs / f"{spec.key}.json",
                                      record_extra=spec.record,
                                      pass_fds=tuple(dict.fromkeys((*conf.passed_fds(), *(ns.pass_fds if ns else ())))),
                                      around_fork=ns.around_fork if ns else nullcontext,
                                      # bubblewrap's --die-with-parent sets the signal itself
                                      parent_death=self.mode == "none") as proc:
                    await relay.start()
                    self.spawned += 1
                    _close_all(to_close)      # the child has its copies
                    yield proc
            finally:
                if stdin_file is not None:
                    stdin_file.close()
        finally:
            _close_all(to_close)
            if ns is not None:
                ns.close()
            if private is not None:
                await self.deleter.discard(private)

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
            res.spawn_error = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
        return res


def _memfd(body: bytes) -> int:
    fd = os.memfd_create("swarmbase-overlay", os.MFD_CLOEXEC)
    os.write(fd, body)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_all(fds: set[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


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
