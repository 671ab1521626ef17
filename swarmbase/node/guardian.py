"""Starting an agent's CLI on a node under a guardian, reading its lines, killing its group.

Why a guardian: when a Ray worker dies (force cancel, the daemon killed, the node's raylet
gone) Ray SIGKILLs the worker and its *direct* children only; the CLI runs in its own
session (so it can be killed as a group), and its children survived 12 s and more in the
prototype. A watcher that is a direct child of the worker dies with it. What works is an
`sh` forked inside the agent's group before the CLI is exec'd: it blocks on a lifeline
pipe whose write end only the worker holds, and EOF — however the worker died — makes it
TERM, then KILL, the whole group (itself last; it ignores TERM).

The read loop never blocks for long (non-blocking fd, select with a short timeout): Ray's
ordinary cancel raises KeyboardInterrupt between bytecodes, which a blocking read would
hold off for as long as the CLI stays silent.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

# $1: the file given to the CLI as stdin ("" for /dev/null); then the command.
# fd 0 on entry is the lifeline; the guardian keeps it as fd 3, the CLI never sees it.
GUARDIAN = r"""
exec 3<&0
( trap '' TERM INT HUP; read -r _ <&3; kill -TERM 0 2>/dev/null; sleep 1; kill -KILL 0 2>/dev/null ) \
    </dev/null >/dev/null 2>&1 &
stdin=${1:-/dev/null}
shift
exec "$@" 3<&- <"$stdin"
"""

GUARDIAN_FDS = 3                # the highest fd the guardian itself uses (the lifeline)
POLL_S = 0.2                    # how long a read may block: bounds how late a cancel is seen
AFTER_LEADER_S = 1.0            # the leader exited: a stray still writing gets this long
TERM_GRACE_S = 1.0
MAX_LINE = 16 * 1024 * 1024


class Guarded:
    """A CLI started under the guardian: its pid (= pgid), stdout (with stderr) and the
    lifeline's write end."""

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, stdin_file: str | None,
                 rlimits: Sequence[tuple[int, int, int]] = (), pass_fds: Sequence[int] = (),
                 around_fork: Callable[[], ContextManager[Any]] = nullcontext) -> None:
        """`pass_fds` stay open at their numbers (the sandbox's filter and data files);
        `around_fork()` is entered around the fork (a namespace the child is born in)."""
        if clash := sorted(fd for fd in pass_fds if fd <= GUARDIAN_FDS):
            # sh redirects only fds 0-9, and the guardian takes fd 3 for the lifeline.
            raise OSError(f"fds {clash} cannot be passed through the guardian (it uses 0-{GUARDIAN_FDS})")
        life_r, self._life_w = os.pipe()          # both close-on-exec; Popen dup2s life_r to fd 0
        out_r, out_w = os.pipe()
        try:
            with around_fork():
                self.proc = subprocess.Popen(["/bin/sh", "-c", GUARDIAN, "swarmbase-guardian", stdin_file or "", *argv],
                                             stdin=life_r, stdout=out_w, stderr=subprocess.STDOUT, env=dict(env),
                                             cwd=cwd, start_new_session=True, close_fds=True,
                                             pass_fds=tuple(pass_fds))
        except BaseException:
            for fd in (self._life_w, out_r):
                os.close(fd)
            raise
        finally:
            os.close(life_r)
            os.close(out_w)
        self.pid = self.proc.pid
        self.stdout = out_r
        os.set_blocking(out_r, False)
        # No preexec_fn in a threaded Ray worker: limits are set from outside, at once.
        for which, soft, hard in rlimits:
            try:
                resource.prlimit(self.pid, which, (soft, hard))
            except (ProcessLookupError, PermissionError, ValueError):
                pass

    def lines(self) -> Iterator[list[bytes]]:
        """Batches of complete lines as they come; ends at EOF, at an overlong line, or
        AFTER_LEADER_S after the leader exited (never waits on EOF alone)."""
        buf = bytearray()
        leader_gone: float | None = None
        while True:
            if leader_gone is None and self.exited():
                leader_gone = time.monotonic()
            if leader_gone is not None and time.monotonic() - leader_gone > AFTER_LEADER_S:
                break
            ready, _, _ = select.select([self.stdout], [], [], POLL_S)
            if not ready:
                continue
            try:
                chunk = os.read(self.stdout, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            buf += chunk
            if b"\n" in chunk:
                *complete, rest = bytes(buf).split(b"\n")
                buf = bytearray(rest)
                yield complete
            if len(buf) > MAX_LINE:
                return
        if buf:
            yield [bytes(buf)]

    def exited(self) -> bool:
        """Whether the leader exited, without reaping it: while it is a zombie its pid, and
        so the group id, cannot be reused, so the final group kill hits only our group."""
        if self.proc.returncode is not None:
            return True
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def kill(self, grace: float = TERM_GRACE_S) -> None:
        """TERM the group, wait up to `grace` for the leader, KILL the group, then reap the
        leader; close our fds. Once only."""
        if self.stdout < 0:
            return
        if not self.exited():
            _killpg(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while not self.exited() and time.monotonic() < deadline:
                time.sleep(0.02)
        _killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        for fd in (self.stdout, self._life_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stdout = self._life_w = -1


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
