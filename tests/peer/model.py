"""One deterministic fake Messages API that both runtimes talk to.

Claude Code's Workflow runtime and SwarmBase run the same script against it, so any
difference in what the script returns comes from the runtimes, not from the model:

- The **main session** of `claude -p` (its request offers the `Workflow` tool) is the
  driver of the peer: the user prompt carries `conformance-run <token>`, and the first
  reply to a new token is one `tool_use` of Workflow per input registered under that
  token (`expect`): one CLI start runs a whole batch of workflows. Every later main-session
  turn gets a plain "ok". Main-session turns report real usage (MAIN_OUTPUT_TOKENS output
  tokens each), as a model does: the peer's `budget.spent()` counts them (the session's
  spend), SwarmBase's does not (a run has no main session) — the `budget-shape` case.
- **Subagents** are every other request (Claude Code's agent() requests lack the Workflow
  tool; SwarmBase's agents are `claude -p` processes without it). The answer is a pure
  function of the task text — the script's prompt, taken from the last text block of the
  first user message with Claude Code's "[Workflow harness — computed task]" header and
  its indentation removed — so it is the same under both runtimes:
    * with a StructuredOutput tool: a call of it with an object made from the tool's
      input schema (every property, values derived from the task's hash);
    * else the text `re: <task>`, or WORDS for a `[[say:WORDS]]` marker, or
      `model: <the request's model>` for `[[model]]`;
    * `[[fail]]`: HTTP 400 (a terminal API error: no retry);
    * `[[tokens:N]]`: the reply reports N output tokens (budget tests); default 10;
    * `[[readfile:PATH]]`, when a Read tool is offered: a Read of PATH first, then "ok"
      (a tool agent's one Read: bench/peer_workflow.py's default cases).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from typing import Any, AsyncIterator

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from ..fakes.anthropic_api import message_events, tool_results
from ..fakes.serving import event_stream_response, serve_fake

HARNESS = re.compile(r"^\[Workflow harness[^\n]*?The computed task text follows:\n", re.S)
# What Claude Code appends to an isolation: 'worktree' agent's task.
WORKTREE_NOTE = re.compile(r"\n\n---\nYou are running in an isolated git worktree.*\Z", re.S)
TOKEN = re.compile(r"conformance-run ([0-9a-f]{16})")
DEFAULT_OUTPUT_TOKENS = 10
MAIN_OUTPUT_TOKENS = 7


def task_text(body: dict[str, Any]) -> str:
    """The script's prompt as either runtime sent it."""
    for msg in body.get("messages", []):
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            blocks = [content]
        else:
            blocks = [b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        blocks = [b for b in blocks if not b.lstrip().startswith("<system-reminder>")]
        text = blocks[-1] if blocks else ""
        m = HARNESS.match(text)
        if m:
            text = "\n".join(line[2:] if line.startswith("  ") else line
                             for line in text[m.end():].split("\n"))
        return WORKTREE_NOTE.sub("", text)
    return ""


def _hash(seed: str) -> int:
    return int(hashlib.sha256(seed.encode()).hexdigest()[:12], 16)


def value_for(schema: Any, seed: str) -> Any:
    """A value that matches `schema` (the shapes scripts use), derived from `seed` only."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][_hash(seed) % len(schema["enum"])]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {k: value_for(v, f"{seed}.{k}") for k, v in sorted(props.items())}
    if kind == "array":
        n = max(int(schema.get("minItems", 0)), min(2, int(schema.get("maxItems", 2))))
        return [value_for(schema.get("items", {"type": "string"}), f"{seed}[{i}]") for i in range(n)]
    if kind == "integer" or kind == "number":
        lo, hi = schema.get("minimum", 0), schema.get("maximum", 99)
        return int(lo) + _hash(seed) % (int(hi) - int(lo) + 1)
    if kind == "boolean":
        return _hash(seed) % 2 == 1
    if kind == "null":
        return None
    return f"v{_hash(seed) % 100_000:05d}"


def answer_text(task: str, model: str) -> str:
    if "[[model]]" in task:
        return f"model: {model}"
    m = re.search(r"\[\[say:(.*?)\]\]", task, re.S)
    return m.group(1) if m else f"re: {task}"


def output_tokens(task: str) -> int:
    m = re.search(r"\[\[tokens:(\d+)\]\]", task)
    return int(m.group(1)) if m else DEFAULT_OUTPUT_TOKENS


@attrs.define
class DeterministicModel:
    url: str = ""
    calls: dict[str, list[dict[str, Any]]] = attrs.Factory(dict)   # token -> Workflow tool inputs
    # Every subagent request, in arrival order: (task, origin). The origin is SwarmBase's
    # run id (its x-gate-channel header) or "cc:<session id>" for the peer's agents.
    subagent_requests: list[tuple[str, str]] = attrs.Factory(list)
    main_requests: int = 0
    launched: set[str] = attrs.Factory(set)                    # tokens whose Workflow call went out

    def expect(self, workflow_inputs: list[dict[str, Any]]) -> str:
        """Register Workflow calls, made together in one main-session turn (one tool_use
        each, id `toolu_<token>_<i>`); the main-session prompt must carry the token."""
        token = secrets.token_hex(8)
        self.calls[token] = list(workflow_inputs)
        return token

    def app(self) -> QuartTrio:
        app = QuartTrio("peer-model")
        app.config["RESPONSE_TIMEOUT"] = None

        @app.post("/v1/messages")
        async def messages() -> Any:
            body = await request.get_json(force=True)
            headers = {k.lower(): v for k, v in request.headers.items()}
            origin = headers.get("x-gate-channel") or f"cc:{headers.get('x-claude-code-session-id', '?')}"
            return self.answer(body, origin)

        return app

    def tasks_from(self, origin: str) -> list[str]:
        return [task for task, o in self.subagent_requests if o == origin]

    def answer(self, body: dict[str, Any], origin: str = "?") -> Any:
        model = body.get("model", "claude-test")
        tools = {t.get("name"): t for t in body.get("tools", []) if isinstance(t, dict)}
        if "Workflow" in tools:
            self.main_requests += 1
            return self._stream(model, self._main_turn(body), (100, MAIN_OUTPUT_TOKENS))
        task = task_text(body)
        self.subagent_requests.append((task, origin))
        if "[[fail]]" in task:
            return Response(json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                                   "message": "refused by the fake"}}),
                            status=400, content_type="application/json")
        done = tool_results(body)
        usage = (100, output_tokens(task))
        if "StructuredOutput" in tools and not done:
            value = value_for(tools["StructuredOutput"].get("input_schema"), task)
            block = {"type": "tool_use", "id": "toolu_so", "name": "StructuredOutput", "input": value}
            return self._stream(model, ([block], "tool_use"), usage)
        read = re.search(r"\[\[readfile:(.*?)\]\]", task)
        if read and "Read" in tools and not done:
            block = {"type": "tool_use", "id": "toolu_rf", "name": "Read", "input": {"file_path": read.group(1)}}
            return self._stream(model, ([block], "tool_use"), usage)
        text = "ok" if done else answer_text(task, model)
        return self._stream(model, ([{"type": "text", "text": text}], "end_turn"), usage)

    def _main_turn(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        last = next((m for m in reversed(body.get("messages", [])) if m.get("role") == "user"), {})
        content = last.get("content")
        texts = [content] if isinstance(content, str) else [
            b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
        # A resumed session folds the new prompt into the user message that also carries the
        # last turn's tool result, so a token is answered once, whatever else is there.
        tokens = [t for text in texts for t in TOKEN.findall(text)]
        if tokens and tokens[-1] in self.calls and tokens[-1] not in self.launched:
            token = tokens[-1]
            self.launched.add(token)
            return [{"type": "tool_use", "id": f"toolu_{token}_{i}", "name": "Workflow", "input": call}
                    for i, call in enumerate(self.calls[token])], "tool_use"
        return [{"type": "text", "text": "ok"}], "end_turn"

    def _stream(self, model: str, reply: tuple[list[dict[str, Any]], str], usage: tuple[int, int]) -> Any:
        events = message_events(model, reply[0], reply[1], usage)
        if usage[1] == 0:       # message_start's placeholder output count too
            events[0] = events[0].replace(b'"output_tokens": 1', b'"output_tokens": 0')

        async def stream() -> AsyncIterator[bytes]:
            for ev in events:
                yield ev

        return event_stream_response(stream())

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await serve_fake(self, task_status=task_status)
