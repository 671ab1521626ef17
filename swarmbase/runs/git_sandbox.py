"""Git on a repository an agent can write is untrusted work: it runs in the sandbox.

A write agent whose cwd is a repository controls its `.git/config` (fsmonitor, filters,
diff/merge drivers, sshCommand, includes…), its attributes and its hooks; a worktree
agent controls its worktree (it can replace the `.git` file with a repository of its own)
and its admin dir under `.git/worktrees/` (HEAD, index, commondir). Git run as the daemon
on any of that runs the agent's code as the daemon (issue 20: both routes were shown).
So every git the daemon runs for worktrees:
- runs inside the sandbox like an agent (the caller's uid when the daemon is root, a
  user namespace without capabilities, the seccomp filter, no network), with only the
  repository's `.git` and the one worktree mounted;
- sees a config the daemon wrote, laid read-only over the repository's (`sanitized`: the
  repository format and object-format extension, nothing else), so no filter, driver,
  fsmonitor, hook path, include or credential helper of the repository exists for it;
  attributes then name drivers that are not defined, which git ignores;
- is told where everything is (GIT_DIR, GIT_COMMON_DIR, GIT_WORK_TREE, GIT_INDEX_FILE in
  its private dir), never discovering a `.git` an agent could have touched, and commits
  with plumbing onto the branch it names (HEAD and the agent's index are never read);
- gets the dangerous knobs off on its command line as well (-c beats every file), and an
  environment with no system or global config, no pager, editor, askpass or ssh.
Without the sandbox (`sandbox: "none"`) the overlay cannot be applied and git runs as the
daemon with the command-line knobs only: no weaker than that mode's write agents, whose
shell runs unconfined as the daemon's user anyway.

Measured: one sandboxed git call costs about one bwrap start (see bench/isolation.py).
"""

from __future__ import annotations

import copy
import os
import re
import secrets
import shlex
import subprocess
from typing import Mapping, Sequence

import trio

from ..launch.spec import AGENT_DIR, LaunchSpec, LocalPlacement

SAFE_CONFIG = (
    "core.hooksPath=/dev/null", "core.fsmonitor=false", "core.untrackedCache=false", "core.sshCommand=false",
    "core.pager=cat", "core.editor=false", "core.askPass=", "core.attributesFile=/dev/null", "core.gitProxy=",
    "core.alternateRefsCommand=", "credential.helper=", "diff.external=", "protocol.allow=never",
    "uploadpack.packObjectsHook=", "gpg.program=false", "commit.gpgSign=false", "tag.gpgSign=false",
    "submodule.recurse=false", "safe.directory=*", "init.templateDir=", "advice.detachedHead=false",
)
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ")
MAX_CONFIG_BYTES = 1 << 20
_FORMATS = {"objectformat": ("sha1", "sha256"), "refstorage": ("files", "reftable")}


class GitError(Exception):
    """Git failed; the message is its last line of stderr (or what failed)."""


def environment(parent: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in parent.items() if k in ENV_KEEP}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", GIT_ATTR_NOSYSTEM="1",
               HOME=f"{AGENT_DIR}/home", XDG_CONFIG_HOME=f"{AGENT_DIR}/home", GIT_TERMINAL_PROMPT="0",
               GIT_PAGER="cat", PAGER="cat", GIT_EDITOR="false", EDITOR="false", VISUAL="false",
               GIT_ASKPASS="false", SSH_ASKPASS="false", GIT_SSH_COMMAND="false", GIT_ALLOW_PROTOCOL="",
               GIT_PROTOCOL_FROM_USER="0", GIT_NO_REPLACE_OBJECTS="1", GIT_OPTIONAL_LOCKS="0")
    return env


