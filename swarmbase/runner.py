"""The daemon's side of the script runner (sandbox/runner.mjs).

One Node child per run, in its own process group, under the permission model with fs
reads limited to the sandbox folder and nothing else granted. The script's hooks reach
the daemon as JSON lines; answers go back the same way. Two watchdogs: the runner's own
vm slice timeout (busy loops in script code), and pings answered from the runner's event
loop (anything that wedges the runner itself).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Mapping, Protocol

import attrs
import trio

from .launch.spec import LaunchSpec
from .procs import LineReader, group_process
from .spawn import Limits

SANDBOX_DIR = Path(__file__).resolve().parent.parent / "sandbox"
RUNNER = SANDBOX_DIR / "runner.mjs"
MAX_LOG_CHARS = 4000


class AgentCallError(Exception):
    """Raised by a ScriptHost to make agent() throw inside the script with this message."""


class ScriptHost(Protocol):
    # agent_begin (optional) runs synchronously in call order, before any other call is
    # read: what must follow the script's call order (numbering, journal keys) goes there.
    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any: ...
    def phase(self, title: str) -> None: ...
    def log(self, message: str) -> None: ...
    def meta(self, meta: Any) -> None: ...
    def budget_view(self) -> dict[str, Any]: ...


@attrs.frozen
class ScriptOutcome:
    ok: bool
    value: Any = None
    error: str | None = None
    line: int | None = None
    watchdog: bool = False


@attrs.frozen
class RunnerLimits:
    slice_ms: int = 5000
    ping_interval: float = 2.0
    pong_timeout: float = 10.0
    memory_mb: int = 512
    cpu_seconds: int | None = None


XCPU_CODES = (-signal.SIGXCPU, 128 + signal.SIGXCPU)   # killed by RLIMIT_CPU (directly, or under bwrap)


def node_argv(node: str | None = None, memory_mb: int | None = None) -> list[str]:
    node = node or shutil.which("node") or "node"
    heap = [f"--max-old-space-size={max(32, memory_mb * 3 // 4)}"] if memory_mb else []
    return [node, "--no-warnings", "--experimental-permission", *heap,
            f"--allow-fs-read={SANDBOX_DIR}", str(RUNNER)]


# Nothing from the daemon's environment: the permission model leaves env readable.
RUNNER_ENV = {"LANG": "C.UTF-8", "TZ": "UTC"}


def runner_spec(*, key: str, memory_mb: int, cpu_seconds: int, record: Mapping[str, Any],
                node: str | None = None, env: Mapping[str, str] | None = None) -> LaunchSpec:
    """A script runner as the launcher starts it: node and the sandbox dir readable,
    nothing else; no network; a hard data-segment limit (RLIMIT_DATA also bounds
    ArrayBuffers, which live outside V8's heap limit) and a CPU-time limit."""
    node = node or shutil.which("node") or "node"
    return LaunchSpec(argv=tuple(node_argv(node, memory_mb)), env=dict(env or RUNNER_ENV), cwd=str(SANDBOX_DIR),
                      key=key, dirs=(), read=(str(SANDBOX_DIR), os.path.dirname(os.path.realpath(node))),
                      network=False, limits=Limits(data_bytes=memory_mb * 1024 * 1024, cpu_seconds=cpu_seconds),
                      record=record)


class _Bridge:
    def __init__(self, proc: trio.Process, host: ScriptHost, limits: RunnerLimits) -> None:
        self.proc = proc
        self.host = host
        self.limits = limits
        self.send_lock = trio.Lock()
        self.outcome: ScriptOutcome | None = None
        self.last_pong = trio.current_time()
        self.done = trio.Event()
        self.stderr_tail = b""
        self.stderr_done = trio.Event()

    async def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        async with self.send_lock:
            assert self.proc.stdin is not None
            await self.proc.stdin.send_all(data)

    def finish(self, outcome: ScriptOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
        self.done.set()

    async def answer_agent(self, msg: dict[str, Any], ticket: Any) -> None:
        try:
            value = await self.host.agent(str(msg.get("prompt", "")), dict(msg.get("opts") or {}), ticket)
            reply = {"t": "reply", "id": msg["id"], "ok": True, "value": value}
        except AgentCallError as e:
            reply = {"t": "reply", "id": msg["id"], "ok": False, "error": str(e)}
        try:
            await self.send({"t": "budget", "budget": self.host.budget_view()})
            await self.send(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the runner is gone; read_loop reports why

    async def read_loop(self, nursery: trio.Nursery) -> None:
        assert self.proc.stdout is not None
        reader = LineReader(self.proc.stdout)
        async for raw in reader:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            t = msg.get("t")
            if t == "pong":
                self.last_pong = trio.current_time()
            elif t == "call" and msg.get("op") == "agent" and isinstance(msg.get("id"), int):
                if not isinstance(msg.get("opts", {}), dict) or not isinstance(msg.get("prompt", ""), str):
                    await self.send({"t": "reply", "id": msg["id"], "ok": False,
                                     "error": "agent(): malformed call on the bridge"})
                    continue
                begin = getattr(self.host, "agent_begin", None)
                try:
                    ticket = begin(str(msg.get("prompt", "")), dict(msg.get("opts") or {})) if begin else None
                except Exception as e:  # never let one call take the bridge down
                    await self.send({"t": "reply", "id": msg["id"], "ok": False, "error": f"agent(): {e}"})
                    continue
                nursery.start_soon(self.answer_agent, msg, ticket)
            elif t == "call":
                await self.send({"t": "reply", "id": msg.get("id"), "ok": False,
                                 "error": f"unknown bridge call {msg.get('op')!r}"})
            elif t == "phase":
                self.host.phase(str(msg.get("title", ""))[:500])
            elif t == "log":
                self.host.log(str(msg.get("message", ""))[:MAX_LOG_CHARS])
            elif t == "meta":
                self.host.meta(msg.get("meta"))
            elif t == "done":
                if msg.get("ok"):
                    self.finish(ScriptOutcome(ok=True, value=msg.get("value")))
                else:
                    line = msg.get("line")
                    self.finish(ScriptOutcome(ok=False, error=str(msg.get("error") or "script failed"),
                                              line=line if isinstance(line, int) else None,
                                              watchdog=bool(msg.get("watchdog"))))
                return
        if reader.overflowed:
            reason = "the script's output line was too long"
        else:
            await self.stderr_done.wait()
            detail = self.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
            reason = "the script runner exited unexpectedly" + (": " + " | ".join(detail) if detail else "")
        self.finish(ScriptOutcome(ok=False, error=reason))

    async def read_stderr(self) -> None:
        """Keep the last few KB of the runner's stderr, to explain a crash."""
        assert self.proc.stderr is not None
        try:
            while True:
                chunk = await self.proc.stderr.receive_some(4096)
                if not chunk:
                    return
                self.stderr_tail = (self.stderr_tail + chunk)[-4096:]
        finally:
            self.stderr_done.set()

    async def ping_loop(self) -> None:
        n = 0
        while True:
            await trio.sleep(self.limits.ping_interval)
            if trio.current_time() - self.last_pong > self.limits.pong_timeout:
                self.finish(ScriptOutcome(ok=False, watchdog=True, error=(
                    f"watchdog: the script runner did not answer for {self.limits.pong_timeout:g} s "
                    "(a busy loop?); it was killed")))
                return
            n += 1
            try:
                await self.send({"t": "ping", "n": n})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return


async def run_script(script: str, args: Any, host: ScriptHost, limits: RunnerLimits = RunnerLimits(),
                     argv: list[str] | None = None, record: Path | None = None, launcher: Any = None,
                     spec: LaunchSpec | None = None) -> ScriptOutcome:
    """Run one script to its end. Cancelling the caller kills the runner's whole group.
    With a launcher and a spec, the runner starts sandboxed through it; otherwise `argv`
    (or plain node) is started as a process group, recorded in `record` if given."""
    if launcher is not None and spec is not None and argv is None:
        starting = launcher.open(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 grace=0.5)
        cpu = spec.limits.cpu_seconds
    else:
        starting = group_process(argv or node_argv(), env=RUNNER_ENV, stdin=subprocess.PIPE,
                                 stderr=subprocess.PIPE, grace=0.5, record=record)
        cpu = limits.cpu_seconds
    async with starting as proc:
        bridge = _Bridge(proc, host, limits)
        if hasattr(host, "bridge"):
            host.bridge = bridge
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bridge.read_loop, nursery)
            nursery.start_soon(bridge.read_stderr)
            nursery.start_soon(bridge.ping_loop)
            try:
                await bridge.send({"t": "start", "script": script, "args": args, "budget": host.budget_view(),
                                   "sliceMs": limits.slice_ms, "memoryLimitMb": limits.memory_mb})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # node died at start; read_loop reports it
            await bridge.done.wait()
            nursery.cancel_scope.cancel()
        assert bridge.outcome is not None
        outcome = bridge.outcome
        if not outcome.ok and proc.returncode is None:
            with trio.move_on_after(1):
                await proc.wait()
        if not outcome.ok and proc.returncode in XCPU_CODES:
            outcome = ScriptOutcome(ok=False, error=f"the script exceeded its CPU limit of {cpu} s "
                                                    "(runnerCpuSeconds)")
        return outcome
