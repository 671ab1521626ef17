"""Read agents inside the daemon (issue 33 item 1): the model loop of a claude `read` agent is
the daemon's own (engines/think_run.py's, with tools), and its Read, Grep and Glob calls run
in a tool host (toolhost/read_host.py) started under the agent's confinement.

Why: a read agent through its CLI is a sandboxed `claude -p` (~1 CPU-s and ~40 MB PSS per
agent) whose work is a few model requests and file reads. Here the requests are the
daemon's (one pooled client, the budget checked as each reply streams, the CLI's stream-json
shapes in the transcript), and the only process is a small Python host.

Confinement is the CLI's, so a file is never opened with the daemon's privileges: the host
is a child of the caller (`owner`: a root daemon runs it as the caller's uid), sees only
the agent's cwd (and a worktree's repository) besides its interpreter, has no network at
all (the CLI's own network is for its model API, and here the daemon makes those
requests), no secret in its environment, and applies the profile's path rules
(engines/read_tools.read_rules, the CLI's deny rules) before it opens anything. It starts
at the agent's first tool call (an agent that reads nothing starts no process) and is
killed with its group when the agent ends or is cancelled.

What differs from the CLI: the tools offered are Read, Grep and Glob (not WebFetch and
WebSearch), the system prompt is a short one naming them and the cwd (not Claude Code's),
and Grep's patterns are Python `re`. The journal key does not depend on the path (it is
built from the call, runs/agents.py), so a run resumes across `inProcessRead` either way.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from contextlib import AsyncExitStack
from typing import Any

import trio

import swarmbase

from ..config import Config
from ..launch.procs import LineReader
from ..launch.spec import LaunchSpec, ProcessOpener
from ..launch.spawn import Child
from . import read_tools
from .base import AgentIO, AgentJob
from .think_run import ClaudeThink, Conversation
from .verdict import Verdict

HOST_MODULE = "swarmbase.toolhost.read_host"
ANSWER_MAX = 8 * 1024 * 1024       # bytes of one answer line; the host cuts results well below
SYSTEM = ("You are an agent for a workflow script. You may read files with the {tools}; you cannot "
          "change anything. File paths given to the tools must be absolute. Your working directory is {cwd}.")


def system_prompt(job: AgentJob, names: list[str]) -> str:
    """The read agent's note (its tools, its cwd), after a project agent type's body."""
    tools = "no tools" if not names else (f"{names[0]} tool" if len(names) == 1 else
                                          ", ".join(names[:-1]) + f" and {names[-1]} tools")
    note = SYSTEM.format(tools=tools, cwd=job.cwd)
    return f"{job.system_prompt}\n\n{note}" if job.system_prompt else note


@functools.cache
def host_argv() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The host's argv and what it needs mounted: the base interpreter (not a venv's link to
    it) with its standard library, and the swarmbase package alone, put first on sys.path.
    `-I`: neither the environment nor the cwd (the agent's work dir, which anyone may fill)
    can put a module ahead of the package; `-S`: no site-packages (the host imports only the
    standard library and the package; `site` with an editable install's finder was ~45 ms
    of a start); `-B`: no bytecode written."""
    python = os.path.realpath(sys.executable)
    package = os.path.dirname(os.path.realpath(swarmbase.__file__))
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(package)!r}); "
            f"from {HOST_MODULE} import main; main()")
    mounts = [os.path.realpath(sys.base_prefix), os.path.dirname(python), package]
    return (python, "-I", "-S", "-B", "-c", code), tuple(p for p in dict.fromkeys(mounts) if p not in ("/", ""))


def host_spec(job: AgentJob, cfg: Config) -> LaunchSpec:
    """The tool host's launch: the read agent's mounts, identity and launch-time checks, no
    network and no secret."""
    argv, mounts = host_argv()
    return LaunchSpec(argv=argv, env={"LANG": "C.UTF-8"},
                      cwd=job.cwd, key=f"{job.key}-tools", dirs=(), read=(job.cwd, *job.extra_read, *mounts),
                      network=False, owner=job.caller, state_dirs=job.state_dirs, cwd_roots=job.cwd_roots,
                      caller_paths=job.caller_paths, idle_timeout=cfg.agentIdleTimeoutMs / 1000,
                      record={"runId": job.run_id, "n": job.n, "engine": "claude", "tools": "read"})


