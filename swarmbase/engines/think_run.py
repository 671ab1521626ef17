"""Agents that need no tools run inside the daemon (issue 23): a claude `think` agent is one
streamed Messages API request the daemon makes itself (engines/think_messages.py), a codex
one a Responses API request (engines/think_codex.py). Both are Engines, so the agent
service's caps, budgets, schema nudges, records, journal and cancel scope are the ones a
CLI agent has; engines/think_route.py picks them for think agents.

Why: a think agent through its CLI is a sandboxed process start (~1 CPU-s and a few hundred
MB for `claude -p`) to make one HTTP request. Here it is that request: no process, so no
sandbox is needed (nothing runs that could touch a file or the network beyond the one
request to the engine's own API, with the caller's key, as the CLI would make it).

The lifecycle of one turn: stream the request (engines/think_http.py: the CLIs' retries),
keep the live usage current (input from message_start, output from message_delta or the
streamed text / 4 meanwhile) and priced from the model's row, stop the stream when that
crosses the agent's USD reservation (as the meter does for codex), write the CLI's
stream-json shapes to the transcript, and judge the outcome with the CLI's own rules
(engines/claude.py). Cost is exact when every response reported its final usage, else an
estimate from what streamed, marked so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import attrs
import httpx

from .. import money, prices
from ..config import Config
from ..prices import Tokens
from . import claude, think_http
from . import think_messages as tm
from .base import AgentIO, AgentJob
from .bearer_relay import ssl_context
from .verdict import Verdict

CLAUDE_RETRIES = 2        # the claude engine sets CLAUDE_CODE_MAX_RETRIES=2 for its CLI


def client(cfg: Config) -> httpx.AsyncClient:
    """One pooled client for the daemon's think agents; its read timeout is the idle watchdog."""
    idle = cfg.agentIdleTimeoutMs / 1000
    return httpx.AsyncClient(verify=ssl_context(), timeout=httpx.Timeout(30, read=idle),
                             limits=httpx.Limits(max_connections=max(64, cfg.maxConcurrentAgents * 2),
                                                 max_keepalive_connections=32))


def emitter(io: AgentIO, feed: Callable[[Any], None]) -> Callable[[dict[str, Any]], None]:
    def emit(event: dict[str, Any]) -> None:
        io.transcript(json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode())
        feed(event)
    return emit


def retry_line(attempt: int, retries: int, status: int | None, why: str, delay: float) -> dict[str, Any]:
    """The CLI's `system/api_retry` event."""
    kind = ("rate_limit" if status == 429 else "overloaded" if status == 529 else
            "server_error" if status and status >= 500 else "unknown")
    return {"type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": retries,
            "retry_delay_ms": int(delay * 1000), "error_status": status, "error": kind, "detail": why[:300]}


@attrs.define
class Turn:
    """What one agent turn (its requests) has used; live usage is done + the reply streaming."""
    row: Any
    done: Tokens = attrs.Factory(Tokens)
    responses: int = 0
    exact: bool = True

    def cost(self, tokens: Tokens) -> float:
        return prices.cost(tokens, self.row) if self.row is not None else 0.0


class InDaemon:
    """What both in-daemon engines hold: the config, and the pooled client (made at first use)."""

    def __init__(self, cfg: Config, http: httpx.AsyncClient | None = None) -> None:
        self.cfg = cfg
        self._http = http

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = client(self.cfg)
        return self._http

    async def aclose(self) -> None:
        """At the daemon's stop: its pooled connections closed, not left to the collector."""
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