def sanitized(raw: bytes) -> bytes:
    """The config git sees in place of the repository's: its format version and the
    extensions that change how objects and refs are stored; nothing that runs code or
    redirects git (worktreeConfig is dropped, so no config.worktree is read either)."""
    version = "0"
    ext: dict[str, str] = {}
    section = ""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        head = re.fullmatch(r"\[\s*([A-Za-z0-9.-]+)\s*\]", line)
        if head:
            section = head.group(1).lower()
            continue
        if line.startswith("["):
            section = ""                      # a subsection ([remote "x"]): nothing we keep
            continue
        kv = re.fullmatch(r"([A-Za-z][A-Za-z0-9-]*)\s*=\s*\"?([A-Za-z0-9]+)\"?", line)
        if not kv:
            continue
        key, value = kv.group(1).lower(), kv.group(2).lower()
        if section == "core" and key == "repositoryformatversion" and value in ("0", "1"):
            version = value
        elif section == "extensions" and value in _FORMATS.get(key, ()):
            ext[key] = value
    out = f"[core]\n\trepositoryformatversion = {version}\n"
    if ext and version == "1":
        out += "[extensions]\n" + "".join(f"\t{k} = {v}\n" for k, v in sorted(ext.items()))
    return out.encode()


def read_config(common: str) -> bytes:
    """The repository's config bytes (a symlink or a huge file reads as empty)."""
    try:
        fd = os.open(os.path.join(common, "config"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return b""
        return os.read(fd, MAX_CONFIG_BYTES)
    finally:
        os.close(fd)


class SandboxedGit:
    """Runs git (or a short sh script of git commands) in the sandbox through the
    launcher, with the repository's config replaced (see the module doc)."""

    def __init__(self, launcher: LocalPlacement, parent_env: Mapping[str, str] | None = None,
                 owner: str | None = None) -> None:
        self.launcher = launcher
        self.env = environment(os.environ if parent_env is None else parent_env)
        self.owner = owner              # the caller whose repository it is: git runs as its uid

    def for_caller(self, owner: str) -> "SandboxedGit":
        """The same git, run as `owner`'s uid (the repository and worktrees are its)."""
        twin = copy.copy(self)
        twin.owner = owner
        return twin

    async def run(self, script: str, *, common: str, cwd: str, write: Sequence[str] = (), read: Sequence[str] = (),
                  env: Mapping[str, str] | None = None, state_dirs: Sequence[str] = (),
                  roots: Sequence[str] = (), caller_paths: Sequence[str] = ()) -> str:
        """`script` runs under sh with `git` meaning the hardened git and GIT_DIR the
        repository's .git (`common`); its stdout, or GitError with git's last word."""
        flags = " ".join(f"-c {shlex.quote(c)}" for c in SAFE_CONFIG)
        body = f'git() {{ command git {flags} "$@"; }}\nset -e\n{script}'
        full_env = {**self.env, "GIT_DIR": common, "GIT_COMMON_DIR": common, **(env or {})}
        overlays = {os.path.join(common, "config"): sanitized(read_config(common))}
        if not self.launcher.confined:      # no sandbox: no mount to lay the config over
            overlays = {}
        spec = LaunchSpec(argv=("/bin/sh", "-c", body), env=full_env, cwd=cwd, key=f"git-{secrets.token_hex(6)}",
                          dirs=("home",), read=(cwd, *read), write=(common, *write), network=False,
                          state_dirs=tuple(state_dirs), cwd_roots=tuple(roots), caller_paths=tuple(caller_paths),
                          overlays=overlays, idle_timeout=300.0, record={"git": True}, owner=self.owner)
        out, err = bytearray(), bytearray()
        try:
            async with self.launcher.open(spec, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE) as proc:
                async def drain(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
                    assert stream is not None          # both were asked for as pipes
                    while chunk := await stream.receive_some(65536):
                        into.extend(chunk)
                async with trio.open_nursery() as n:
                    n.start_soon(drain, proc.stdout, out)
                    n.start_soon(drain, proc.stderr, err)
                code = await proc.wait()
        except OSError as e:
            raise GitError(f"{e.strerror or e}") from None
        if code != 0:
            lines = [ln for ln in err.decode(errors="replace").strip().splitlines() if ln.strip()]
            last = lines[-1] if lines else f"git exited with {code}"
            user = self.launcher.user_for(self.owner)
            if "ermission denied" in last and user is not None:
                last += f" (git runs as {user.describe()}: the repository's .git must be writable by it)"
            raise GitError(last)
        return out.decode(errors="replace")