def offered(disallowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """Read, Grep and Glob but what agent({disallowedTools}) names (those are not offered)."""
    return [t for t in read_tools.TOOL_SCHEMAS if t["name"] not in disallowed]


class HostRefused(Exception):
    """The tool host could not be started (the launch-time checks refused it, or the
    interpreter is missing): the agent fails saying why, as a CLI agent whose process could
    not start does, rather than the model being told its tools broke."""


class HostTools:
    """A Toolbox whose calls go to one agent's tool host, started at the first call and
    stopped (its group killed) when `stack` closes."""

    def __init__(self, opener: ProcessOpener, spec: LaunchSpec, setup: dict[str, Any],
                 schemas: list[dict[str, Any]], stack: AsyncExitStack) -> None:
        self.opener = opener
        self.spec = spec
        self.setup = setup
        self.schemas = schemas
        self.stack = stack
        self._proc: Child | None = None
        self._lines: LineReader | None = None
        self._broken: str | None = None

    async def _start(self) -> Child:
        if self._proc is None:
            try:
                proc = await self.stack.enter_async_context(
                    self.opener.open(self.spec, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, grace=0.2))
            except OSError as e:         # LaunchRefused is a PermissionError
                raise HostRefused(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")) from None
            assert proc.stdin is not None and proc.stdout is not None
            self._proc, self._lines = proc, LineReader(proc.stdout, max_line=ANSWER_MAX)
            await proc.stdin.send_all(json.dumps(self.setup).encode() + b"\n")
        return self._proc

    async def answer(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The calls sent at once (the model's parallel calls), answered in order."""
        answers: dict[str, dict[str, Any]] = {}
        if self._broken is None:
            try:
                answers = await self._exchange(calls)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ValueError) as e:
                self._broken = f"{type(e).__name__}: {e}"
        out = []
        for i, call in enumerate(calls):
            got = answers.get(str(i))
            if got is None:
                why = self._broken or "it gave no answer"
                got = {"content": f"<tool_use_error>the tool host failed ({why})</tool_use_error>", "is_error": True}
            out.append({"type": "tool_result", "tool_use_id": call.get("id"), "content": str(got.get("content")),
                        **({"is_error": True} if got.get("is_error") else {})})
        return out

    async def _exchange(self, calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        proc = await self._start()
        assert proc.stdin is not None and self._lines is not None
        lines = b"".join(json.dumps({"id": str(i), "name": c.get("name"), "input": c.get("input")}).encode() + b"\n"
                         for i, c in enumerate(calls))
        await proc.stdin.send_all(lines)
        answers: dict[str, dict[str, Any]] = {}
        while len(answers) < len(calls):
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                self._broken = "it ended" if not self._lines.overflowed else "its answer was too long"
                break
            got = json.loads(line)
            if isinstance(got, dict):
                answers[str(got.get("id"))] = got
        return answers


class ClaudeRead(ClaudeThink):
    """A claude read agent whose model loop is the daemon's and whose tools run in a host
    started through `opener` (this machine's launcher)."""

    def __init__(self, cfg: Config, opener: ProcessOpener) -> None:
        super().__init__(cfg)
        self.opener = opener
        self.user_home = os.path.expanduser("~")     # whose credential dirs the rules deny, as the CLI's

    def takes(self, job: AgentJob, io: AgentIO) -> bool:
        """A read agent on this machine, while the config says so (read at each agent: a
        reload applies to the next one). An agent placed elsewhere runs its CLI there."""
        engine = self.cfg.engines.claude
        return (engine is not None and engine.inProcessRead and job.profile == "read"
                and io.launcher.on_daemon_host)

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        engine = self.cfg.engines.claude
        assert engine is not None
        rules = read_tools.read_rules(job.cwd, str(self.cfg.state_dir), self.user_home, job.secret_files)
        async with AsyncExitStack() as stack:
            schemas = offered(job.disallowed_tools)
            names = [t["name"] for t in schemas]
            setup = {"rules": rules.to_json(), "cwd": job.cwd, "tools": names}
            tools = HostTools(self.opener, host_spec(job, self.cfg), setup, schemas, stack)
            system = system_prompt(job, names)
            try:
                return await self.converse(job, io, Conversation(tools=tools, system=system,
                                                                 max_turns=engine.readMaxTurns, max_turns_error=True))
            except HostRefused as e:
                u = io.usage
                return Verdict(ok=False, error=f"could not start the read agent's tool host: {e}",
                               cost_usd=u.cost_usd, tokens=u.tokens, tokens_exact=u.exact or u.responses == 0)
