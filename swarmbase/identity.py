"""Who sandboxed children run as, whoever starts the daemon.

The policy: a child never runs with any privilege on the host.
- Every sandboxed child gets a user namespace of its own (bwrap --unshare-user) and no
  capability in it (bwrap drops them all before exec), no new privileges, and a seccomp
  filter (seccomp.py).
- A daemon started by a plain user runs its children as that user (mapped to itself in
  the namespace). A daemon started as root runs them as the **sandbox user**
  (`sandboxUser`, default `nobody`): `setpriv` switches to it before bwrap makes the user
  namespace, so the namespace maps that uid and nothing else. A user namespace mapped to
  host uid 0 with capabilities dropped would not do: much of the kernel (writes under
  /proc/sys via sysctl's permission check, root-owned files everywhere) trusts kuid 0
  alone.
- Dirs the daemon makes for children (a private HOME/TMPDIR, a run's work/, a worktree's
  checkout) are handed to the sandbox user (`adopt`: chown, never following a symlink).
  A caller's own dirs are never chowned: a write agent writes what the sandbox user may
  write there, exactly as a daemon running as that user would. Git for worktrees runs in
  the sandbox as the same user, so a repository's `.git` must be writable by it.
- Rejected: running each child as the owner of the caller's cwdRoot (a root-owned root
  needs a fallback anyway, and every daemon-made dir would need a per-agent owner); a
  fresh uid per agent (nothing to chown daemon-made dirs to ahead of time, and the
  namespace, PID namespace and mount allow-list already keep agents apart).
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

import attrs

DEFAULT_USER = "nobody"
USERNS_LIMIT = Path("/proc/sys/user/max_user_namespaces")


class IdentityError(ValueError):
    """The sandbox user cannot be used; the message says why."""


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
    """The user children run as when the daemon is root (None: the daemon is not root, and
    children run as the daemon's own user). `wanted`: a user name, or `uid` / `uid:gid`."""
    if (os.geteuid() if euid is None else euid) != 0:
        return None
    spec = (wanted or DEFAULT_USER).strip()
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
    """Hand a daemon-made dir (or file) to the sandbox user; nothing to do when the daemon
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
