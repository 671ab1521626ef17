"""A codex think agent as one Responses API request from the daemon (engines/think_run.py
says why; engines/think_responses.py what is sent). Its caps are the meter's: the agent's
token ceiling, and for a model with a price row its USD reservation, checked as the
response streams (input estimated from the request's size until the API reports usage);
the response is cut when either is crossed and what streamed is charged, marked estimated.
One request per turn, as `codex exec` makes for an agent without tools; a final message
that fails the schema goes to the agent service's schema nudges."""

from __future__ import annotations

import json
from typing import Any

from .. import money, prices
from ..prices import Tokens
from . import codex, think_http
from . import think_responses as tr
from .base import AgentIO, AgentJob
from .think_run import InDaemon, emitter, retry_line
from .verdict import Verdict

CODEX_RETRIES = 1         # the codex engine's CLI config: request_max_retries = 1


def over(tokens: Tokens, cost: float, priced: bool, max_tokens: int, max_usd: float) -> str | None:
    """The meter's rule (MeterAgent.over): a reason to stop, or None."""
    if tokens.total > max_tokens:
        return f"meter: token ceiling of {max_tokens:,} crossed ({tokens.total:,} tokens)"
    if priced and cost > max_usd:
        return f"meter: USD cap of {money.usd(max_usd)} crossed ({money.usd(cost)})"
    return None


class CodexThink(InDaemon):
    name = "codex"

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        engine = self.cfg.engines.codex
        assert engine is not None and engine.baseUrl
        row = prices.row_for(job.model, self.cfg.prices, engine="codex")
        io.usage.priced = row is not None
        io.started({})
        stream = codex.CodexStream()
        emit = emitter(io, stream.feed)
        body = json.dumps(tr.body(job.model, job.prompt, job.schema, job.effort, job.system_prompt)).encode()
        reply = tr.Reply(input_estimate=len(body) // 4)
        stop: list[str] = []

        def cost(t: Tokens) -> float:
            return prices.cost(t, row) if row is not None else 0.0

        def begin() -> None:
            nonlocal reply
            reply = tr.Reply(input_estimate=len(body) // 4)

        def on_event(data: Any) -> bool:
            reply.feed(data)
            t = reply.tokens
            io.usage.tokens, io.usage.cost_usd = t, cost(t)
            io.usage.responses = 1 if reply.started else 0
            io.usage_changed()
            reason = over(t, io.usage.cost_usd, row is not None, job.max_tokens, job.max_usd)
            if reason:
                stop.append(reason)
                return True
            return False

        def on_retry(attempt: int, st: int | None, why: str, delay: float) -> None:
            emit(retry_line(attempt, CODEX_RETRIES, st, why, delay))

        out = await think_http.stream(self.http(), tr.url(engine.baseUrl),
                                      tr.headers(job.api_key, job.run_id, job.n, job.label), body,
                                      begin=begin, on_event=on_event, on_retry=on_retry, retries=CODEX_RETRIES)
        error = stop[0] if stop else out.error
        if error is None and not reply.complete:
            error = reply.error or "the response stream ended before the response completed"
        if error is not None and reply.started and not reply.complete:
            error += "; cost estimated from what streamed"
        for ev in tr.exec_events(reply, error):
            emit(ev)
        tokens = reply.tokens
        exact = reply.complete and not stop
        io.usage.tokens, io.usage.cost_usd, io.usage.exact = tokens, cost(tokens), exact
        io.usage.responses = 1 if reply.started else 0
        common: dict[str, Any] = {"cost_usd": cost(tokens), "tokens": tokens, "tokens_exact": exact}
        if error is not None:
            return Verdict(ok=False, error=error, **common)
        v = codex.judge(stream, job.schema)
        return Verdict(ok=v.ok, value=v.value, error=v.error, text=v.text, schema_error=v.schema_error, **common)
