"""isolation: 'worktree' — an agent works in a fresh git worktree on its own branch,
never in the caller's checkout.

- The branch is `swarmbase/<runId>/<n>`, from the repository's HEAD (or `opts.base`); the
  worktree lives in the run's dir (`worktrees/<n>`), so parallel writers on one repository
  never share files.
- When the agent ends, however it ends, its changes are committed on that branch (author
  "SwarmBase agent <n>") and the worktree is removed (kept with keepWork); the agent's
  record carries {branch, commit, filesChanged, diffStat}.
- Every git call runs in the sandbox with the repository's config replaced (see
  git_sandbox.py); the repository (its top level and its `.git`) must lie inside the
  caller's cwdRoots (or be the run's own work/), and is found by reading `.git` entries,
  never by running git where an agent could have planted a `.git`. Operations on one
  repository are serialized (git's own ref and worktree locks fail rather than wait).
- A record per worktree (`worktrees/<n>.json`, the daemon's, never mounted) is written
  before `git worktree add` and removed once the worktree is committed and removed: a
  daemon killed meanwhile leaves it, and the next boot commits what the agent left and
  removes the worktree (`recover`), so no branch stays checked out in the user's
  repository.
- Inside the agent's sandbox it can write its worktree and its own admin dir under the
  repository's .git (index, HEAD); the rest of .git is read-only. Nothing in either is
  trusted afterwards: the commit names the branch and builds a fresh index.
"""

from __future__ import annotations

import logging
import os
import shutil
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Sequence

import attrs
import trio

from .. import fsutil
from ..jsonvalue import JsonObject
from .git_sandbox import GitError, SandboxedGit

log = logging.getLogger("swarmbase.worktrees")

AUTHOR_EMAIL = "agents@swarmbase.invalid"
_locks: dict[str, trio.Lock] = {}


class WorktreeError(Exception):
    """Thrown into the script: the agent cannot have a worktree; the message says why."""


@attrs.frozen
class Repository:
    top: str                # the repository's top level (the caller's checkout)
    common: str             # its .git
    rel: str                # the cwd relative to the top level ("" at the top)


@attrs.frozen
class Worktree:
    repo: str               # the repository's top level (the caller's checkout)
    path: str               # the worktree's top level
    cwd: str                # where the agent runs (the same place relative to the top level)
    gitdir: str             # the worktree's admin dir under the repository's .git
    common: str             # the repository's .git
    branch: str
    base: str               # the commit it started from
    record: str = ""        # the daemon's record of it (removed once it is gone)
    roots: tuple[str, ...] = ()   # where the repository must stay (the caller's roots, or the run's work/)


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def find_repository(cwd: str, roots: Sequence[str]) -> Repository:
    """The repository holding cwd, from its `.git` entry (a dir, or a file naming one),
    both inside `roots`; WorktreeError otherwise."""
    real = os.path.realpath(cwd)
    d = real
    while True:
        dotgit = os.path.join(d, ".git")
        if os.path.isdir(dotgit):
            common = os.path.realpath(dotgit)
            break
        if os.path.isfile(dotgit):
            try:
                with open(dotgit, encoding="utf-8", errors="replace") as f:
                    line = f.read(4096).strip()
            except OSError:
                line = ""
            if not line.startswith("gitdir:"):
                raise WorktreeError(f"agent(): isolation 'worktree': {dotgit} is not a git link")
            gitdir = os.path.realpath(os.path.join(d, line[len("gitdir:"):].strip()))
            common = gitdir
            try:
                with open(os.path.join(gitdir, "commondir"), encoding="utf-8", errors="replace") as f:
                    common = os.path.realpath(os.path.join(gitdir, f.read(4096).strip()))
            except OSError:
                pass
            break
        parent = os.path.dirname(d)
        if parent == d:
            raise WorktreeError(f"agent(): isolation 'worktree' needs a cwd inside a git repository; {cwd} is not "
                                "in one")
        d = parent
    if not (_under(d, roots) and _under(common, roots)):
        raise WorktreeError(f"agent(): isolation 'worktree': the repository holding {cwd} (its top level and its "
                            ".git) must be inside this caller's cwdRoots")
    rel = os.path.relpath(real, d)
    return Repository(top=d, common=common, rel="" if rel == "." else rel)


def _lock(repo: str) -> trio.Lock:
    return _locks.setdefault(repo, trio.Lock())


