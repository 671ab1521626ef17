"""isolation: 'worktree' — an agent works in a fresh git worktree on its own branch,
never in the caller's checkout.

- The branch is `swarmbase/<runId>/<n>`, from the repository's HEAD (or `opts.base`); the
  worktree lives in the run's dir (`worktrees/<n>`), so parallel writers on one repository
  never share files.
- When the agent ends, however it ends, its changes are committed on that branch (author
  "SwarmBase agent <n>") and the worktree is removed (kept with keepWork); the agent's
  record carries {branch, commit, filesChanged, diffStat}.
- Git runs with hooks off and no user or system config: a repository's hooks are code
  the daemon would otherwise run as itself. Operations on one repository are serialized
  (git's own ref and worktree locks fail rather than wait).
- Inside the sandbox the agent can write its worktree and its own admin dir under the
  repository's .git (index, HEAD); the rest of .git is read-only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import attrs
import trio

from ..spawn import open_child

GIT_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ")
AUTHOR_EMAIL = "agents@swarmbase.invalid"
_locks: dict[str, trio.Lock] = {}


class WorktreeError(Exception):
    """Thrown into the script: the agent cannot have a worktree; the message says why."""


@attrs.frozen
class Worktree:
    repo: str               # the repository's top level (the caller's checkout)
    path: str               # the worktree's top level
    cwd: str                # where the agent runs (the same place relative to the top level)
    gitdir: str             # the worktree's admin dir under the repository's .git
    common: str             # the repository's .git
    branch: str
    base: str               # the commit it started from


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in GIT_ENV_KEEP}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null", HOME="/nonexistent", GIT_TERMINAL_PROMPT="0")
    return env


async def git(cwd: str, *args: str) -> str:
    """Run git (hooks off); its stdout, or WorktreeError with its stderr."""
    argv = ["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false", *args]
    proc = await open_child(argv, env=_env(), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    out, err = bytearray(), bytearray()

    async def drain(stream: Any, into: bytearray) -> None:
        while chunk := await stream.receive_some(65536):
            into.extend(chunk)

    try:
        async with trio.open_nursery() as n:
            n.start_soon(drain, proc.stdout, out)
            n.start_soon(drain, proc.stderr, err)
        code = await proc.wait()
    finally:
        await proc.aclose_streams()
    if code != 0:
        raise WorktreeError(err.decode(errors="replace").strip().splitlines()[-1] if err.strip() else f"git {args[0]} failed")
    return out.decode(errors="replace").strip()


def _lock(repo: str) -> trio.Lock:
    return _locks.setdefault(repo, trio.Lock())


async def repository(cwd: str) -> tuple[str, str]:
    """(top level, relative cwd) of the repository holding cwd, or WorktreeError."""
    try:
        top = await git(cwd, "rev-parse", "--show-toplevel")
    except WorktreeError:
        raise WorktreeError(f"agent(): isolation 'worktree' needs a cwd inside a git repository; {cwd} is not "
                            "in one") from None
    try:
        await git(top, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except WorktreeError:
        raise WorktreeError(f"agent(): isolation 'worktree': the repository {top} has no commits yet") from None
    rel = os.path.relpath(os.path.realpath(cwd), os.path.realpath(top))
    return top, "" if rel == "." else rel


async def create(cwd: str, root: Path, run_id: str, n: int, base: str | None) -> Worktree:
    top, rel = await repository(cwd)
    path = root / str(n)
    branch = f"swarmbase/{run_id}/{n}"
    async with _lock(top):
        try:
            start = await git(top, "rev-parse", "--verify", "--quiet", f"{base or 'HEAD'}^{{commit}}")
        except WorktreeError:
            raise WorktreeError(f"agent(): opts.base {base!r} is not a commit of {top}") from None
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        await git(top, "worktree", "add", "--quiet", "-b", branch, str(path), start)
    gitdir = await git(str(path), "rev-parse", "--absolute-git-dir")
    common = await git(str(path), "rev-parse", "--path-format=absolute", "--git-common-dir")
    return Worktree(repo=top, path=str(path), cwd=os.path.join(str(path), rel) if rel else str(path),
                    gitdir=gitdir, common=common, branch=branch, base=start)


async def finish(wt: Worktree, n: int, label: str, keep: bool) -> dict[str, Any]:
    """Commit what the agent changed on its branch, remove the worktree (unless kept);
    what it did, for the agent's record."""
    await git(wt.path, "add", "-A")
    changed = await git(wt.path, "diff", "--cached", "--name-only")
    commit = wt.base
    if changed:
        await git(wt.path, "-c", f"user.name=SwarmBase agent {n}", "-c", f"user.email={AUTHOR_EMAIL}",
                  "commit", "--quiet", "--no-verify", "-m", f"SwarmBase agent {n}: {label}"[:200],
                  "--author", f"SwarmBase agent {n} <{AUTHOR_EMAIL}>")
        commit = await git(wt.path, "rev-parse", "HEAD")
    stat = await git(wt.path, "diff", "--shortstat", wt.base, commit) if changed else ""
    if not keep:
        async with _lock(wt.repo):
            await git(wt.repo, "worktree", "remove", "--force", wt.path)
    return {"branch": wt.branch, "commit": commit, "base": wt.base, "filesChanged": len(changed.splitlines()),
            "diffStat": stat, "repo": wt.repo}
