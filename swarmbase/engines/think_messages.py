"""A claude `think` agent as Messages API requests made by the daemon: the request, and
reading its streamed reply. Pure functions and state; the HTTP, retries and the agent's
lifecycle are engines/think_http.py and engines/think_run.py.

What `claude -p --tools= [--json-schema S]` sends (observed on 2.1.328 against the fake,
tests/fakes/anthropic_api.py) and what is kept of it here:
- POST <baseUrl>/v1/messages, `stream: true`, `x-api-key`, `anthropic-version: 2023-06-01`,
  the `x-gate-*` headers, the model with its alias resolved (`sonnet` → `claude-sonnet-5-5`),
  `max_tokens` 128000 for 5.x models and 32000 for others.
- tools `[]`, or with a schema one tool `StructuredOutput` whose input_schema is the schema
  (same name and description as the CLI's); no tool_choice.
- A valid StructuredOutput call ends the agent without another request. An invalid one is
  answered with the CLI's tool_result error and the conversation goes on; a text-only answer
  gets the CLI's one `[structured-output-enforce]` turn. What is still wrong after that goes
  to the agent service's schema nudges, as with the CLI.
Not kept: Claude Code's own 7 KB system prompt (a think agent is not a coding agent: its
system prompt is the framing note the CLI gets with --append-system-prompt), the billing
line, the adaptive-thinking and context-management betas.

The reply is folded into the CLI's stream-json shapes (`assistant`, `user`, `result`), so
the transcript reads as the dashboard expects and engines/claude.py judges the outcome by
the same rules as a CLI agent's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import jsonschema

from .. import json_depth, prices
from ..prices import Tokens
from . import framing
from .claude import _usage_tokens, header_safe

API_VERSION = "2023-06-01"
VENDOR_URL = "https://api.anthropic.com"
TOOL_NAME = "StructuredOutput"
TOOL_DESCRIPTION = ("Use this tool to return your final response in the requested structured format. You MUST "
                    "call this tool exactly once at the end of your response to provide the structured output.")
ENFORCE = ("[structured-output-enforce] You MUST call the StructuredOutput tool to complete this request. "
           "Call this tool now.")
USER_AGENT = "swarmbase (in-daemon think agent)"
MAX_TURNS = 6          # requests per agent turn: the CLI's corrections are bounded the same way
BIG_OUTPUT_MODELS = ("claude-opus-5", "claude-sonnet-5", "claude-haiku-5", "claude-fable-5")


def obj(value: Any) -> dict[str, Any]:
    """A JSON object, or {} for anything else (the stream is the model's: never trusted)."""
    return value if isinstance(value, dict) else {}


def model_name(model: str | None) -> str:
    """The CLI's alias table; full and unknown names are sent verbatim."""
    return prices.ALIASES.get(model or "", model or "claude-opus-5-5")


def max_tokens(model: str) -> int:
    return 128_000 if model.startswith(BIG_OUTPUT_MODELS) else 32_000


def url(base_url: str | None) -> str:
    return (base_url or VENDOR_URL).rstrip("/") + "/v1/messages"


def headers(api_key: str, base_url: str | None, run_id: str, n: int, label: str,
            effort: str | None) -> dict[str, str]:
    out = {"x-api-key": api_key, "anthropic-version": API_VERSION, "content-type": "application/json",
           "accept": "text/event-stream", "user-agent": USER_AGENT}
    if effort:
        out["anthropic-beta"] = "effort-2025-11-24"
    if base_url:       # the CLI sends them through ANTHROPIC_CUSTOM_HEADERS only with a baseUrl
        out.update({"x-gate-origin": "swarmbase", "x-gate-channel": header_safe(run_id),
                    "x-gate-counterparty": f"{n}:{header_safe(label)}"})
    return out


def body(model: str, prompt: str, schema: dict[str, Any] | None, effort: str | None,
         history: list[dict[str, Any]], system: str | None = None,
         tools: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """`system`: a project agent type's body (or a read agent's prompt), the system prompt
    before the framing note; `tools`: offered besides StructuredOutput (a read agent's)."""
    out: dict[str, Any] = {
        "model": model, "max_tokens": max_tokens(model), "stream": True,
        "system": [*([{"type": "text", "text": system}] if system else []),
                   {"type": "text", "text": framing.note(schema is not None)}],
        "messages": [{"role": "user", "content": prompt}, *history],
        "tools": [*tools, *([{"name": TOOL_NAME, "description": TOOL_DESCRIPTION, "input_schema": schema}]
                            if schema else [])],
    }
    if effort:
        out["output_config"] = {"effort": "max" if effort == "max" else effort}
    return out


@attrs.define
class Reply:
    """One streamed message as it arrives: its content blocks, usage, and whether it ended."""
    id: str = ""
    model: str | None = None
    blocks: list[dict[str, Any]] = attrs.Factory(list)
    json_parts: dict[int, list[str]] = attrs.Factory(dict)
    usage: Tokens | None = None             # from message_start (input side, output ≈ 1)
    output: int | None = None               # message_delta's final output count
    chars: int = 0                          # streamed text so far (output ≈ chars / 4 until told)
    stop_reason: str | None = None
    stopped: bool = False                   # message_stop (or message_delta) seen
    error: str | None = None                # an SSE `error` event's message

    def feed(self, ev: Any) -> None:
        if not isinstance(ev, dict):
            return
        kind = ev.get("type")
        if kind == "message_start":
            msg = obj(ev.get("message"))
            self.id = str(msg.get("id") or "")
            self.model = msg.get("model") if isinstance(msg.get("model"), str) else None
            self.usage = _usage_tokens(msg.get("usage") or {})
        elif kind == "content_block_start":
            block = obj(ev.get("content_block"))
            self.blocks.append(dict(block))
        elif kind == "content_block_delta" and self.blocks:
            delta = obj(ev.get("delta"))
            block = self.blocks[-1]
            for key, field in (("text", "text"), ("thinking", "thinking"), ("signature", "signature")):
                if isinstance(delta.get(key), str):
                    block[field] = block.get(field, "") + delta[key]
                    self.chars += len(delta[key]) if key != "signature" else 0
            if isinstance(delta.get("partial_json"), str):
                self.json_parts.setdefault(len(self.blocks) - 1, []).append(delta["partial_json"])
                self.chars += len(delta["partial_json"])
        elif kind == "message_delta":
            delta = obj(ev.get("delta"))
            self.stop_reason = delta.get("stop_reason") if isinstance(delta.get("stop_reason"), str) else None
            out = (ev.get("usage") or {}).get("output_tokens") if isinstance(ev.get("usage"), dict) else None
            if isinstance(out, int) and not isinstance(out, bool):
                self.output = out
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            err = obj(ev.get("error"))
            self.error = f"{err.get('type') or 'error'}: {err.get('message') or ''}"[:500]

    @property
    def started(self) -> bool:
        return self.usage is not None

    @property
    def complete(self) -> bool:
        """Its usage is the API's own final count."""
        return self.started and self.output is not None and (self.stopped or self.stop_reason is not None)

    @property
    def tokens(self) -> Tokens:
        base = self.usage or Tokens()
        return attrs.evolve(base, output=self.output if self.output is not None else max(base.output, self.chars // 4))

    def content(self) -> list[dict[str, Any]]:
        """The blocks with tool inputs parsed; an input nested deeper than the limit (or not
        JSON) becomes the marker TOO_DEEP_INPUT / None."""
        out = []
        for i, b in enumerate(self.blocks):
            b = dict(b)
            if b.get("type") == "tool_use" and i in self.json_parts:
                raw = "".join(self.json_parts[i])
                try:
                    b["input"] = json_depth.loads(raw, json_depth.MAX_DEPTH) if raw else {}
                except json_depth.TooDeep:
                    b["input"] = TOO_DEEP_INPUT
                except ValueError:
                    b["input"] = None
            out.append(b)
        return out


TOO_DEEP_INPUT = "<nested too deep>"


@attrs.frozen
class Next:
    """What the conversation does after a reply: done (with a structured value or text), or
    another request with these messages appended (the CLI's own corrections)."""
    done: bool
    structured: Any = None
    text: str | None = None
    follow_up: tuple[dict[str, Any], ...] = ()
    transcript: tuple[dict[str, Any], ...] = ()     # user lines for the transcript
    schema_error: str | None = None


def tool_calls(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reply's calls of tools other than StructuredOutput, when it makes no
    StructuredOutput call (that one ends or corrects the agent: `after`)."""
    uses = [b for b in content if b.get("type") == "tool_use"]
    if any(b.get("name") == TOOL_NAME for b in uses):
        return []
    return uses


def last_text(content: list[dict[str, Any]]) -> str | None:
    texts = [b["text"] for b in content if b.get("type") == "text" and isinstance(b.get("text"), str)]
    return texts[-1] if texts else None


def after(content: list[dict[str, Any]], schema: dict[str, Any] | None, enforced: bool) -> Next:
    texts = [b.get("text", "") for b in content if b.get("type") == "text" and isinstance(b.get("text"), str)]
    text = texts[-1] if texts else None
    if schema is None:
        return Next(done=True, text="".join(texts) if texts else "")
    calls = [b for b in content if b.get("type") == "tool_use" and b.get("name") == TOOL_NAME]
    if not calls:
        if enforced:
            return Next(done=True, text=text)
        msg = {"role": "user", "content": [{"type": "text", "text": ENFORCE}]}
        return Next(done=False, text=text, follow_up=(_assistant(content), msg), transcript=(msg,))
    call = calls[-1]
    value = call.get("input")
    if value == TOO_DEEP_INPUT:
        return Next(done=True, text=text, schema_error=f"the structured output nests deeper than "
                                                        f"{json_depth.MAX_DEPTH} levels (the limit)")
    problem = schema_problem(value, schema)
    if problem is None:
        return Next(done=True, structured=value, text=json.dumps(value))
    result = {"type": "tool_result", "tool_use_id": call.get("id"), "is_error": True,
              "content": f"Output does not match required schema: {problem}"}
    msg = {"role": "user", "content": [result]}
    return Next(done=False, text=text, follow_up=(_assistant(content), msg), transcript=(msg,))


def _assistant(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return "/" + "/".join(str(p) for p in e.absolute_path) + f": {e.message}"
    return None


def assistant_line(reply: Reply, content: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The reply as the CLI's `assistant` event (usage: the message's own)."""
    return {"type": "assistant", "message": {"id": reply.id, "type": "message", "role": "assistant",
                                             "model": reply.model or model, "content": content,
                                             "usage": usage_json(reply.tokens)}, "inProcess": True}


def usage_json(t: Tokens) -> dict[str, int]:
    return {"input_tokens": t.input, "output_tokens": t.output, "cache_read_input_tokens": t.cache_read,
            "cache_creation_input_tokens": t.cache_write}


def result_line(*, model: str, tokens: Tokens, cost: float, turns: int, text: str | None, structured: Any,
                error: str | None, budget: bool, status: int | None, schema: bool,
                max_turns: bool = False) -> dict[str, Any]:
    """The CLI's `result` event for what happened, for claude.judge and the transcript."""
    subtype = "error_max_budget_usd" if budget else "error_max_turns" if max_turns else "success"
    out: dict[str, Any] = {
        "type": "result", "subtype": subtype, "is_error": error is not None,
        "num_turns": turns, "total_cost_usd": cost, "usage": usage_json(tokens),
        "modelUsage": {model: {"inputTokens": tokens.input, "outputTokens": tokens.output,
                               "cacheReadInputTokens": tokens.cache_read,
                               "cacheCreationInputTokens": tokens.cache_write, "costUSD": cost}},
        "terminal_reason": "budget_exhausted" if budget else "max_turns" if max_turns else (
            "api_error" if error else "completed"),
        "inProcess": True}
    if error is not None:
        out["errors"] = [error]
        out["api_error_status"] = status
    else:
        out["result"] = text if text is not None else ""
        if schema:
            out["structured_output"] = structured
    return out
