"""A daemon whose think agents run in-process, for the tests that count its requests
(test_think_inproc, test_schema_requests): its config, its caller and the fake's view."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config

from .conftest import CLAUDE, Env, start_daemon, write_config
from .fakes.anthropic_api import FakeAnthropic

CANARY = "sk-ant-canary-" + secrets.token_hex(16)
CODEX = CLAUDE.parent / "codex"
SCHEMA = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}


def transcript(env: Env, run: Any, n: int) -> list[dict[str, Any]]:
    path = env.services.store.dir(run) / "agents" / str(n) / "transcript.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def think_daemon(nursery: trio.Nursery, root: Path, engines: dict[str, Any], **extra: Any) -> Env:
    """A daemon on root/state (kept across restarts) with one caller, alice, whose key file
    holds CANARY."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    key_file = root / "alice.key"          # outside the state dir: every file there is searched for it
    key_file.write_text(CANARY + "\n")
    key_file.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines=engines, caller_extra={
        "apiKeyFile": str(key_file), "maxProfile": "read", "defaultModels": {"codex": "gpt-5.5"}},
        perRunConcurrency=8, **extra)
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    return env


def claude_engine(url: str, in_daemon: bool = True) -> dict[str, Any]:
    if not CLAUDE.exists():
        pytest.fail(f"the Claude Code CLI is not installed at {CLAUDE}: run bash tests/install.sh")
    return {"claude": {"bin": str(CLAUDE), "baseUrl": url, "inProcessThink": in_daemon}}


def requests_for(api: FakeAnthropic, marker: str) -> list[dict[str, Any]]:
    return [r for r in api.requests if marker in r["prompt"]]
