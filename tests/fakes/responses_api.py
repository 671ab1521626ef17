"""A fake OpenAI Responses API on loopback (POST /responses, SSE), scripted per prompt.

The scenario is a marker in the user's prompt, `[[name]]` or `[[name:arg]]`:

  (none)            one message "done", usage 1000 in / 100 out
  [[text:WORDS]]    a message WORDS
  [[shell:CMD]]     first request: an exec_command call running CMD; next: a message quoting
                    the tool output ("tool said: …")
  [[multi:N]]       N requests: N-1 shell calls of `true`, then a message; each response
                    carries usage 1000 in / 100 out (accounting across requests in one turn)
  [[long:N]]        a message streamed as N text deltas of 1000 characters before it completes
  [[nousage]]       a message whose response.completed carries no usage
  [[hang]]          response.created, then nothing
  [[slowshell:S]]   every response takes S seconds (keep-alives meanwhile): two shell calls
                    (`echo one`, `echo two`), then a message "slow done: <outputs>"
  [[badonce:JSON]]  a message that is not JSON until the prompt carries SwarmBase's schema
                    nudge; then a message JSON
  [[500]]           HTTP 500

Every request is recorded (path, headers, body). `disconnects` counts streams whose
client went away before the response completed.
"""

from __future__ import annotations

import json
import re
from typing import Any, AsyncIterator

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from .serving import serve_on_loopback

USAGE = {"input_tokens": 1000, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 100,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 1100}


def sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def user_prompt(body: dict[str, Any]) -> str:
    """The last user message's text (the prompt comes after the environment context)."""
    texts = []
    for item in body.get("input", []):
        if item.get("type") == "message" and item.get("role") == "user":
            for c in item.get("content", []):
                if isinstance(c, dict) and c.get("type") == "input_text":
                    texts.append(c.get("text", ""))
    return texts[-1] if texts else ""


def outputs(body: dict[str, Any]) -> list[str]:
    return [str(i.get("output")) for i in body.get("input", []) if i.get("type") == "function_call_output"]


def message(text: str) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def shell_call(cmd: str, n: int) -> dict[str, Any]:
    return {"id": f"fc_{n}", "type": "function_call", "call_id": f"call_{n}", "name": "exec_command",
            "arguments": json.dumps({"cmd": cmd})}


@attrs.define
class FakeResponses:
    requests: list[dict[str, Any]] = attrs.Factory(list)
    disconnects: int = 0
    url: str = ""

    def app(self) -> QuartTrio:
        app = QuartTrio("fake-responses", static_folder=None)
        app.config["RESPONSE_TIMEOUT"] = None

        @app.route("/<path:path>", methods=["GET", "POST", "PUT", "DELETE"])
        async def anything(path: str) -> Any:
            body = await request.get_json(force=True, silent=True) or {}
            self.requests.append({"path": "/" + path, "method": request.method,
                                  "headers": {k.lower(): v for k, v in request.headers.items()}, "body": body})
            if path != "responses" or request.method != "POST":
                return Response("not here", status=404)
            return await self.answer(body)

        return app

    async def answer(self, body: dict[str, Any]) -> Any:
        prompt = user_prompt(body)
        m = re.search(r"\[\[(\w+)(?::(.*?))?\]\]", prompt, re.S)
        kind, arg = (m.group(1), m.group(2)) if m else ("done", None)
        if kind == "500":
            return Response(json.dumps({"error": {"message": "boom", "type": "server_error", "code": None}}),
                            status=500, content_type="application/json")
        done = outputs(body)
        usage: dict[str, Any] | None = USAGE
        deltas = 0
        if kind == "text":
            items = [message(arg)]
        elif kind == "shell" and not done:
            items = [shell_call(arg, 1)]
        elif kind == "shell":
            items = [message("tool said: " + done[-1])]
        elif kind == "multi" and len(done) < int(arg) - 1:
            items = [shell_call("true", len(done) + 1)]
        elif kind == "long":
            deltas = int(arg)
            items = [message("x" * 1000 * deltas)]
        elif kind == "slowshell" and len(done) < 2:
            items = [shell_call(["echo one", "echo two"][len(done)], len(done) + 1)]
        elif kind == "slowshell":
            items = [message("slow done: " + " | ".join(done))]
        elif kind == "badonce":
            items = [message(arg if "[swarmbase schema nudge]" in prompt else "not json at all")]
        elif kind == "nousage":
            items = [message("no usage here")]
            usage = None
        else:
            items = [message("done")]
        hang = kind == "hang"
        delay = float(arg) if kind == "slowshell" else 0.0
        model = body.get("model", "gpt-test")

        async def stream() -> AsyncIterator[bytes]:
            finished = False
            try:
                yield sse({"type": "response.created", "sequence_number": 0,
                           "response": {"id": "resp_1", "status": "in_progress", "model": model}})
                waited = 0.0
                while hang or waited < delay:
                    # SSE comments keep the stream alive, as real servers do; writing is
                    # also how the server notices a client that went away.
                    await trio.sleep(0.1)
                    waited += 0.1
                    yield b": keep-alive\n\n"
                for i in range(deltas):
                    yield sse({"type": "response.output_text.delta", "sequence_number": 1 + i, "item_id": "msg_1",
                               "output_index": 0, "content_index": 0, "delta": "x" * 1000})
                    await trio.sleep(0.002)
                for i, it in enumerate(items):
                    yield sse({"type": "response.output_item.done", "sequence_number": 1000 + i,
                               "output_index": i, "item": it})
                resp: dict[str, Any] = {"id": "resp_1", "object": "response", "status": "completed",
                                        "model": model, "output": items}
                if usage is not None:
                    resp["usage"] = usage
                yield sse({"type": "response.completed", "sequence_number": 2000, "response": resp})
                finished = True
            finally:
                if not finished:
                    self.disconnects += 1

        resp = Response(stream(), content_type="text/event-stream")
        resp.timeout = None
        return resp

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            self.url = await n.start(serve_on_loopback, self.app())
            task_status.started(self)
