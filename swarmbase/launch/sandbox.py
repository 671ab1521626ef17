"""The one place that builds a sandbox command line (bubblewrap), for every child the
daemon starts: script runners, claude agents, codex agents.

Callers say what a process needs — paths to read, paths to write, a private dir, network
or not — never how to confine it. What the sandbox gives, with mode "bwrap":
- an allow-list filesystem: /usr (and /bin, /lib… as the host lays them out), a few /etc
  files, a fresh /tmp, /proc and /dev, then exactly the paths asked for; nothing of the
  state dir, other runs, other callers or other agents' homes exists inside;
- the process's private dir (its HOME, TMPDIR, CODEX_HOME…) mounted at PRIVATE_MOUNT, a
  path outside any temp dir (codex refuses its PATH aliases when CODEX_HOME is under /tmp);
- a new PID namespace: when its init dies, the kernel kills every process inside, however
  it forked or setsid'd; and --die-with-parent ties that init to the daemon (the daemon
  forks only from its long-lived spawning thread, see spawn.py);
- no privilege, whoever started the daemon (identity.py has the policy): a user namespace
  of its own with every capability dropped (bwrap --unshare-user --cap-drop ALL), no new
  privileges, a seccomp filter (seccomp.py) loaded from `seccomp_fd`, and no further user
  namespaces (--disable-userns) unless the child builds a sandbox of its own (`nesting`:
  the codex CLI); a daemon running as root first drops to the child's uid (`user`: its
  caller's, identity.py);
- every mount nosuid (bubblewrap gives each bind, tmpfs and /proc that flag; the tests
  read it back from /proc/self/mountinfo), so a setuid file put in a root from outside
  grants nothing inside, and the filter stops a child making one (seccomp.py);
- paths bound by open fd where the caller pinned them (`fds`: --bind-fd/--ro-bind-fd), so
  what is mounted is the directory that was checked, not whatever the path names by the
  time bwrap mounts it (a symlink swapped in meanwhile is never followed);
- no network namespace of its own unless `network` is False (runners): then --unshare-net.
  An agent's allow-listed namespace is made before bubblewrap (launch/netns.py), so
  bubblewrap inherits it; `hosts_fd` is that namespace's /etc/hosts.
Mode "none" adds nothing: the private dir is used in place.

Pure functions; `HostLayout.probe()` is the only I/O (read once at start-up).
"""

from __future__ import annotations

import os
import shutil
from typing import Mapping, Sequence

import attrs

from ..identity import SandboxUser

PRIVATE_MOUNT = "/run/swarmbase/agent"
ETC_FILES = ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/resolv.conf",
             "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/alternatives", "/etc/ld.so.cache",
             "/etc/os-release", "/etc/mime.types")
TOP_DIRS = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")
FRESH_MOUNTS = ("/", "/tmp", "/run", "/proc", "/dev")
# What the outer (root) stage leaves the child: just enough for setpriv to become the
# sandbox user and clear its bounding set; setpriv's exec of the inner bwrap ends them.
DROP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


@attrs.frozen
class HostLayout:
    """Facts about the host's root, read once: which top dirs are symlinks (merged /usr)."""
    symlinks: tuple[tuple[str, str], ...]     # (/bin, "usr/bin")
    dirs: tuple[str, ...]                     # real top dirs outside /usr to bind read-only
    bwrap: str | None
    setpriv: str | None = None

    @classmethod
    def probe(cls) -> "HostLayout":
        links, dirs = [], []
        for d in TOP_DIRS:
            p = "/" + d
            if os.path.islink(p):
                links.append((p, os.readlink(p)))
            elif os.path.isdir(p):
                dirs.append(p)
        return cls(symlinks=tuple(links), dirs=tuple(dirs), bwrap=shutil.which("bwrap"),
                   setpriv=shutil.which("setpriv"))


@attrs.frozen
class Confinement:
    """What one process may see. Paths are host paths, mounted at the same path inside,
    except `private`, which appears at PRIVATE_MOUNT."""
    cwd: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    private: str | None = None
    network: bool = True
    fds: Mapping[str, int] = attrs.field(factory=dict)   # host path -> open fd bound in its place
    data: tuple[tuple[int, str], ...] = ()   # (fd, path): a read-only file with the fd's bytes
    seccomp_fd: int | None = None
    nesting: bool = False                    # the child makes namespaces of its own (codex)
    user: SandboxUser | None = None          # drop to this user first (the daemon is root)
    hosts_fd: int | None = None              # an inherited fd whose contents become /etc/hosts

    def passed_fds(self) -> tuple[int, ...]:
        """The fds the sandbox command reads; the child must inherit them."""
        out = [*self.fds.values(), *(fd for fd, _ in self.files())]
        if self.seccomp_fd is not None:
            out.append(self.seccomp_fd)
        return tuple(dict.fromkeys(out))

    def files(self) -> tuple[tuple[int, str], ...]:
        """Every read-only data file: `data`, plus the agent's allow-list /etc/hosts."""
        return self.data + (((self.hosts_fd, "/etc/hosts"),) if self.hosts_fd is not None else ())


def inside_path(c: Confinement, mode: str, path: str) -> str:
    """Where a host path under the private dir appears to the process."""
    if mode == "bwrap" and c.private and (path == c.private or path.startswith(c.private.rstrip("/") + "/")):
        return PRIVATE_MOUNT + path[len(c.private.rstrip("/")):]
    return path


