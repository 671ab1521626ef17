"""Running the same Workflow call through a SwarmBase daemon: a real `python -m swarmbase`
process whose claude engine is the real CLI against the deterministic model, driven over
MCPL with the `run` tool in Claude Code's call shape; the run's end notice, its status
(phases, log) and its result are read back through the tools.

Measured on the 2-core test machine: a SwarmBase agent is one sandboxed `claude -p`
(0.80 CPU-s for the CLI alone, median of 5 from RUSAGE_CHILDREN), so a run costs about its
agent count × 0.8 CPU-s; the daemon's own share is small (0.12 CPU-s for a 3-agent run).
One daemon serves every run of a suite.
"""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import trio

from swarmbase.client import HostClient, connect

from ..clidaemon import cli_daemon
from ..conftest import write_config
from .claude_code import CLAUDE

CALLER = "peer"
@attrs.frozen
class SwarmBaseRun:
    status: str                      # completed, failed, ... or "refused" (the run tool said no)
    result: Any
    error: str | None
    logs: list[str]
    run_id: str | None
    phases: list[dict[str, Any]]


@attrs.define
class SwarmBaseDaemon:
    """One MCPL connection to the daemon (a caller has one live session: a second connection
    would replace the first), shared by every run; tool calls on it may overlap."""
    host: HostClient
    state: Path
    roots: Path
    pid: int = 0                     # the daemon process's (bench/ reads its own CPU)

    async def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.host.tool(name, arguments)

    async def run(self, call: dict[str, Any], *, timeout: float = 300) -> SwarmBaseRun:
        h = self.host
        res = await h.tool("run", call)
        if res.get("isError"):
            return SwarmBaseRun("refused", None, res["content"][0]["text"], [], None, [])
        run_id = res["structuredContent"]["runId"]
        with trio.fail_after(timeout):
            await h.wait_notice(f"{run_id}:end")
        status = (await h.tool("status", {"runId": run_id, "logLines": 500}))["structuredContent"]
        result = None
        if status["status"] == "completed":
            text, offset = "", 0
            while offset is not None:
                page = (await h.tool("result", {"runId": run_id, "offset": offset}))["structuredContent"]
                text += page["text"]
                offset = page["nextOffset"]
            result = json.loads(text)
        return SwarmBaseRun(status=status["status"], result=result, error=status.get("error"),
                            logs=[line["message"] for line in status.get("log", [])], run_id=run_id,
                            phases=status.get("phases", []))


def config(state: Path, roots: Path, model_url: str, in_process_think: bool = True, project: Path | None = None,
           in_process_read: bool = False, **extra: Any) -> tuple[Path, str]:
    """`in_process_think`: think agents as requests made by the daemon (the default a user
    gets), else a `claude -p` each; `in_process_read`: read agents too (also the default a
    user gets, but the conformance suite compares the CLI's tools with the peer's)."""
    key = state / f"{CALLER}.key"
    state.mkdir(parents=True, exist_ok=True)
    key.write_text("sk-ant-peer-0000\n")
    key.chmod(0o600)
    roots.mkdir(parents=True, exist_ok=True)
    projects = {"projects": {"default": str(project)}} if project is not None else {}
    path, tokens = write_config(
        state, callers=[CALLER], engines={"claude": {"bin": str(CLAUDE), "baseUrl": model_url, "inProcessThink": in_process_think,
                                             "inProcessRead": in_process_read}},
        caller_extra={"apiKeyFile": str(key), "cwdRoots": [str(roots)], "maxProfile": "write",
                      "maxActiveRuns": 100, "runUsdMax": 100, "runUsdDefault": 20, **projects}, **extra)
    return path, tokens[CALLER]


@asynccontextmanager
async def swarmbase_daemon(base: Path, model_url: str, *, launcher: tuple[str, ...] = (), in_process_think: bool = True,
                           project: Path | None = None, in_process_read: bool = False,
                           **extra: Any) -> AsyncIterator[SwarmBaseDaemon]:
    """A daemon process on a fresh state dir under `base`, its caller `peer` allowed to read
    and write under base/roots; `launcher`: a command it is started under (its argv
    appended, and it must exec it: the pid is the daemon's), e.g. one that enters a cgroup;
    `project`: the caller's default project (under base/roots), as a resident configures it."""
    state, roots = base / "state", base / "roots"
    path, token = config(state, roots, model_url, in_process_think, project, in_process_read, **extra)
    argv = [*launcher, sys.executable, "-m", "swarmbase"] if launcher else None
    async with cli_daemon(path, argv=argv) as d, connect(d.ws, token) as host:
        await host.handshake()
        yield SwarmBaseDaemon(host=host, state=state, roots=roots, pid=d.proc.pid)
