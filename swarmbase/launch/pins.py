"""Paths pinned as open directories at launch, checked where they really are.

Why: `agent()` pins its cwd (realpath, under the caller's cwdRoots) when the script calls
it, but the agent may then wait for a run slot, its budget and a daemon-wide slot; a
path handed to bwrap is resolved again when bwrap mounts it, and another write agent of
the same caller can meanwhile swap a directory on it for a symlink (to the state dir's
`runs/` or `admin/sessions`: every caller's records, an admin session). So, right before
the process starts (after every wait), each path is opened (O_PATH, the last component
not followed), the kernel is asked where the opened directory really is
(/proc/self/fd/N), the policy is checked on *that*, and the fd — not the path — is what
bwrap binds (--bind-fd; bwrap re-checks the mount's device and inode against the fd).

The policy, whatever the caller's cwdRoots say:
- nothing under the state dir or homesDir is mounted, except the dirs the daemon made
  for this process (its run's work/ or its worktree: `LaunchSpec.state_dirs`); the
  private dir is the launcher's own;
- nothing that contains them is mounted (a read of such a dir is dropped with a warning,
  a write refused);
- a caller's paths (its cwd, a worktree's repository dirs: `LaunchSpec.caller_paths`) must
  still be under one of the caller's roots (`LaunchSpec.cwd_roots`), and a caller's cwd
  exactly where it was pinned.
"""

from __future__ import annotations

import logging
import os
from typing import Sequence

import attrs

log = logging.getLogger("swarmbase.launch")


class LaunchRefused(PermissionError):
    """A path of the launch breaks the policy; the message says which and why (never where
    a refused path resolves: that would map the host's filesystem for the script)."""


def under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def contains(path: str, roots: Sequence[str]) -> bool:
    return any(r.startswith(path.rstrip("/") + "/") for r in roots)


def open_real(path: str) -> tuple[int, str]:
    """(O_PATH fd, where the kernel says the opened file is). The last component is never
    followed; a symlink anywhere before it is resolved first and the result checked."""
    fd = os.open(os.path.realpath(path), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return fd, os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        os.close(fd)
        raise


@attrs.define
class Pinned:
    """What one launch may mount: the paths kept, the fds to bind them by (closed by
    `close` once the child has them)."""
    read: list[str] = attrs.Factory(list)
    write: list[str] = attrs.Factory(list)
    fds: dict[str, int] = attrs.Factory(dict)

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


def pin(*, key: str, cwd: str, read: Sequence[str], write: Sequence[str], private: str | None,
        forbidden: Sequence[str], state_dirs: Sequence[str] = (), cwd_roots: Sequence[str] = (),
        caller_paths: Sequence[str] = ()) -> Pinned:
    """Open and check every path of one launch (see the module doc). Raises LaunchRefused
    or OSError (a path that no longer exists); either way no fd is left open."""
    out = Pinned()
    allowed_state = [os.path.realpath(p) for p in state_dirs]
    callers = {os.path.abspath(p) for p in caller_paths}
    try:
        def one(path: str, writable: bool, is_cwd: bool = False) -> bool:
            spelled = os.path.abspath(path)
            is_callers = spelled in callers
            if spelled in out.fds:
                return True
            fd, real = open_real(spelled)
            try:
                if is_callers and is_cwd and real != spelled:
                    raise LaunchRefused(f"the cwd {spelled} of {key} changed between the agent() call and its "
                                        "launch (it is no longer the directory that was checked); refused")
                if contains(real, forbidden) or (under(real, forbidden) and not under(real, allowed_state)):
                    if not writable and not is_cwd and contains(real, forbidden):
                        log.warning("not mounting %s for %s: it contains the daemon's state", spelled, key)
                        os.close(fd)
                        return False
                    raise LaunchRefused(f"refusing to mount {spelled} for {key}: it is the daemon's state "
                                        "(the state dir or homesDir)")
                if is_callers and not under(real, cwd_roots):
                    raise LaunchRefused(f"{spelled} of {key} is no longer inside the caller's cwdRoots; refused")
            except BaseException:
                os.close(fd)
                raise
            out.fds[spelled] = fd
            return True

        one(cwd, writable=False, is_cwd=True)
        for p in read:
            if one(p, writable=False, is_cwd=os.path.abspath(p) == os.path.abspath(cwd)):
                out.read.append(p)
        for p in write:
            one(p, writable=True, is_cwd=os.path.abspath(p) == os.path.abspath(cwd))
            out.write.append(p)
        if private is not None:
            fd, _ = open_real(private)
            out.fds[os.path.abspath(private)] = fd
    except BaseException:
        out.close()
        raise
    return out
