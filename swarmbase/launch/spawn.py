"""Every child process of the daemon is forked from one thread that lives as long as the
daemon, and dies with it.

Design log:
- A parent-death signal (PR_SET_PDEATHSIG, and bubblewrap's --die-with-parent, which is the
  same thing) fires when the *thread* that forked the child exits, not the process. Trio's
  `open_process` forks from a worker of its thread cache, and idle workers exit after 10 s:
  every bubblewrapped codex agent was SIGKILLed ~10 s after it started. So nothing here
  uses trio's thread cache: one daemon thread, started on first use, runs every Popen.
- The child sets its own parent-death signal (SIGKILL) before exec, then checks that its
  parent is still the daemon (it may have died between fork and prctl).
- Resource limits (memory, CPU) are set in the child before exec, so they bind the sandbox
  and everything it forks.
- Both without Python code in the child (perf v2): a `preexec_fn` makes CPython fork()
  instead of vfork() and run the interpreter in the child; measured, that cost the daemon
  4–7 ms of CPU per spawn with the GIL held and 10–80 ms of wall time on the one spawning
  thread, which made it the bottleneck of a burst of agents. Now small exec wrappers from
  util-linux set them (`setpriv --pdeathsig KILL`, `prlimit --data --cpu`), and a child that
  is bubblewrap needs no `setpriv` at all: `--die-with-parent` is the same prctl, done by
  bwrap itself. What remains is the exec of a small binary before its prctl (instead of a
  prctl before exec): a daemon killed inside that window of well under a millisecond
  leaves that one child behind. Without the util-linux tools the preexec_fn path is kept.
- The handle is ours, not trio.Process (whose constructor is private): pipes are trio
  FdStreams, exit is awaited on a pidfd.
"""

from __future__ import annotations

import ctypes
import os
import queue
import resource
import shutil
import signal
import subprocess
import threading
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Mapping, Sequence

import attrs
import outcome
import trio

PR_SET_PDEATHSIG = 1
PIPE = subprocess.PIPE

_libc = ctypes.CDLL(None, use_errno=True)


class _Spawner:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[outcome.Outcome], None]]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="swarmbase-spawner", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            fn, done = self.jobs.get()
            done(outcome.capture(fn))


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawner_thread() -> threading.Thread:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        return _spawner.thread


async def on_spawner(fn: Callable[[], Any]) -> Any:
    """Run fn on the spawning thread and return its result (exceptions re-raised here).
    Not cancellable while it runs: a fork takes milliseconds."""
    spawner_thread()
    assert _spawner is not None
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def done(result: outcome.Outcome) -> None:
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)
        except trio.RunFinishedError:
            pass

    _spawner.jobs.put((fn, done))
    return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)


SETPRIV = shutil.which("setpriv")
PRLIMIT = shutil.which("prlimit")
_PRLIMIT_FLAG = {resource.RLIMIT_DATA: "--data", resource.RLIMIT_CPU: "--cpu"}


def exec_wrapped(argv: Sequence[str], rlimits: Sequence[tuple[int, int, int]], parent_death: bool
                 ) -> tuple[list[str], Callable[[], None] | None]:
    """argv behind the exec wrappers that set the parent-death signal and the limits, or
    (when a wrapper is missing) argv and the preexec_fn that does it in Python."""
    prefix: list[str] = []
    if parent_death:
        if SETPRIV is None:
            return list(argv), _child_setup(os.getpid(), rlimits, parent_death)
        prefix += [SETPRIV, "--pdeathsig", "KILL", "--"]
    if rlimits:
        if PRLIMIT is None or any(which not in _PRLIMIT_FLAG for which, _, _ in rlimits):
            return list(argv), _child_setup(os.getpid(), rlimits, parent_death)
        prefix += [PRLIMIT, *(f"{_PRLIMIT_FLAG[which]}={soft}:{hard}" for which, soft, hard in rlimits), "--"]
    return prefix + list(argv), None


def _child_setup(parent: int, rlimits: Sequence[tuple[int, int, int]],
                 parent_death: bool = True) -> Callable[[], None]:
    def setup() -> None:
        if parent_death:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(70)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))
    return setup


class Child:
    """A started child: pid, trio streams for the pipes asked for, and its exit."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream | None,
                 stdout: trio.lowlevel.FdStream | None, stderr: trio.lowlevel.FdStream | None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._pidfd: int | None = os.pidfd_open(popen.pid)
        self._wait_lock = trio.Lock()

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    async def wait(self) -> int:
        async with self._wait_lock:
            while self._popen.poll() is None:
                assert self._pidfd is not None
                await trio.lowlevel.wait_readable(self._pidfd)
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self._popen.returncode

    async def aclose_streams(self) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                await stream.aclose()


@attrs.frozen
class Limits:
    """Resource limits set in the child before exec (None: inherit)."""
    data_bytes: int | None = None
    cpu_seconds: int | None = None

    def rlimits(self) -> list[tuple[int, int, int]]:
        """(resource, soft, hard). The CPU hard limit sits a little above the soft one, so
        the process gets SIGXCPU (which says why it died) before the kernel's SIGKILL."""
        out = []
        if self.data_bytes is not None:
            out.append((resource.RLIMIT_DATA, self.data_bytes, self.data_bytes))
        if self.cpu_seconds is not None:
            out.append((resource.RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 5))
        return out


async def open_child(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
                     stdin: int | None = None, stdout: int | None = None, stderr: int | None = None,
                     limits: Limits = Limits(), parent_death: bool = True, pass_fds: Sequence[int] = (),
                     around_fork: Callable[[], ContextManager[Any]] = nullcontext) -> Child:
    """Start argv in a new session (its pid is its pgid), from the spawning thread, with a
    parent-death signal and `limits`. `stdin`/`stdout`/`stderr`: PIPE, an fd, None
    (inherit), or subprocess.STDOUT for stderr. parent_death=False: the command sets the
    signal itself (bubblewrap's --die-with-parent). `pass_fds` stay open in the child at
    their numbers (the sandbox's pinned dirs, data files and seccomp filter; every other fd
    is closed). `around_fork()` is entered on the spawning
    thread around the fork (a namespace the child must be born in, launch/netns.py)."""
    fds: dict[str, int] = {}
    ours: dict[str, int] = {}
    theirs: list[int] = []
    try:
        for name, want, parent_reads in (("stdin", stdin, False), ("stdout", stdout, True), ("stderr", stderr, True)):
            if want == PIPE:
                r, w = os.pipe()
                ours[name], fds[name] = (r, w) if parent_reads else (w, r)
                theirs.append(fds[name])
            elif want == subprocess.STDOUT:
                fds[name] = fds.get("stdout", subprocess.STDOUT)
            elif want is not None:
                fds[name] = want
        command, setup = exec_wrapped(argv, limits.rlimits(), parent_death)
        def fork() -> subprocess.Popen[bytes]:
            with around_fork():
                return subprocess.Popen(
                    command, stdin=fds.get("stdin"), stdout=fds.get("stdout"), stderr=fds.get("stderr"),
                    env=dict(env), cwd=cwd, start_new_session=True, preexec_fn=setup, close_fds=True,
                    pass_fds=tuple(pass_fds))
        popen = await on_spawner(fork)
    except BaseException:
        for fd in ours.values():
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    streams = {k: trio.lowlevel.FdStream(fd) for k, fd in ours.items()}
    return Child(popen, streams.get("stdin"), streams.get("stdout"), streams.get("stderr"))
