"""`python -m swarmbase` as a real process for tests, with its stderr drained all along
(a full pipe would block the daemon) and kept for assertions."""

from __future__ import annotations

import json
import secrets
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import trio

from swarmbase.client import connect

from .conftest import start_cli_daemon, write_config
from .fakes import fake_claude


def fake_cli_config(tmp_path: Path, callers: tuple[str, ...] = ("alice",), modes: dict[str, int | None] | None = None,
                    **extra: Any) -> tuple[Path, dict[str, str]]:
    """A config for `python -m swarmbase` on tmp_path/state with the fake claude CLI. Every
    caller's key file is <state>/<name>.key, mode 0600 unless `modes` says otherwise
    (None: the file is not there)."""
    (tmp_path / "bin").mkdir()
    cli = fake_claude.install(tmp_path / "bin")
    state = tmp_path / "state"
    state.mkdir()
    path, tokens = write_config(state, callers=list(callers), engines={"claude": {"bin": str(cli)}}, **extra)
    cfg = json.loads(path.read_text())
    for c in cfg["callers"]:
        key = state / f"{c['name']}.key"
        mode = (modes or {}).get(c["name"], 0o600)
        if mode is not None:
            key.write_text(f"sk-{c['name']}-key-{secrets.token_hex(8)}")
            key.chmod(mode)
        c["apiKeyFile"] = str(key)
    path.write_text(json.dumps(cfg))
    return path, tokens


def held_fan_out(tmp_path: Path, agents: int, quick: int) -> tuple[Path, Path, dict[str, str], Path, str]:
    """A daemon config (fake claude, alice with a key) and a script fanning out `agents`
    agents of which the first `quick` end at once and the rest wait on the `hold` file.
    Without the sandbox: the fake waits on a host file (test_crash_only covers kill -9 under it).
    Returns (state dir, config path, tokens, hold file, script)."""
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "bin").mkdir()
    cli = fake_claude.install(tmp_path / "bin")
    key = state / "alice.key"
    key.write_text("sk-test-kill9-key")
    key.chmod(0o600)
    path, tokens = write_config(state, callers=["alice"], engines={"claude": {"bin": str(cli)}},
                                caller_extra={"apiKeyFile": str(key)}, sandbox="none")
    hold = tmp_path / "hold"
    hold.write_text("")
    script = (f"return await parallel(Array.from({{length: {agents}}}, (_, i) => () => "
              f"agent(i < {quick} ? 'noop ' + i : 'waitfile:' + args.hold + ' ' + i, {{ label: 'a' + i }})))")
    return state, path, tokens, hold, script


@attrs.define
class CliDaemon:
    proc: trio.Process
    ws: str
    stderr: bytearray


@asynccontextmanager
async def cli_daemon(cfg_path: Path, env: dict[str, str] | None = None, argv: list[str] | None = None,
                     cwd: Path | None = None) -> AsyncIterator[CliDaemon]:
    """The daemon until the block ends (then SIGTERM, then kill); `stderr` holds all it
    printed, start-up included."""
    startup: list[str] = []
    with trio.fail_after(120):
        proc, ws = await start_cli_daemon(cfg_path, env, startup, argv, cwd)
    d = CliDaemon(proc, ws, bytearray("".join(startup).encode()))     # from its first line on
    try:
        async with trio.open_nursery() as n:
            async def drain() -> None:
                while chunk := await proc.stderr.receive_some(65536):
                    d.stderr.extend(chunk)
            n.start_soon(drain)
            try:
                yield d
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(15):
                    await proc.wait()
                n.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def run_script(ws: str, token: str, script: str, timeout: float = 150, **params: Any) -> Any:
    with trio.fail_after(timeout):
        async with connect(ws, token) as h:
            await h.handshake()
            rid = (await h.tool("run", {"script": script, **params}))["structuredContent"]["runId"]
            notice = await h.wait_notice(f"{rid}:end")
            res = await h.tool("result", {"runId": rid})
    text = res["structuredContent"]["text"]
    return rid, notice, json.loads(text) if text else None
