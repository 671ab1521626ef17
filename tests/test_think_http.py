"""The in-daemon think agents' HTTP side (engines/think_http.py) and their pure parts:
retries and their waits under MockClock (an httpx transport in the test's own task, so the
clock jumps only over the waits), the retry-after rules, the path choice, the reply state."""

from __future__ import annotations

import email.utils
import json

import httpx
import pytest
import trio
import trio.testing

from swarmbase.engines import think_http
from swarmbase.engines import think_messages as tm
from swarmbase.engines import think_responses as tr
from swarmbase.engines.base import AgentIO, AgentJob
from swarmbase.engines.think_route import ThinkRouter
from swarmbase.engines.verdict import Verdict

from .fakes.anthropic_api import message_events


def sse_reply(text: str) -> bytes:
    return b"".join(message_events("claude-opus-5-5", [{"type": "text", "text": text}], "end_turn", (10, 5)))


async def test_429_waits_as_retry_after_says_then_succeeds(autojump_clock: trio.testing.MockClock) -> None:
    calls: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        if len(calls) <= 2:
            return httpx.Response(429, headers={"retry-after": "30"},
                                  json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}})
        return httpx.Response(200, content=sse_reply("fine"), headers={"content-type": "text/event-stream"})

    reply = tm.Reply()
    retries: list[tuple[int, int | None, float]] = []

    def begin() -> None:
        nonlocal reply
        reply = tm.Reply()

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with trio.fail_after(300):
            out = await think_http.stream(client, "http://model.test/v1/messages", {}, b"{}", begin=begin,
                                          on_event=lambda d: bool(reply.feed(d)),
                                          on_retry=lambda a, st, why, d: retries.append((a, st, d)), retries=2)
    assert out.error is None and out.attempts == 3 and reply.complete
    assert [b.get("text") for b in reply.content()] == ["fine"]
    assert retries == [(1, 429, 30.0), (2, 429, 30.0)]
    assert calls[1] - calls[0] >= 30 and calls[2] - calls[1] >= 30      # MockClock time: the waits happened


async def test_retries_stop_at_the_limit_and_4xx_is_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    statuses = iter([529, 529, 529, 400])
    seen: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(next(statuses))
        return httpx.Response(seen[-1], json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        out = await think_http.stream(client, "http://m.test/v1/messages", {}, b"{}", begin=lambda: None,
                                      on_event=lambda d: False, on_retry=lambda *a: None, retries=2)
        assert out.attempts == 3 and out.status == 529 and "overloaded_error: busy" in (out.error or "")
        out = await think_http.stream(client, "http://m.test/v1/messages", {}, b"{}", begin=lambda: None,
                                      on_event=lambda d: False, on_retry=lambda *a: None, retries=2)
        assert out.attempts == 1 and out.status == 400


def test_retry_delay_rules() -> None:
    assert think_http.retry_delay(1, {"retry-after-ms": "1500"}) == 1.5
    assert think_http.retry_delay(1, {"retry-after": "2"}) == 2.0
    assert think_http.retry_delay(1, {"retry-after": "100000"}) == think_http.RETRY_AFTER_MAX_S
    date = email.utils.formatdate(1_000_010, usegmt=True)
    assert think_http.retry_delay(1, {"retry-after": date}, now=1_000_000) == pytest.approx(10)
    # No header: 0.5 s doubling, at most 8 s, less up to a quarter of jitter.
    assert think_http.retry_delay(1, {}, jitter=lambda: 0.0) == 0.5
    assert think_http.retry_delay(3, {}, jitter=lambda: 1.0) == pytest.approx(1.5)
    assert think_http.retry_delay(10, {}, jitter=lambda: 0.0) == 8.0


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: list[str] = []

    async def run(self, job: AgentJob, io: AgentIO) -> Verdict:
        self.jobs.append(job.profile)
        return Verdict(ok=True, value=self.name)


def job(profile: str) -> AgentJob:
    return AgentJob(run_id="r", n=1, label="l", engine="claude", model=None, effort=None, profile=profile,
                    schema=None, prompt="p", cwd="/", api_key="k", max_usd=1.0, max_tokens=0,
                    caller_max_profile="write", timeout_ms=1000)


async def test_only_think_agents_take_the_in_daemon_path_and_the_opt_out_holds() -> None:
    cli, inside = Recorder("cli"), Recorder("in-daemon")
    on = ThinkRouter(cli, inside, enabled=True)
    io = AgentIO(launcher=None, transcript=lambda line: None)     # type: ignore[arg-type]
    assert [(await on.run(job(p), io)).value for p in ("think", "read", "write")] == ["in-daemon", "cli", "cli"]
    off = ThinkRouter(cli, inside, enabled=False)
    assert (await off.run(job("think"), io)).value == "cli"
    assert on.name == "cli"


def test_reply_estimates_until_the_api_counts_and_corrections_match_the_cli() -> None:
    reply = tm.Reply()
    events = [json.loads(e.split(b"data: ", 1)[1]) for e in message_events(
        "m", [{"type": "tool_use", "id": "t1", "name": "StructuredOutput", "input": {"score": "x"}}], "tool_use",
        (100, 40))]
    for ev in events[:3]:
        reply.feed(ev)
    assert not reply.complete and reply.tokens.input == 100 and reply.tokens.output >= 1
    for ev in events[3:]:
        reply.feed(ev)
    assert reply.complete and reply.tokens.output == 40
    schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    nxt = tm.after(reply.content(), schema, enforced=False)
    assert not nxt.done
    result = nxt.follow_up[1]["content"][0]
    assert result["is_error"] and result["content"] == "Output does not match required schema: /score: 'x' is not of type 'integer'"
    text_only = tm.after([{"type": "text", "text": "prose"}], schema, enforced=False)
    assert not text_only.done and text_only.follow_up[1]["content"][0]["text"] == tm.ENFORCE
    assert tm.after([{"type": "text", "text": "prose"}], schema, enforced=True).done


def test_responses_body_and_events() -> None:
    b = tr.body("gpt-5.5", "hi", {"type": "object"}, "max")
    assert b["text"]["format"] == {"type": "json_schema", "name": "codex_output_schema", "schema": {"type": "object"},
                                   "strict": True}
    assert b["reasoning"] == {"effort": "xhigh"} and b["tools"] == [] and b["stream"] is True
    reply = tr.Reply(input_estimate=50)
    reply.feed({"type": "response.created"})
    reply.feed({"type": "response.output_text.delta", "delta": "x" * 400})
    assert reply.tokens.input == 50 and reply.tokens.output == 100 and not reply.complete
    assert tr.exec_events(reply, "cut")[-1] == {"type": "turn.failed", "error": {"message": "cut"}}


def test_model_aliases_and_output_limits_follow_the_cli() -> None:
    assert tm.model_name("sonnet") == "claude-sonnet-5-5" and tm.model_name(None) == "claude-opus-5-5"
    assert tm.model_name("my-model") == "my-model"
    assert tm.max_tokens("claude-opus-5-5") == 128_000 and tm.max_tokens("claude-sonnet-4-5") == 32_000
    h = tm.headers("k", None, "run\n1", 2, "lab\r\nx: y", None)
    assert "x-gate-origin" not in h                 # the CLI sends them only with a baseUrl
    h = tm.headers("k", "http://gw", "run\n1", 2, "lab\r\nx: y", "high")
    assert h["x-gate-channel"] == "run1" and h["x-gate-counterparty"] == "2:labx: y"
    assert "effort" in h["anthropic-beta"]
