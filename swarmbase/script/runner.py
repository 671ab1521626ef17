"""The daemon's side of the script runner (sandbox/runner.mjs): how it is started.

One Node child per run, in its own process group, under the permission model with fs
reads limited to the sandbox folder and nothing else granted. The script's hooks reach
the daemon as JSON lines; answers go back the same way. Two watchdogs: the runner's own
vm slice timeout (busy loops in script code), and pings answered from the runner's event
loop (anything that wedges the runner itself).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import trio

from ..launch.procs import group_process
from ..launch.spawn import Child, Limits
from ..launch.spec import LaunchSpec, ProcessOpener
from .bridge import MAX_LOG_CHARS, MEMORY_ERROR, OOM_MARKERS, _Bridge  # noqa: F401  (the runner's public face)
from .host import AgentCallError, Answered, ProbeError, RunnerLimits, ScriptHost, ScriptOutcome  # noqa: F401

def sandbox_dir(package: Path = Path(__file__).resolve().parent.parent) -> Path:
    """Where runner.mjs and its modules are: inside the package when installed from a wheel
    (pyproject.toml maps sandbox/ to swarmbase/_sandbox/), else the checkout's sandbox/
    beside the package (editable installs, PYTHONPATH). Only files are looked at, never
    the import system: an editable install's finder would point at its own checkout."""
    packaged = package / "_sandbox"
    return packaged if (packaged / "runner.mjs").is_file() else package.parent / "sandbox"


SANDBOX_DIR = sandbox_dir()
RUNNER = SANDBOX_DIR / "runner.mjs"
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


async def run_script(script: str, args: Any, host: ScriptHost, limits: RunnerLimits = RunnerLimits(),
                     argv: list[str] | None = None, record: Path | None = None, launcher: ProcessOpener | None = None,
                     spec: LaunchSpec | None = None,
                     opened: AbstractAsyncContextManager[Child] | None = None) -> ScriptOutcome:
    """Run one script to its end. Cancelling the caller kills the runner's whole group.
    `opened`: a runner already started from `spec` (a warm spare's `use()`), else with a
    launcher and a spec the runner starts sandboxed through it; otherwise `argv` (or plain
    node) is started as a process group, recorded in `record` if given."""
    if opened is not None and spec is not None:
        starting = opened
        cpu = spec.limits.cpu_seconds
    elif launcher is not None and spec is not None and argv is None:
        starting = launcher.open(spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 grace=0.5)
        cpu = spec.limits.cpu_seconds
    else:
        starting = group_process(argv or node_argv(), env=RUNNER_ENV, stdin=subprocess.PIPE,
                                 stderr=subprocess.PIPE, grace=0.5, record=record)
        cpu = limits.cpu_seconds
    async with starting as proc:
        bridge = _Bridge(proc, host, limits)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bridge.write_loop)
            nursery.start_soon(bridge.read_loop, nursery)
            nursery.start_soon(bridge.read_stderr)
            nursery.start_soon(bridge.ping_loop)
            try:
                # No args (None) reaches the script as undefined, as in Claude Code.
                await bridge.send({"t": "start", "script": script, **({"args": args} if args is not None else {}),
                                   "budget": host.budget_view(), "sliceMs": limits.slice_ms,
                                   "memoryLimitMb": limits.memory_mb})
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
