"""Who sandboxed children run as, whoever starts the daemon.

The policy: a child never runs with any privilege on the host, and no two callers'
children share a host identity.
- Every sandboxed child gets a user namespace of its own (bwrap --unshare-user) and no
  capability in it (bwrap drops them all before exec), no new privileges, and a seccomp
  filter (seccomp.py).
- A daemon started by a plain user runs its children as that user (mapped to itself in
  the namespace): every caller's children then share the daemon's uid, and what keeps
  callers apart is the sandbox alone (mounts, PID namespace, no ptrace).
- A daemon started as root gives **each caller a uid of its own** from a range it owns
  (`sandboxUids`, default 600000-600999; gid = uid), the way systemd's DynamicUser and
  container runtimes' subuid ranges do: `setpriv` switches to it before bwrap makes the
  user namespace, so the namespace maps that uid and nothing else. Another caller's
  agent, or any local account, is then a different uid: it cannot read the agent's
  /proc/<pid>/environ or write where only that caller's uid may write. A user namespace
  mapped to host uid 0 with capabilities dropped would not do: much of the kernel (writes
  under /proc/sys, root-owned files everywhere) trusts kuid 0 alone.
- The allocation is stable across restarts (`identities.json` in the state dir, 0600,
  written atomically before the uid is first used), so a caller's roots, chowned to its
  uid once, keep working. The range is checked at start: no uid or gid of it may be in
  /etc/passwd or /etc/group, and no unallocated uid of it may own anything in the shared
  temp dirs (a cheap look at their top level, not a scan of the disk).
- The range's first uid is the daemon's own for children that belong to no caller: warm
  spare script runners (started before any run asks) and the start-up self-check.
  Runners have no network, no writable mount and a PID namespace of their own, so a uid
  shared between them opens no path from one caller to another.
- `sandboxUser` (a name or uid[:gid]) is the older setting: one shared user for every
  caller. It is still honoured when set, and shares that uid between callers.
- Dirs the daemon makes for children (a private HOME/TMPDIR, a run's work/, a worktree's
  checkout) are handed to the child's uid (`adopt`: chown, never following a symlink). A
  caller's own dirs are never chowned: a write agent writes what its uid may write there,
  exactly as a daemon running as that user would. Git for worktrees runs in the sandbox
  as the caller's uid, so a repository's `.git` must be writable by it.
- Rejected: a uid per agent (nothing to chown a caller's roots to ahead of time; the
  namespace, PID namespace and mount allow-list already keep one caller's agents apart);
  running each child as the owner of the caller's cwdRoot (a root-owned root needs a
  fallback anyway).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import threading
from pathlib import Path
from typing import Iterable, Mapping

import attrs

from . import fsutil

DEFAULT_UIDS = "600000-600999"
USERNS_LIMIT = Path("/proc/sys/user/max_user_namespaces")
ALLOCATIONS = "identities.json"
# Where a uid left behind by someone else would show (top level only: the check is cheap).
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/home", "/run/user")


class IdentityError(ValueError):
    """A sandbox identity (the shared user, the uid range) cannot be used; the message says why."""


@attrs.frozen
class SandboxUser:
    uid: int
    gid: int
    name: str

    def switch_argv(self, setpriv: str) -> list[str]:
        """The exec wrapper that drops root for this user before the sandbox starts."""
        return [setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]

    def describe(self) -> str:
        return f"{self.name} (uid {self.uid})"


def resolve(wanted: str | None, euid: int | None = None) -> SandboxUser | None:
    """The one shared user `sandboxUser` names when the daemon is root (None: not set, or
    the daemon is not root). `wanted`: a user name, or `uid` / `uid:gid`."""
    if (os.geteuid() if euid is None else euid) != 0 or wanted is None:
        return None
    spec = wanted.strip()
    uid: int | None = None
    gid: int | None = None
    name = spec
    if spec.replace(":", "").isdigit() and spec.count(":") <= 1 and not spec.startswith(":"):
        parts = spec.split(":")
        uid = int(parts[0])
        gid = int(parts[1]) if len(parts) > 1 and parts[1] else None
        try:
            entry = pwd.getpwuid(uid)
            name, gid = entry.pw_name, entry.pw_gid if gid is None else gid
        except KeyError:
            name = f"uid {uid}"
            gid = uid if gid is None else gid
    else:
        try:
            entry = pwd.getpwnam(spec)
        except KeyError:
            raise IdentityError(f"sandboxUser: no user named {spec!r} on this machine; create it "
                                f"(useradd --system --no-create-home {spec}) or name another") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if uid == 0 or gid == 0:
        raise IdentityError(f"sandboxUser: {spec!r} is root (uid/gid 0); children must run as an "
                            "unprivileged user")
    return SandboxUser(uid=uid, gid=gid, name=name)


def adopt(user: SandboxUser | None, path: str | os.PathLike[str]) -> None:
    """Hand a daemon-made dir (or file) to the child's uid; nothing to do when the daemon
    is not root. Never follows a symlink (the path is the daemon's own, but be strict)."""
    if user is not None:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


def adopt_tree(user: SandboxUser | None, root: Path) -> None:
    """adopt() for a daemon-made tree (a private dir it just filled)."""
    if user is None:
        return
    adopt(user, root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            adopt(user, os.path.join(dirpath, name))


def userns_limit() -> int | None:
    """/proc/sys/user/max_user_namespaces (read only; None where it does not exist)."""
    try:
        return int(USERNS_LIMIT.read_text().strip())
    except (OSError, ValueError):
        return None


def setpriv_path() -> str | None:
    return shutil.which("setpriv")


@attrs.frozen
class UidRange:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> "UidRange":
        """"600000-600999" (at least two uids: the first is the daemon's, see above)."""
        lo, sep, hi = text.strip().partition("-")
        if not (sep and lo.strip().isdigit() and hi.strip().isdigit()):
            raise IdentityError(f"sandboxUids: {text!r} is not a range like \"600000-600999\"")
        r = cls(int(lo), int(hi))
        if r.first < 1000 or r.last < r.first + 1 or r.last >= 2**32 - 2:
            raise IdentityError(f"sandboxUids: {text!r} must be at least two uids, from 1000 up "
                                "(below 1000 are system users), below 4294967294")
        return r

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def describe(self) -> str:
        return f"{self.first}-{self.last}"


def range_conflicts(r: UidRange, users: Iterable[tuple[str, int]], groups: Iterable[tuple[str, int]]) -> list[str]:
    """Accounts of this machine inside the range ("user www (600002)"), none if it is free."""
    return ([f"user {name} ({uid})" for name, uid in users if uid in r]
            + [f"group {name} ({gid})" for name, gid in groups if gid in r])


def squatters(r: UidRange, allocated: Iterable[int], dirs: Iterable[str] = SHARED_DIRS) -> list[str]:
    """Entries at the top of the shared dirs owned by an uid of the range that no caller
    has: someone else uses it (a leftover of another tool, another daemon's range)."""
    mine = set(allocated)
    out = []
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                uid = e.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if uid in r and uid not in mine and uid != r.first:
                out.append(f"{e.path} (uid {uid})")
    return out


def check_range(r: UidRange, allocated: Iterable[int]) -> None:
    """IdentityError unless the range is the daemon's alone (see the module doc)."""
    clash = range_conflicts(r, ((u.pw_name, u.pw_uid) for u in pwd.getpwall()),
                            ((g.gr_name, g.gr_gid) for g in grp.getgrall()))
    if clash:
        raise IdentityError(f"sandboxUids {r.describe()} overlaps accounts of this machine: {', '.join(clash[:5])}; "
                            "choose a range no user or group has")
    used = squatters(r, allocated)
    if used:
        raise IdentityError(f"sandboxUids {r.describe()}: uids no caller has own files already: {', '.join(used[:5])}; "
                            "choose another range or remove them")


def allocate(r: UidRange, held: Mapping[str, int], caller: str) -> int:
    """The caller's uid: the one it holds, else the lowest free one after the range's first."""
    if caller in held:
        return held[caller]
    taken = set(held.values())
    for uid in range(r.first + 1, r.last + 1):
        if uid not in taken:
            return uid
    raise IdentityError(f"sandboxUids {r.describe()} is full ({len(taken)} callers): widen the range")


class Identities:
    """Each caller's uid, allocated from the range and persisted in the state dir."""

    def __init__(self, path: Path, r: UidRange) -> None:
        self.path = path
        self.range = r
        self._lock = threading.Lock()       # allocations come from the loop and worker threads
        raw = fsutil.read_json(path, {}) or {}
        held = raw.get("callers", {}) if isinstance(raw, dict) else {}
        self.held: dict[str, int] = {str(k): v for k, v in held.items() if isinstance(v, int)}

    def runner(self) -> SandboxUser:
        """The daemon's own uid, for children that belong to no caller."""
        return SandboxUser(uid=self.range.first, gid=self.range.first, name="swarmbase (no caller)")

    def user_for(self, caller: str) -> SandboxUser:
        with self._lock:
            uid = self.held.get(caller)
            if uid is None:
                uid = allocate(self.range, self.held, caller)
                self.held = {**self.held, caller: uid}
                # Persisted before the uid is used: a crash never gives it to another caller.
                body = json.dumps({"version": 1, "range": self.range.describe(), "callers": self.held}, indent=1)
                fsutil.write_atomic(self.path, body.encode() + b"\n", mode=0o600)
        return SandboxUser(uid=uid, gid=uid, name=f"caller {caller}")

    def check(self) -> None:
        """IdentityError unless every held uid is in the range and the range is free."""
        outside = sorted(f"{k} ({v})" for k, v in self.held.items() if v not in self.range or v == self.range.first)
        if outside:
            raise IdentityError(f"{self.path}: callers hold uids outside sandboxUids {self.range.describe()}: "
                                f"{', '.join(outside)}; restore the range, or move the file away (the callers' "
                                "roots must then be chowned to their new uids)")
        check_range(self.range, self.held.values())
