"""Shared fixtures.

Rules for these tests: servers bind 127.0.0.1 port 0; every test has a hard timeout
(pytest-timeout, plus trio.fail_after where a test waits on the daemon); time logic runs
under MockClock with autojump; real processes (node, the daemon) are real.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import attrs
import pytest
import trio

from swarmbase import config, daemon, identity
from swarmbase.audit.render import audit_command
from swarmbase.script.runner import RUNNER, RunnerLimits

from .browser import chromium
from .fakes import fake_claude


CLAUDE = Path(__file__).resolve().parent / ".tools" / "node_modules" / ".bin" / "claude"
CODEX = Path(__file__).resolve().parent / ".tools" / "node_modules" / ".bin" / "codex"
FAKE_CLI_KEY = "sk-fake-key-0123456789abcdef"     # alice's key in fake_daemon
GATEWAY = "gw-canary-" + secrets.token_hex(16)    # alice's key in codex_daemon (a gateway token)


@pytest.fixture(autouse=True)
def collect_leaks_here() -> Iterator[None]:
    """A collection after every test, in its teardown: a ResourceWarning (an error, see
    pyproject.toml) for a file, socket or process left in a reference cycle is then
    reported against the test that leaked it, not whichever test the collector next runs
    in (which, under xdist, is an unrelated test on the same worker)."""
    yield
    gc.collect()


@pytest.fixture
def claude_bin() -> str:
    """The real Claude Code CLI (installed by tests/install.sh); a missing one fails, never skips."""
    if not CLAUDE.exists():
        pytest.fail(f"the Claude Code CLI is not installed at {CLAUDE}: run bash tests/install.sh")
    return str(CLAUDE)


@pytest.fixture
def codex_bin() -> str:
    """The real Codex CLI and the bubblewrap it runs in (tests/install.sh); fails, never skips."""
    if not CODEX.exists():
        pytest.fail(f"the Codex CLI is not installed at {CODEX}: run bash tests/install.sh")
    if not shutil.which("bwrap"):
        pytest.fail("bubblewrap is not installed: run bash tests/install.sh (Debian package bubblewrap)")
    return str(CODEX)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium (tests/browser.py), quit after the test."""
    with chromium() as driver:
        yield driver


def give_to_sandbox(path: Path, state: Path, caller: str = "alice") -> Path:
    """A tree the test made (as root, in CI) handed to the caller's uid, as an operator
    gives a caller's cwdRoot to it (its uid allocated ahead in the state dir, as the
    daemon's start-up does): agents and worktree git write only what that uid may write."""
    if os.geteuid() == 0:
        state.mkdir(parents=True, exist_ok=True)
        user = identity.Identities(state / identity.ALLOCATIONS, identity.UidRange.parse(identity.DEFAULT_UIDS)
                                   ).user_for(caller)
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
    for name, engine in (cfg.get("engines") or {}).items():
        # The suite's engine tests exercise the CLIs; think and read agents inside the daemon
        # (the defaults) are tests/test_think_inproc.py's and tests/test_read_inproc.py's,
        # which say inProcessThink / inProcessRead: true.
        if isinstance(engine, dict):
            engine.setdefault("inProcessThink", False)
            if name == "claude":
                engine.setdefault("inProcessRead", False)
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