async def repository(cwd: str, *, git: SandboxedGit, roots: Sequence[str]) -> Repository:
    """The repository holding cwd, checked to have a commit; WorktreeError otherwise."""
    repo = find_repository(cwd, roots)
    try:
        await git.run('git rev-parse --verify --quiet "HEAD^{commit}" >/dev/null', common=repo.common,
                      cwd=repo.common, roots=roots, caller_paths=(repo.common,), state_dirs=roots)
    except GitError:
        raise WorktreeError(f"agent(): isolation 'worktree': the repository {repo.top} has no commits yet") from None
    return repo


CREATE = '''start=$(git rev-parse --verify --quiet "$SB_BASE^{commit}") || { echo "no-base" >&2; exit 3; }
git worktree add --quiet -b "$SB_BRANCH" "$SB_PATH" "$start"
echo "start $start"
head -c 4096 "$SB_PATH/.git"
'''


async def create(cwd: str, root: Path, run_id: str, n: int, base: str | None, *, git: SandboxedGit,
                 roots: Sequence[str], keep: bool, adopt: Callable[[str | os.PathLike[str]], None] | None = None) -> Worktree:
    repo = await repository(cwd, git=git, roots=roots)
    path = root / str(n)
    branch = f"swarmbase/{run_id}/{n}"
    record = root / f"{n}.json"
    async with _lock(repo.common):
        await trio.to_thread.run_sync(partial(root.mkdir, parents=True, exist_ok=True, mode=0o700))
        await trio.to_thread.run_sync(partial(path.mkdir, mode=0o700, exist_ok=True))
        if adopt is not None:
            adopt(path)
        info = {"repo": repo.top, "common": repo.common, "path": str(path), "branch": branch, "keep": keep,
                "gitdir": None, "base": None, "roots": list(roots)}
        fsutil.write_json(record, info)
        checks = dict(roots=roots, caller_paths=(repo.common,), state_dirs=(str(path), *roots))
        try:
            out = await git.run(CREATE, common=repo.common, cwd=str(path), write=(str(path),),
                                env={"SB_BASE": base or "HEAD", "SB_BRANCH": branch, "SB_PATH": str(path)}, **checks)
        except GitError as e:
            record.unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)
            if "no-base" in str(e):
                raise WorktreeError(f"agent(): opts.base {base!r} is not a commit of {repo.top}") from None
            raise WorktreeError(f"agent(): isolation 'worktree': git worktree add failed: {e}") from None
    start, gitdir = _parse_created(out, repo.common)
    info.update(gitdir=gitdir, base=start)
    fsutil.write_json(record, info)
    return Worktree(repo=repo.top, path=str(path), cwd=os.path.join(str(path), repo.rel) if repo.rel else str(path),
                    gitdir=gitdir, common=repo.common, branch=branch, base=start, record=str(record),
                    roots=tuple(roots))


def _parse_created(out: str, common: str) -> tuple[str, str]:
    start = gitdir = ""
    for line in out.splitlines():
        if line.startswith("start "):
            start = line[6:].strip()
        elif line.startswith("gitdir:"):
            gitdir = os.path.normpath(line[7:].strip())
    admin = os.path.join(common, "worktrees")
    if not start or os.path.dirname(gitdir) != admin or os.path.basename(gitdir) in ("", ".", ".."):
        raise WorktreeError("agent(): isolation 'worktree': git made the worktree somewhere unexpected")
    return start, gitdir


# Commits what is in the worktree onto the branch, from a fresh index; never reads the
# worktree's .git, its admin dir's HEAD or index. Then (unless kept) unregisters it, even
# when the commit failed, so the user's repository never keeps it checked out.
FINISH = '''set +e
(
  set -e
  tip=$(git rev-parse --verify --quiet "refs/heads/$SB_BRANCH^{commit}" || echo "$SB_BASE")
  export GIT_WORK_TREE="$SB_PATH" GIT_INDEX_FILE="$SB_INDEX"
  git read-tree "$tip"
  git add -A
  tree=$(git write-tree)
  commit=$tip
  if [ "$tree" != "$(git rev-parse "$tip^{tree}")" ]; then
    commit=$(git commit-tree "$tree" -p "$tip" -m "$SB_MESSAGE")
  fi
  git update-ref "refs/heads/$SB_BRANCH" "$commit"
  echo "commit $commit"
  git diff-tree -r --name-only "$tip" "$commit" | sed 's/^/changed /'
  [ "$commit" = "$SB_BASE" ] || git diff --shortstat "$SB_BASE" "$commit" | sed 's/^/stat /'
) 2>&1
echo "status $?"
if [ "$SB_KEEP" != 1 ]; then
  rm -rf "$SB_ADMIN" && git worktree prune && echo removed
fi
'''


