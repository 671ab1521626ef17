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
- no network namespace of its own unless `network` is False (runners): then --unshare-net.
  An agent's allow-listed namespace is made before bubblewrap (launch/netns.py), so
  bubblewrap inherits it; `hosts_fd` is that namespace's /etc/hosts.
Mode "none" adds nothing: the private dir is used in place.

Pure functions; `HostLayout.probe()` is the only I/O (read once at start-up).
"""

from __future__ import annotations

import os
import shutil
from typing import Sequence

import attrs

PRIVATE_MOUNT = "/run/swarmbase/agent"
ETC_FILES = ("/etc/hosts", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/resolv.conf",
             "/etc/localtime", "/etc/ssl", "/etc/ca-certificates", "/etc/alternatives", "/etc/ld.so.cache",
             "/etc/os-release", "/etc/mime.types")
TOP_DIRS = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")


@attrs.frozen
class HostLayout:
    """Facts about the host's root, read once: which top dirs are symlinks (merged /usr)."""
    symlinks: tuple[tuple[str, str], ...]     # (/bin, "usr/bin")
    dirs: tuple[str, ...]                     # real top dirs outside /usr to bind read-only
    bwrap: str | None

    @classmethod
    def probe(cls) -> "HostLayout":
        links, dirs = [], []
        for d in TOP_DIRS:
            p = "/" + d
            if os.path.islink(p):
                links.append((p, os.readlink(p)))
            elif os.path.isdir(p):
                dirs.append(p)
        return cls(symlinks=tuple(links), dirs=tuple(dirs), bwrap=shutil.which("bwrap"))


@attrs.frozen
class Confinement:
    """What one process may see. Paths are host paths, mounted at the same path inside,
    except `private`, which appears at PRIVATE_MOUNT."""
    cwd: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    private: str | None = None
    network: bool = True
    hosts_fd: int | None = None               # an inherited fd whose contents become /etc/hosts


def inside_path(c: Confinement, mode: str, path: str) -> str:
    """Where a host path under the private dir appears to the process."""
    if mode == "bwrap" and c.private and (path == c.private or path.startswith(c.private.rstrip("/") + "/")):
        return PRIVATE_MOUNT + path[len(c.private.rstrip("/")):]
    return path


def _covered(path: str, by: Sequence[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in by)


def bwrap_argv(layout: HostLayout, c: Confinement) -> list[str]:
    """The bubblewrap prefix for one process (the command follows `--`)."""
    assert layout.bwrap, "bubblewrap is not installed"
    argv = [layout.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--new-session", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/run"]
    if not c.network:
        argv.append("--unshare-net")
    for link, target in layout.symlinks:
        argv += ["--symlink", target, link]
    for d in layout.dirs:
        argv += ["--ro-bind", d, d]
    for f in ETC_FILES:
        argv += ["--ro-bind-try", f, f]
    if c.hosts_fd is not None:
        argv += ["--ro-bind-data", str(c.hosts_fd), "/etc/hosts"]
    system = ["/usr", *layout.dirs]
    writes = list(dict.fromkeys(os.path.abspath(p) for p in c.write))
    for p in dict.fromkeys(os.path.abspath(p) for p in c.read):
        if not _covered(p, system) and p not in writes:
            argv += ["--ro-bind", p, p]
    for p in writes:
        argv += ["--bind", p, p]
    if c.private:
        argv += ["--bind", c.private, PRIVATE_MOUNT]
    argv += ["--chdir", c.cwd, "--"]
    return argv


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
            if interp:
                real_interp = os.path.realpath(interp)
                prefix = os.path.dirname(os.path.dirname(real_interp))
                out.append(prefix if prefix not in ("/", "") else os.path.dirname(real_interp))
    return [p for p in dict.fromkeys(out) if p and p != "/"]