def pty_env(**extra: str) -> dict[str, str]:
    """The environment for a child whose stdout is a pty the test sized: without COLUMNS
    and LINES, which would override the pty's size (pytest-xdist's workers have them set
    to 80x24)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**env, **extra}


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


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


def direct(messages: list[dict[str, Any]], env: dict[str, str] | None = None,
           until: Callable[[dict[str, Any]], bool] | None = None) -> list[dict[str, Any]]:
    """Speak the JSON-lines protocol to the runner directly (no daemon side). stdin stays
    open until a message satisfies `until` (closing it ends the runner)."""
    from swarmbase.script.runner import RUNNER_ENV, node_argv
    proc = subprocess.Popen(node_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**RUNNER_ENV, **(env or {})}, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        got = []
        if until is not None:
            for line in proc.stdout:
                got.append(json.loads(line))
                if until(got[-1]):
                    break
        proc.stdin.close()
        got += [json.loads(line) for line in proc.stdout if line.strip()]
        return got
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()
        proc.stdout.close()


def notice(i: int, pad: int = 0) -> dict[str, Any]:
    """A run-end notice as the outbox holds it, for run number i (`pad` characters of text more)."""
    return {"featureSet": "swarmbase.notify", "eventId": f"run_{i:012x}:end", "timestamp": "t",
            "origin": {"source": "swarmbase", "kind": "run-end", "runId": f"run_{i:012x}"},
            "tags": ["surface:done"], "payload": {"content": [{"type": "text", "text": f"n{i}" + "x" * pad}]}}


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


async def fake_daemon(tmp_path: Path, nursery: trio.Nursery, caller_extra: dict[str, Any] | None = None,
                      **extra: Any) -> Env:
    """The fast fake CLI (tests/fakes/fake_claude.py, installed in tmp_path/bin), without
    the sandbox (these tests are about the plumbing; the fake writes its dumps and
    grandchild pids into its cwd). Sandboxed agents: test_sandbox_policy.py."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    cli = fake_claude.install(bindir)
    extra.setdefault("sandbox", "none")
    return await engine_daemon(tmp_path, nursery, key=FAKE_CLI_KEY,
                               engines={"claude": {"bin": str(cli), "baseUrl": "http://127.0.0.1:9/gw"}},
                               caller_extra={"maxProfile": "write", **(caller_extra or {})}, **extra)


def spawns(tmp_path: Path) -> list[str]:
    """One line per fake CLI process started from tmp_path/bin (its spawn log)."""
    log = tmp_path / "bin" / "spawns.log"
    return log.read_text().splitlines() if log.exists() else []


def dumps(env: Env, run: Any) -> list[dict[str, Any]]:
    """What each fake CLI agent that ran `dump` saw (argv, environment), in start order."""
    work = env.services.store.work_dir(run)
    return [json.loads(p.read_text()) for p in sorted(work.glob("dump-*.json"), key=lambda p: p.stat().st_mtime)]


async def codex_daemon(tmp_path: Path, nursery: trio.Nursery, bin_path: str, base_url: str,
                       caller_extra: dict[str, Any] | None = None, sandbox: str = "bwrap",
                       engine_extra: dict[str, Any] | None = None, **extra: Any) -> Env:
    """The codex engine on `bin_path` through the meter to `base_url`, under bubblewrap."""
    return await engine_daemon(
        tmp_path, nursery, key=GATEWAY,
        engines={"codex": {"bin": bin_path, "baseUrl": base_url, "maxTokensDefault": 200_000,
                           "maxTokensMax": 300_000, **(engine_extra or {})}},
        caller_extra={"maxProfile": "read", "defaultModels": {"codex": "gpt-5.5"}, **(caller_extra or {})},
        sandbox=sandbox, **extra)


async def wait_agent(env: Env, run: Any, n: int, check: Callable[[Any], bool]) -> None:
    """Until agent n of a live run satisfies `check` (its AgentRecord)."""
    with trio.fail_after(30):
        while True:
            live = env.services.supervisor.live.get(run.id)
            if live and n in live.agents and check(live.agents[n]):
                return
            await trio.sleep(0.02)


async def wait_state(env: Env, run: Any, n: int, state: str) -> None:
    await wait_agent(env, run, n, lambda rec: rec.state == state)


async def wait_streamed(env: Env, run: Any, n: int) -> None:
    """Until running agent n's live figures (what status shows) count some tokens."""
    await wait_agent(env, run, n, lambda rec: rec.state == "running" and rec.row()["tokens"] > 0)


def agent_json(env: Env, run: Any, n: int) -> dict[str, Any]:
    """An agent's record as written to disk."""
    return json.loads((env.services.store.dir(run) / "agents" / str(n) / "agent.json").read_text())


def audit(state: Path, run_id: str) -> tuple[int, str]:
    """`swarmbase audit RUN` on a state dir: its exit code and what it printed."""
    out = io.StringIO()
    code = audit_command(state, run_id, False, out, out)
    return code, out.getvalue()


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
