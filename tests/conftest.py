"""Shared fixtures.

Rules for these tests: servers bind 127.0.0.1 port 0; every test has a hard timeout
(pytest-timeout, plus trio.fail_after where a test waits on the daemon); time logic runs
under MockClock with autojump; real processes (node, the daemon) are real.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import pytest
import trio

from swarmbase import config, daemon, identity
from swarmbase.runner import RUNNER, RunnerLimits


CLAUDE = Path(__file__).resolve().parent / ".tools" / "node_modules" / ".bin" / "claude"


@pytest.fixture
def claude_bin() -> str:
    """The real Claude Code CLI (installed by tests/install.sh); a missing one fails, never skips."""
    if not CLAUDE.exists():
        pytest.fail(f"the Claude Code CLI is not installed at {CLAUDE}: run bash tests/install.sh")
    return str(CLAUDE)


def give_to_sandbox(path: Path) -> Path:
    """A tree the test made (as root, in CI) handed to the sandbox user, as an operator
    gives a caller's cwdRoot to it: agents and worktree git write only what it may write."""
    user = identity.resolve(None)
    if user is not None:
        for p in [path, *path.rglob("*")]:
            os.chown(p, user.uid, user.gid, follow_symlinks=False)
    return path


def git(cwd: Path, *args: str) -> str:
    """The test's own git (as root) on a repository the sandbox user owns."""
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@attrs.define
class Env:
    state: Path
    tokens: dict[str, str]
    cfg: config.Config | None = None
    url: str = ""
    services: Any = None

    @property
    def ws(self) -> str:
        return self.url.replace("http://", "ws://") + "/mcpl"


def write_config(state: Path, callers: list[str] = ("alice", "bob"), caller_extra: dict[str, Any] | None = None,
                 **extra: Any) -> tuple[Path, dict[str, str]]:
    state.mkdir(parents=True, exist_ok=True)
    tokens = {}
    entries = []
    for name in callers:
        tok = secrets.token_hex(24)
        tokens[name] = tok
        (state / f"mcpl-{name}.token").write_text(tok)
        entries.append({"name": name, "tokenSha256": hashlib.sha256(tok.encode()).hexdigest(),
                        "maxActiveRuns": 3, "runUsdMax": 25, **(caller_extra or {})})
    cfg = {"port": 0, "callers": entries, **extra}
    path = state / "config.json"
    path.write_text(json.dumps(cfg))
    return path, tokens


@pytest.fixture
def env(tmp_path: Path) -> Env:
    path, tokens = write_config(tmp_path / "state")
    return Env(state=tmp_path / "state", tokens=tokens, cfg=config.load(path))


async def start_daemon(nursery: trio.Nursery, env: Env, **kw: Any) -> Env:
    url, services = await nursery.start(lambda task_status: daemon.serve(env.cfg, task_status=task_status, **kw))
    env.url, env.services = url, services
    return env


@pytest.fixture
async def running(env: Env, nursery: trio.Nursery) -> AsyncIterator[Env]:
    await start_daemon(nursery, env, limits=RunnerLimits(slice_ms=1000))
    yield env


def process_table() -> dict[int, tuple[int, str, bytes]]:
    """pid -> (ppid, state, cmdline) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        out[int(d.name)] = (int(rest[1]), rest[0], cmd)
    return out


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below `root`, however deep (sandboxes nest)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            if table[c][1] not in ("Z", "X"):
                out.append(c)
            stack.append(c)
    return out


def process_records(procs: Path) -> list[Path]:
    """Process records of runs (agents, runners): not a waiting warm spare's (its record
    says "spare": true until a run takes it; tests/test_spares.py)."""
    out = []
    for p in sorted(procs.iterdir()):
        if p.name.startswith("spare-"):
            try:
                if json.loads(p.read_text()).get("spare") is True:
                    continue
            except (OSError, ValueError):
                pass
        out.append(p)
    return out


def runner_pids() -> list[int]:
    """Live script-runner (node) processes started by this test process (under the
    sandbox they are grandchildren: bwrap, its init, then node)."""
    table = process_table()
    out = []
    for p in descendants(os.getpid()):
        argv = table[p][2].split(b"\0")
        if os.path.basename(argv[0]) != b"bwrap" and str(RUNNER).encode() in argv:
            out.append(p)
    return out


async def run_to_end(env: Env, script: str, caller: str = "alice", timeout: float = 60, **params: Any) -> Any:
    """Start a run through the supervisor and wait for it to end; returns the Run."""
    sup = env.services.supervisor
    run = sup.start(env.cfg.caller(caller), {"script": script, **params})
    live = sup.live.get(run.id)
    with trio.fail_after(timeout):
        if live is not None:
            await live.finished.wait()
    return run


def result_of(env: Env, run: Any) -> Any:
    text = env.services.store.result_text(run)
    return None if text is None else json.loads(text)


async def engine_daemon(tmp_path: Path, nursery: trio.Nursery, *, engines: dict[str, Any], key: str,
                        caller_extra: dict[str, Any] | None = None, **extra: Any) -> Env:
    """A daemon with one caller, alice: her key file (0600) holds `key`, her cwdRoots is
    tmp_path/roots, and `engines` are configured. Shared by the engine test modules."""
    state = tmp_path / "state"
    state.mkdir(parents=True)
    key_file = state / "alice.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    roots = tmp_path / "roots"
    roots.mkdir()
    path, tokens = write_config(state, callers=["alice"], engines=engines,
                                caller_extra={"apiKeyFile": str(key_file), "cwdRoots": [str(roots)],
                                              **(caller_extra or {})}, **extra)
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    return env


def agent_json(env: Env, run: Any, n: int) -> dict[str, Any]:
    """An agent's record as written to disk."""
    return json.loads((env.services.store.dir(run) / "agents" / str(n) / "agent.json").read_text())


async def start_cli_daemon(cfg_path: Path, env: dict[str, str] | None = None,
                           startup: list[str] | None = None, argv: list[str] | None = None,
                           cwd: Path | None = None) -> tuple[trio.Process, str]:
    """`python -m swarmbase` (or `argv`) on this config; returns the process and its MCPL
    URL. What it printed up to "listening" is appended to `startup` if given."""
    env = dict(env or os.environ, SWARMBASE_CONFIG=str(cfg_path))
    proc = await trio.lowlevel.open_process(argv or [sys.executable, "-m", "swarmbase"], env=env, cwd=cwd,
                                            stderr=subprocess.PIPE)
    buf = b""
    while b"listening on" not in buf:
        chunk = await proc.stderr.receive_some(4096)
        assert chunk, buf.decode()
        buf += chunk
    if startup is not None:
        startup.append(buf.decode(errors="replace"))
    url = re.search(rb"listening on (http://[\d.:]+)", buf).group(1).decode()
    return proc, url.replace("http", "ws") + "/mcpl"


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 4 MiB tmpfs mounted for the test (the tests run as root, in CI too)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def record_opened(launcher: Any) -> list[dict[str, Any]]:
    """From now on, the record (a runner's says "runner": true) of every process the
    daemon starts through `launcher`: its open() is the one door every child goes through."""
    opened: list[dict[str, Any]] = []
    real_open = launcher.open

    def recording_open(spec: Any, **kw: Any) -> Any:
        opened.append(dict(spec.record))
        return real_open(spec, **kw)
    launcher.open = recording_open
    return opened
