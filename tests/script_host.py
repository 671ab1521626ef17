"""A ScriptHost stand-in for the real Node runner's tests (no daemon, no agents).

agent() answers by prompt: after `delays[prompt]` seconds (default 0); prompts starting
with "throw" raise AgentCallError, with "null" answer null; prompts in `replayed` are
answered at once from agent_begin (as a journal replay would be); prompts in `gates` wait
for that event. Everything the script did is recorded.
"""

from __future__ import annotations

import sys
from typing import Any

import trio

from swarmbase.script.host import ScriptHostBase
from swarmbase.script.runner import (
    AgentCallError,
    Answered,
    RunnerLimits,
    ScriptOutcome,
    node_argv,
    run_script,
)


class Host(ScriptHostBase):
    def __init__(self, delays: dict[str, float] | None = None, replayed: dict[str, Any] | None = None,
                 settle_before_spawn: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []   # agent() calls that reached the host
        self.begun: list[str] = []                           # every call, in the script's call order
        self.phases: list[str] = []
        self.logs: list[str] = []
        self.workflows: list[tuple[Any, Any, dict[str, Any], Any]] = []
        self.cancelled: list[tuple[list[Any], str]] = []
        self.finished: list[str] = []
        self.spawned: list[str] = []
        self.delays = delays or {}
        self.replayed = replayed or {}
        self.settle_before_spawn = settle_before_spawn
        self.gates: dict[str, trio.Event] = {}
        self.reached: dict[str, trio.Event] = {}
        self.live = 0
        self.max_live = 0
        self.spent = 0.0
        self.token_target: int | None = None      # budget.total as the script sees it
        self.output_tokens = 0                    # budget.spent(): 10 per finished agent
        self.max_agents = 1000
        self.bridge: Any = None

    def attach(self, bridge: Any) -> None:
        self.bridge = bridge

    def agent_begin(self, prompt: str, opts: dict[str, Any]) -> Any:
        self.begun.append(prompt)
        if prompt in self.replayed:
            return Answered(self.replayed[prompt])
        return f"ticket:{prompt}"

    async def agent(self, prompt: str, opts: dict[str, Any], ticket: Any = None) -> Any:
        assert ticket == f"ticket:{prompt}"
        self.calls.append((prompt, opts))
        self.reached.setdefault(prompt, trio.Event()).set()
        if self.settle_before_spawn:
            # What the daemon does on resume: let replayed answers decide races first.
            await self.bridge.settle()
        self.spawned.append(prompt)
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        try:
            if prompt in self.gates:
                await self.gates[prompt].wait()
            await trio.sleep(self.delays.get(prompt, 0))
            if prompt.startswith("throw"):
                raise AgentCallError(f"budget exhausted at {prompt}")
            self.finished.append(prompt)
            if prompt.startswith("null"):
                return None
            self.spent += 0.25
            self.output_tokens += 10
            return f"<{prompt}>"
        finally:
            self.live -= 1

    def workflow_begin(self, source: Any, args: Any, opts: dict[str, Any]) -> Any:
        self.begun.append(f"workflow:{source if isinstance(source, str) else source['name']}")
        return f"wf-ticket:{len(self.workflows)}"

    async def workflow(self, source: Any, args: Any, opts: dict[str, Any], ticket: Any = None) -> Any:
        self.workflows.append((source, args, opts, ticket))
        name = source if isinstance(source, str) else source["name"]
        await trio.sleep(self.delays.get(name, 0))
        if name.startswith("throw"):
            raise AgentCallError(f"workflow refused: {name}")
        self.finished.append(name)
        return {"ran": name, "args": args}

    def calls_cancelled(self, tickets: list[Any], reason: str) -> None:
        self.cancelled.append((list(tickets), reason))

    def cancelled_prompts(self) -> list[str]:
        return sorted(str(t).split(":", 1)[1] for tickets, _ in self.cancelled for t in tickets)

    def phase(self, title: str) -> None:
        self.phases.append(title)

    def log(self, message: str) -> None:
        self.logs.append(message)

    def budget_view(self) -> dict[str, Any]:
        return {"usd": {"total": 5.0, "spent": self.spent, "reserved": 0.0, "remaining": 5.0 - self.spent},
                "codex": None, "target": self.token_target, "outputTokens": self.output_tokens,
                "agents": len(self.calls), "maxAgents": self.max_agents}


def argv_with(env: dict[str, str] | None = None, data_limit_mb: int | None = None,
              node_flags: list[str] | None = None) -> list[str]:
    """The runner's argv with an environment variable, an RLIMIT_DATA (what the daemon's
    launcher sets) or extra node flags, applied by a small exec wrapper."""
    argv = node_argv()
    if node_flags:
        argv = argv[:1] + node_flags + argv[1:]
    if data_limit_mb is not None:
        limit = data_limit_mb * 1024 * 1024
        wrapper = ("import os, resource, sys\n"
                   f"resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit}))\n"
                   "os.execv(sys.argv[1], sys.argv[1:])")
        argv = [sys.executable, "-c", wrapper, *argv]
    if env:
        argv = ["/usr/bin/env", *(f"{k}={v}" for k, v in env.items()), *argv]
    return argv


async def run(script: str, args: Any = None, host: Host | None = None, slice_ms: int = 2000,
              argv: list[str] | None = None) -> tuple[ScriptOutcome, Host]:
    host = host or Host()
    with trio.fail_after(30):
        out = await run_script(script, args, host, RunnerLimits(slice_ms=slice_ms), argv=argv)
    return out, host