def _covered(path: str, by: Sequence[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in by)


def _bind(c: Confinement, src: str, dest: str, writable: bool) -> list[str]:
    fd = c.fds.get(src)
    if fd is not None:
        return ["--bind-fd" if writable else "--ro-bind-fd", str(fd), dest]
    return ["--bind" if writable else "--ro-bind", src, dest]


def _mount_parents(dests: Sequence[str], system: Sequence[str]) -> list[str]:
    """--dir (mode 0755) for every dir above a mount point: bwrap otherwise copies the
    host dir's mode, and a root daemon's child (the sandbox user) could not pass a 0700
    /root or state dir on its way to its own cwd. Made on the sandbox's tmpfs root before
    any bind, so none of them ever touches a host dir."""
    out: list[str] = []
    seen = set(FRESH_MOUNTS)
    for dest in dests:
        parts = dest.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d in seen or _covered(d, system):
                continue
            seen.add(d)
            out += ["--perms", "0755", "--dir", d]
    return out


def bwrap_argv(layout: HostLayout, c: Confinement) -> list[str]:
    """The bubblewrap prefix for one process (the command follows `--`).

    A daemon that is not root: one bwrap, unprivileged — its user namespace maps the
    daemon's uid, and it mounts, drops every capability and loads the filter. A daemon
    that is root (`c.user`): bwrap 0.8 resolves every bind source (a pinned fd too) as the
    user it runs as, and the sandbox user cannot pass a 0700 /root or state dir; so an
    outer bwrap, as root, makes the mounts (with no capability for the child but the
    three setpriv needs), setpriv drops to the sandbox user (and clears the bounding set),
    and an inner unprivileged bwrap gives that user a namespace of its own, takes every
    capability away for good, stops further namespaces and loads the filter."""
    assert layout.bwrap, "bubblewrap is not installed"
    argv = [layout.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--new-session", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    confine = ["--unshare-user", *(() if c.nesting else ("--disable-userns",)), "--cap-drop", "ALL"]
    if c.user is None:
        argv[1:1] = confine
    else:
        argv += ["--cap-drop", "ALL", *(x for cap in DROP_CAPS for x in ("--cap-add", cap))]
    if not c.network:
        argv.append("--unshare-net")
    for link, target in layout.symlinks:
        argv += ["--symlink", target, link]
    for d in layout.dirs:
        argv += ["--ro-bind", d, d]
    system = ["/usr", *layout.dirs, *(link for link, _ in layout.symlinks)]
    writes = list(dict.fromkeys(os.path.abspath(p) for p in c.write))
    reads = [p for p in dict.fromkeys(os.path.abspath(p) for p in c.read) if not _covered(p, system) and p not in writes]
    dests = [*ETC_FILES, *reads, *writes, *((PRIVATE_MOUNT,) if c.private else ()), *(path for _, path in c.files())]
    argv += _mount_parents(dests, system)
    for f in ETC_FILES:
        argv += ["--ro-bind-try", f, f]
    for p in reads:
        argv += _bind(c, p, p, writable=False)
    for p in writes:
        argv += _bind(c, p, p, writable=True)
    if c.private:
        argv += _bind(c, c.private, PRIVATE_MOUNT, writable=True)
    for fd, path in c.files():
        argv += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    seccomp = ["--seccomp", str(c.seccomp_fd)] if c.seccomp_fd is not None else []
    if c.user is None:
        return argv + seccomp + ["--chdir", c.cwd, "--"]
    assert layout.setpriv, "setpriv (util-linux) is not installed"
    # The outer stage has no CAP_DAC_OVERRIDE left when it would chdir: only the inner,
    # as the sandbox user, enters the cwd (which that user owns or may read).
    return (argv + ["--chdir", "/", "--"] + c.user.switch_argv(layout.setpriv)
            + [layout.bwrap, *confine, "--die-with-parent", "--dev-bind", "/", "/", *seccomp, "--chdir", c.cwd, "--"])


def wrap(mode: str, layout: HostLayout, c: Confinement, command: Sequence[str]) -> list[str]:
    if mode == "none":
        return list(command)
    return bwrap_argv(layout, c) + list(command)


def interpreter_paths(bin_path: str, search_path: str) -> list[str]:
    """What a CLI needs mounted to start: its own dir (and, for an npm-installed CLI, the
    whole node_modules tree, whose wrapper loads a platform package from a sibling), and
    for a script, its interpreter's install prefix (`#!/usr/bin/env node` → node's)."""
    out = [os.path.dirname(os.path.abspath(bin_path)), os.path.dirname(os.path.realpath(bin_path))]
    real = os.path.realpath(bin_path)
    # The tree under both spellings: a `.bin/claude` symlink is relative to where it is
    # reached from, which may itself be behind a symlinked directory.
    for spelled in (os.path.abspath(bin_path), real):
        parts = spelled.split(os.sep)
        if "node_modules" in parts:
            i = len(parts) - 1 - parts[::-1].index("node_modules")
            out.append(os.sep.join(parts[: i + 1]))
    try:
        with open(real, "rb") as f:
            head = f.read(256)
    except OSError:
        head = b""
    if head.startswith(b"#!"):
        words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
        if words:
            interp = words[0]
            if os.path.basename(interp) == "env" and len(words) > 1:
                interp = shutil.which(words[1], path=search_path) or ""
            # Both the prefix the shebang names and the one it resolves to: a venv's
            # `bin/python` is a symlink into the base install, and exec needs the link.
            named = (os.path.abspath(interp), os.path.realpath(interp)) if interp else ()
            for spelled in dict.fromkeys(named):
                prefix = os.path.dirname(os.path.dirname(spelled))
                out.append(prefix if prefix not in ("/", "") else os.path.dirname(spelled))
    return [p for p in dict.fromkeys(out) if p and p != "/"]