async def finish(wt: Worktree, n: int, label: str, keep: bool, *, git: SandboxedGit) -> JsonObject:
    """Commit what the agent changed on its branch, remove the worktree (unless kept);
    what it did, for the agent's record. WorktreeError if the commit failed (the worktree
    is removed all the same) or git could not run at all (then its record stays, and the
    next boot tries again)."""
    who = f"SwarmBase agent {n}"
    env = {"SB_BRANCH": wt.branch, "SB_PATH": wt.path, "SB_INDEX": "@AGENT_DIR@/index", "SB_BASE": wt.base,
           "SB_MESSAGE": f"{who}: {label}"[:200], "SB_KEEP": "1" if keep else "0", "SB_ADMIN": wt.gitdir,
           "GIT_AUTHOR_NAME": who, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL, "GIT_COMMITTER_NAME": who,
           "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL}
    async with _lock(wt.common):
        try:
            out = await git.run(FINISH, common=wt.common, cwd=wt.path, write=(wt.path,), env=env, roots=wt.roots,
                                caller_paths=(wt.common,), state_dirs=(wt.path, *wt.roots))
        except GitError as e:
            raise WorktreeError(str(e)) from None
        done = finished(out)
        if keep or done["removed"]:
            if not keep:
                await trio.to_thread.run_sync(shutil.rmtree, wt.path, True)
            if wt.record:
                await trio.to_thread.run_sync(partial(Path(wt.record).unlink, missing_ok=True))
    if done["error"] is not None:
        raise WorktreeError(f"the agent's work could not be committed: {done['error']}")
    return {"branch": wt.branch, "commit": done["commit"] or wt.base, "base": wt.base,
            "filesChanged": done["changed"], "diffStat": done["stat"] if done["changed"] else "", "repo": wt.repo}


def finished(out: str) -> JsonObject:
    """What FINISH printed: the commit, the files changed, the short stat, whether the
    worktree was unregistered, and the commit's error (None when it worked)."""
    done: JsonObject = {"commit": None, "changed": 0, "stat": "", "removed": False, "error": None}
    said: list[str] = []
    for line in out.splitlines():
        if line.startswith("commit "):
            done["commit"] = line[7:].strip()
        elif line.startswith("changed "):
            done["changed"] += 1
        elif line.startswith("stat "):
            done["stat"] = line[5:].strip()
        elif line.startswith("status "):
            if line[7:].strip() != "0":
                done["error"] = said[-1] if said else f"git exited with {line[7:].strip()}"
        elif line == "removed":
            done["removed"] = True
        elif line.strip():
            said.append(line.strip())
    return done


async def recover(run_dirs: Iterable[tuple[Path, str]], *, git: SandboxedGit) -> int:
    """At boot: every worktree a dead daemon left (its record still there) gets what its
    agent wrote committed on its branch, and is removed unless its run keeps work; so no
    branch stays checked out in the user's repository. `run_dirs`: (run dir, its caller),
    whose uid git runs as. Returns how many were cleaned."""
    cleaned = 0
    for run_dir, caller in run_dirs:
        root = run_dir / "worktrees"
        if not root.is_dir():
            continue
        for record in sorted(root.glob("*.json")):
            try:
                info = fsutil.read_json(record)
                n = int(record.stem)
                path = str(info["path"])
                if os.path.dirname(path) != str(root) or os.path.basename(path) != str(n):
                    raise ValueError("a worktree path outside its run's worktrees/")
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("worktree record %s is unreadable (%s); left as is", record, e)
                continue
            if not info.get("gitdir") or not await trio.to_thread.run_sync(os.path.isdir, str(info.get("common"))):
                shutil.rmtree(path, ignore_errors=True)       # never registered, or the repository is gone
                record.unlink(missing_ok=True)
                cleaned += 1
                continue
            wt = Worktree(repo=str(info.get("repo")), path=path, cwd=path, gitdir=str(info["gitdir"]),
                          common=str(info["common"]), branch=str(info["branch"]), base=str(info["base"]),
                          record=str(record), roots=tuple(str(r) for r in info.get("roots") or ()))
            try:
                done = await finish(wt, n, "left by a daemon that stopped uncleanly", bool(info.get("keep")),
                                    git=git.for_caller(caller))
                log.warning("worktree %s of %s: committed as %s and %s after an unclean stop", wt.branch, wt.repo,
                            done["commit"][:12], "kept" if info.get("keep") else "removed")
                cleaned += 1
            except WorktreeError as e:
                log.error("worktree %s of %s could not be cleaned up: %s", wt.branch, wt.repo, e)
    return cleaned
