"""Turn an agent's stream (Claude Code stream-json, Codex --json) into readable items."""

from __future__ import annotations

import json
from typing import Any

from .views import usd


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c) for c in content)
    return json.dumps(content, ensure_ascii=False)


def item(kind: str, title: str, body: str = "", rows: list[list[str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "title": title, "body": body[:20_000]}
    if rows:
        out["rows"] = rows
    return out


USAGE_NAMES = {"input_tokens": "input tokens", "output_tokens": "output tokens",
               "cache_read_input_tokens": "cache read tokens", "cache_creation_input_tokens": "cache write tokens",
               "cached_input_tokens": "cached input tokens", "reasoning_output_tokens": "reasoning tokens"}


def usage_rows(usage: Any, extra: list[list[str]] | None = None) -> list[list[str]]:
    """A usage object as table rows (known counters named, numbers grouped)."""
    rows = []
    if isinstance(usage, dict):
        for k, v in usage.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows.append([USAGE_NAMES.get(k, k.replace("_", " ")), f"{v:,}"])
    return rows + (extra or [])


def _claude(e: dict[str, Any]) -> list[dict[str, str]]:
    t = e.get("type")
    if t == "system":
        sub = e.get("subtype")
        if sub == "init":
            tools = ", ".join(e.get("tools") or []) or "none"
            return [item("system", f"session started · model {e.get('model')} · tools: {tools}")]
        if sub == "permission_denied":
            return [item("error", f"permission denied: {e.get('tool_name')}", str(e.get("message", "")))]
        if sub == "api_retry":
            return [item("error", f"API retry {e.get('attempt')}/{e.get('max_retries')}: {e.get('error')}")]
        return [item("system", f"system: {sub}")]
    if t == "assistant":
        msg = e.get("message") or {}
        out = []
        if e.get("error"):
            out.append(item("error", f"API error: {e.get('error')}", _text(msg.get("content", ""))))
            return out
        for b in msg.get("content") or []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "text":
                out.append(item("text", "assistant", b.get("text", "")))
            elif b.get("type") == "tool_use":
                out.append(item("tool_call", f"tool call: {b.get('name')}",
                                json.dumps(b.get("input"), indent=2, ensure_ascii=False)))
            elif b.get("type") == "thinking":
                out.append(item("system", "thinking", b.get("thinking", "")))
        return out
    if t == "user":
        out = []
        for b in (e.get("message") or {}).get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                kind = "error" if b.get("is_error") else "tool_result"
                out.append(item(kind, "tool result" + (" (error)" if b.get("is_error") else ""), _text(b.get("content"))))
        return out
    if t == "result":
        cost = e.get("total_cost_usd")
        head = f"result: {e.get('subtype')}" + (" · error" if e.get("is_error") else "") + \
            (f" · {usd(cost)}" if isinstance(cost, (int, float)) else "")
        body = e.get("result") if isinstance(e.get("result"), str) else "\n".join(map(str, e.get("errors") or []))
        extra = [[k, v] for k, v in (("cost", usd(cost) if isinstance(cost, (int, float)) else None),
                                     ("turns", str(e["num_turns"]) if isinstance(e.get("num_turns"), int) else None),
                                     ("duration", f"{e['duration_ms'] / 1000:.1f}s"
                                      if isinstance(e.get("duration_ms"), (int, float)) else None)) if v]
        out = [item("error" if e.get("is_error") else "result", head, body or "")]
        rows = usage_rows(e.get("usage"), extra)
        if rows:
            out.append(item("usage", "usage", rows=rows))
        return out
    return []


def _codex(e: dict[str, Any]) -> list[dict[str, str]]:
    t = e.get("type", "")
    if t in ("item.completed", "item.started"):
        it = e.get("item") or {}
        kind = it.get("type")
        if t == "item.started" and kind != "command_execution":
            return []
        if kind == "agent_message":
            return [item("text", "assistant", it.get("text", ""))]
        if kind == "reasoning":
            return [item("system", "reasoning", it.get("text", ""))]
        if kind == "command_execution":
            if t == "item.started":
                return [item("tool_call", "command", it.get("command", ""))]
            return [item("tool_result" if it.get("status") == "completed" else "error",
                         f"command exited {it.get('exit_code')}", it.get("aggregated_output", ""))]
        if kind == "file_change":
            return [item("tool_call", "file change", json.dumps(it.get("changes"), indent=2))]
        if kind == "error":
            return [item("error", "error", it.get("message", ""))]
        return [item("system", f"item: {kind}")]
    if t == "turn.completed":
        return [item("usage", "turn completed", rows=usage_rows(e.get("usage")))]
    if t in ("turn.failed", "error"):
        msg = (e.get("error") or {}).get("message") if t == "turn.failed" else e.get("message")
        return [item("error", t, str(msg))]
    if t == "thread.started":
        return [item("system", "session started")]
    return []


def render_transcript(entries: list[Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for e in entries:
        if not isinstance(e, dict):
            continue
        if e.get("type") == "raw":
            out.append(item("raw", "output", str(e.get("text", ""))))
        elif "." in str(e.get("type", "")) or e.get("type") == "error":
            out += _codex(e)
        else:
            out += _claude(e)
    return out
