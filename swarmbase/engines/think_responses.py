"""A codex `think` agent as one Responses API request made by the daemon: the request, and
reading its streamed reply. Pure functions and state (engines/think_codex.py runs it).

What `codex exec` sends through the meter (engines/codex.py, meter.py) and what is kept:
POST <baseUrl>/responses with `stream: true`, `Authorization: Bearer <the caller's gateway
token>` and the meter's `x-gate-*` headers; the prompt as one user `input_text` message;
`--output-schema` as `text.format` (a strict json_schema named codex_output_schema). A
think agent has no tools (its CLI config turns the shell, web search and sub-agents off),
so `tools` is empty. The framing note (ahead of the prompt on the CLI path, where codex
has no system-prompt flag) is the request's `instructions` here. The reply is folded into
`codex exec --json`'s events (`item.completed` agent_message, `turn.completed` with usage,
`turn.failed`), so the transcript and engines/codex.py's judge read it as a CLI agent's.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..prices import Tokens
from . import framing
from .claude import header_safe
from .meter import usage_tokens
from .think_messages import USER_AGENT, obj

SCHEMA_NAME = "codex_output_schema"


def url(base_url: str) -> str:
    return base_url.rstrip("/") + "/responses"


def headers(token: str, run_id: str, n: int, label: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "content-type": "application/json", "accept": "text/event-stream",
            "user-agent": USER_AGENT,
            "x-gate-origin": "swarmbase", "x-gate-channel": header_safe(run_id),
            "x-gate-counterparty": f"{n}:{header_safe(label)}"}


def body(model: str | None, prompt: str, schema: dict[str, Any] | None, effort: str | None,
         system: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model, "instructions": framing.instructions(schema is not None, system),
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}],
        "tools": [], "tool_choice": "auto", "parallel_tool_calls": False, "store": False, "stream": True,
    }
    if effort:
        out["reasoning"] = {"effort": "xhigh" if effort == "max" else effort}
    if schema is not None:
        out["text"] = {"format": {"type": "json_schema", "name": SCHEMA_NAME, "schema": schema, "strict": True}}
    return out


@attrs.define
class Reply:
    """The streamed response: its message text, usage, and how it ended."""
    started: bool = False
    chars: int = 0
    input_estimate: int = 0            # the request's size / 4 until the API reports usage
    texts: list[str] = attrs.Factory(list)
    usage: Tokens | None = None
    status: str | None = None          # completed | incomplete | failed
    error: str | None = None

    def feed(self, ev: Any) -> None:
        if not isinstance(ev, dict):
            return
        kind = ev.get("type")
        if kind == "response.created":
            self.started = True
        elif kind == "response.output_text.delta" and isinstance(ev.get("delta"), str):
            self.started = True
            self.chars += len(ev["delta"])
        elif kind == "response.output_item.done":
            item = obj(ev.get("item"))
            if item.get("type") == "message":
                for c in item.get("content") or []:
                    if isinstance(c, dict) and c.get("type") == "output_text" and isinstance(c.get("text"), str):
                        self.texts.append(c["text"])
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            resp = obj(ev.get("response"))
            self.status = kind.split(".", 1)[1]
            self.usage = usage_tokens(resp.get("usage"))
            if kind == "response.failed":
                err = obj(resp.get("error"))
                self.error = str(err.get("message") or "the response failed")[:2000]
        elif kind == "error":
            self.error = str(ev.get("message") or (ev.get("error") or {}).get("message") or "stream error")[:2000]

    @property
    def tokens(self) -> Tokens:
        if self.usage is not None:
            return self.usage
        return Tokens(input=self.input_estimate if self.started else 0, output=self.chars // 4)

    @property
    def complete(self) -> bool:
        return self.status is not None and self.usage is not None


def exec_events(reply: Reply, error: str | None) -> list[dict[str, Any]]:
    """The reply as `codex exec --json` would print it."""
    out: list[dict[str, Any]] = [{"type": "thread.started", "inProcess": True}, {"type": "turn.started"}]
    if reply.texts:
        out.append({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message",
                                                       "text": reply.texts[-1]}})
    t = reply.tokens
    if error is None and reply.status == "completed":
        out.append({"type": "turn.completed", "usage": {"input_tokens": t.input + t.cache_read,
                                                        "cached_input_tokens": t.cache_read,
                                                        "output_tokens": t.output}})
    else:
        out.append({"type": "turn.failed", "error": {"message": error or reply.error or
                                                     f"the response ended {reply.status or 'early'}"}})
    return out
