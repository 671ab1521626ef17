"""A daemon whose caller, alice, has projects (issue 28): shared by the project tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from swarmbase import config

from .conftest import CLAUDE, Env, git, give_to_sandbox, start_daemon, write_config

KEY = "sk-ant-project-0123456789"


def make_project(path: Path, marker: str, repo: bool = True) -> Path:
    """A project dir under tmp_path/roots, given to alice's uid (tmp_path/state)."""
    path.mkdir(parents=True)
    (path / "marker.txt").write_text(marker + "\n")
    (path / "src").mkdir()
    (path / "src" / "inner.txt").write_text(f"inner of {marker}\n")
    if repo:
        git(path, "init", "-q", "-b", "main")
        git(path, "add", "-A")
        git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    state = path.parent.parent / "state"
    state.mkdir(exist_ok=True)
    give_to_sandbox(path, state)
    return path


async def project_daemon(tmp_path: Path, nursery: trio.Nursery, api_url: str,
                         projects: dict[str, str] | None, caller_extra: dict[str, Any] | None = None) -> Env:
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    key_file = state / "alice.key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    extra: dict[str, Any] = {"apiKeyFile": str(key_file), "cwdRoots": [str(tmp_path / "roots")],
                             "maxProfile": "write"}
    if projects is not None:
        extra["projects"] = projects
    extra.update(caller_extra or {})
    path, tokens = write_config(state, callers=["alice"], caller_extra=extra,
                                engines={"claude": {"bin": str(CLAUDE), "baseUrl": api_url}})
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    return env


def said(reply: str) -> list[str]:
    """The words of what the agent's tool call returned (the fake answers "tool said: …")."""
    assert reply.startswith("tool said: "), reply
    return reply.removeprefix("tool said: ").split()