class Toolbox(Protocol):
    """The tools an in-daemon claude agent is offered besides StructuredOutput, and who
    runs them: none for a think agent, Read/Grep/Glob in a tool host for a read agent
    (engines/read_run.py)."""

    @property
    def schemas(self) -> list[dict[str, Any]]: ...

    async def answer(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One tool_result block per tool_use block in `calls`, in order."""


class NoTools:
    schemas: list[dict[str, Any]] = []

    async def answer(self, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []


@attrs.frozen
class Conversation:
    """What differs between the in-daemon claude agents: the tools, the system prompt and
    how many requests one turn may make (`max_turns_error`: whether running out of them
    while the model still calls tools fails the agent, as the CLI's maxTurns does)."""
    tools: Toolbox = NoTools()
    system: str | None = None
    max_turns: int = tm.MAX_TURNS
    max_turns_error: bool = False


class ClaudeThink(InDaemon):
    """A claude think agent as Messages API requests from the daemon."""
    name = "claude"

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        return await self.converse(job, io, Conversation(system=job.system_prompt))

    async def converse(self, job: AgentJob, io: AgentIO, conv: Conversation) -> Verdict:
        engine = self.cfg.engines.claude
        assert engine is not None
        model = tm.model_name(job.model)
        turn = Turn(row=prices.row_for(job.model, self.cfg.prices))
        io.usage.priced = turn.row is not None
        io.started({})
        state = claude.StreamState()
        emit = emitter(io, state.feed)
        offered = conv.tools.schemas
        tools = [t["name"] for t in offered] + ([tm.TOOL_NAME] if job.schema is not None else [])
        emit({"type": "system", "subtype": "init", "model": model, "tools": tools, "cwd": job.cwd,
              "inProcess": True})
        headers = tm.headers(job.api_key, engine.baseUrl, job.run_id, job.n, job.label, job.effort)
        history: list[dict[str, Any]] = []
        enforced, requests = False, 0
        text: str | None = None
        structured: Any = None
        error: str | None = None
        status: int | None = None
        budget = tool_turn = False
        while requests < conv.max_turns:
            requests += 1
            body = json.dumps(tm.body(model, job.prompt, job.schema, job.effort, history, conv.system,
                                      offered)).encode()
            reply, out, cap = await self._request(job, io, turn, headers, body, emit)
            if reply.started:
                turn.responses += 1
                turn.done = turn.done + reply.tokens
                turn.exact = turn.exact and reply.complete
                content = reply.content()
                emit(tm.assistant_line(reply, content, model))
            else:
                content = []
            status = out.status if out.status and out.status > 0 else None
            if cap is not None:
                error, budget = cap, True
                break
            if out.error is not None:
                error = out.error if not reply.started else (
                    f"the model's stream broke mid-message ({out.error}); cost estimated from what streamed")
                break
            if reply.error is not None or not reply.complete:
                error = (f"the model's stream ended mid-message ({reply.error or 'no message_stop'}); "
                         "cost estimated from what streamed")
                break
            calls = tm.tool_calls(content) if offered else []
            if calls:
                results = await conv.tools.answer(calls)
                msg = {"role": "user", "content": results}
                emit({"type": "user", "message": msg, "inProcess": True})
                history += [{"role": "assistant", "content": content}, msg]
                tool_turn = True
                text = tm.last_text(content)
                continue
            tool_turn = False
            nxt = tm.after(content, job.schema, enforced)
            text = nxt.text
            if nxt.done:
                structured = nxt.structured
                break
            enforced = enforced or any(m.get("content", [{}])[0].get("type") == "text" for m in nxt.transcript)
            for m in nxt.transcript:
                emit({"type": "user", "message": m, "inProcess": True})
            history += nxt.follow_up
        # The turns ran out while the model still called tools: the CLI's error_max_turns.
        max_turns = conv.max_turns_error and tool_turn and error is None
        if max_turns:
            error = f"Reached maximum number of turns ({conv.max_turns})"
        cost = turn.cost(turn.done)
        emit(tm.result_line(model=model, tokens=turn.done, cost=cost, turns=requests, text=text,
                            structured=structured, error=error, budget=budget, status=status,
                            schema=job.schema is not None, max_turns=max_turns))
        verdict = claude.judge(state, job.schema)
        io.usage.tokens, io.usage.cost_usd = turn.done, cost
        io.usage.responses = turn.responses
        io.usage.exact = turn.exact
        return attrs.evolve(verdict, cost_usd=cost, tokens=turn.done, tokens_exact=turn.exact)

    async def _request(self, job: AgentJob, io: AgentIO, turn: Turn, headers: dict[str, str], body: bytes,
                       emit: Callable[[dict[str, Any]], None]) -> tuple[tm.Reply, think_http.Outcome, str | None]:
        """One request (with its retries), live usage kept current; the reply, the outcome, and
        why it was stopped if its streamed cost crossed the agent's cap."""
        engine = self.cfg.engines.claude
        assert engine is not None
        reply = tm.Reply()
        over: list[str] = []

        def begin() -> None:
            nonlocal reply
            if reply.started:             # a cut attempt about to be retried: what it streamed is spent
                turn.done = turn.done + reply.tokens
                turn.exact = False
            reply = tm.Reply()

        def on_event(data: Any) -> bool:
            reply.feed(data)
            live = turn.done + reply.tokens
            io.usage.tokens, io.usage.cost_usd = live, turn.cost(live)
            io.usage.responses = turn.responses + (1 if reply.started else 0)
            io.usage_changed()
            if turn.row is not None and io.usage.cost_usd > job.max_usd:
                over.append(f"Reached maximum budget ({money.usd(job.max_usd)})")
                return True
            return False

        def on_retry(attempt: int, status: int | None, why: str, delay: float) -> None:
            emit(retry_line(attempt, CLAUDE_RETRIES, status, why, delay))

        out = await think_http.stream(self.http(), tm.url(engine.baseUrl), headers, body, begin=begin,
                                      on_event=on_event, on_retry=on_retry, retries=CLAUDE_RETRIES,
                                      retry_sse_error=lambda d: isinstance(d, dict) and d.get("type") == "error",
                                      complete=lambda: reply.complete)
        return reply, out, over[0] if over else None
