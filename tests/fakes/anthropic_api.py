"""A fake Anthropic Messages API on loopback, scripted per prompt.

The scenario is chosen by a marker in the prompt text, `[[name]]` or `[[name:arg]]`:

  (none)              plain text reply "echo: <prompt>"
  [[text:WORDS]]      reply WORDS
  [[usage:IN,OUT]]    plain reply whose usage is IN input and OUT output tokens (drives cost)
  [[structured:JSON]] call the StructuredOutput tool with JSON as input
  [[textonly]]        answer with text even when a schema asks for StructuredOutput
  [[deep:N]]          call StructuredOutput with an object nested N levels deep ({"a":{"a":…}});
                      a later request (whose history holds that input) gets text
  [[badonce:JSON]]    text only (no structured output) until the prompt carries SwarmBase's
                      schema nudge; then call StructuredOutput with JSON
  [[read:PATH]]       call Read on PATH, then reply with what the tool returned
  [[tools]]           call the tools listed as JSON between `CALLS:` and `:END` in the prompt
                      ([{"name", "input"}, …]) in one reply (parallel calls), then reply
                      "tool said: " and each result (`ERR ` before an is_error one), " || " between;
                      with `[[gatelater]]` in the prompt the second request waits for `gate`
  [[readloop:PATH]]   call Read on PATH in every reply (never ends on its own: maxTurns)
  [[bash:COMMAND]]    call Bash with COMMAND, then reply with what the tool returned
  [[bashhang:COMMAND]] call Bash with COMMAND, then hang on the next turn (message_start only)
  [[401]] [[500]]     HTTP errors
  [[slow:SECONDS]]    stream the reply with a pause of SECONDS between events
  [[hang]]            send message_start, then never finish
  [[sleep:SECONDS]]   wait before answering (a slow but healthy agent)
  [[gate]]            wait until the test sets `gate` (an event), then answer as the rest of
                      the prompt says (`[[gate]] [[text:X]]`: X, once the gate opens)
  [[echokey]]         reply with the x-api-key header it received (a leaking agent)
  [[cut]]             message_start and one text delta, then the stream ends (no message_stop)
  [[cutonce]]         the first request with this prompt is [[cut]]; later ones reply "recovered"
  [[droponce]]        the first request with this prompt: message_start and one text delta, then
                      the connection is dropped mid-response; later ones reply "recovered"
  [[429:N]]           the first N requests with this prompt get HTTP 429 with `retry-after: 1`
  [[drip:N]]          N text deltas of 1000 characters, 0.05 s apart (`drip_sent` counts the
                      ones written; `disconnects` the streams whose client went away first)

Every request is recorded (headers and body) with the time it arrived; `live` counts
requests in flight, `max_live` its peak.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from .serving import serve_on_loopback


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def prompt_of(body: dict[str, Any]) -> str:
    """The user's prompt: the text blocks of the first user message."""
    for msg in body.get("messages", []):
        if msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, str):
                return content
            return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for msg in body.get("messages", []):
        if msg.get("role") == "user" and isinstance(msg.get("content"), list):
            out += [b for b in msg["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    return out


def message_events(model: str, blocks: list[dict[str, Any]], stop: str, usage: tuple[int, int]) -> list[bytes]:
    evs = [sse("message_start", {"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": 1, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0}}})]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            evs.append(sse("content_block_start", {"type": "content_block_start", "index": i,
                                                   "content_block": {"type": "text", "text": ""}}))
            evs.append(sse("content_block_delta", {"type": "content_block_delta", "index": i,
                                                   "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            evs.append(sse("content_block_start", {"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}))
            # `input_json`: the input as JSON text, for inputs too deep for json.dumps.
            evs.append(sse("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": b.get("input_json") or json.dumps(b["input"])}}))
        evs.append(sse("content_block_stop", {"type": "content_block_stop", "index": i}))
    evs.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                     "usage": {"output_tokens": usage[1]}}))
    evs.append(sse("message_stop", {"type": "message_stop"}))
    return evs


@attrs.define
class FakeAnthropic:
    requests: list[dict[str, Any]] = attrs.Factory(list)
    live: int = 0
    max_live: int = 0
    url: str = ""
    closed_early: int = 0
    gate: trio.Event = attrs.Factory(trio.Event)
    drip_sent: int = 0
    disconnects: int = 0
    refused: dict[str, int] = attrs.Factory(dict)

    def app(self) -> QuartTrio:
        app = QuartTrio("fake-anthropic")
        app.config["RESPONSE_TIMEOUT"] = None

        @app.post("/v1/messages")
        async def messages() -> Any:
            raw = await request.get_data(as_text=True)
            try:
                body = json.loads(raw)
            except RecursionError:
                # The history holds a [[deep:N]] answer: Python cannot parse it, so keep
                # what the scenario needs (the marker, and that a tool was called).
                marker = re.search(r"\[\[deep:\d+\]\]", raw)
                body = {"messages": [{"role": "user", "content": [
                    {"type": "text", "text": marker.group(0) if marker else ""},
                    {"type": "tool_result", "content": "(too deep to parse)"}]}]}
            entry = {"headers": {k.lower(): v for k, v in request.headers.items()}, "body": body,
                     "at": trio.current_time(), "prompt": prompt_of(body)}
            self.requests.append(entry)
            return await self.answer(body, entry["prompt"], entry["headers"])

        return app

    async def answer(self, body: dict[str, Any], prompt: str, headers: dict[str, str]) -> Any:
        model = body.get("model", "claude-test")
        scenario = prompt.replace("[[gate]]", "")
        limited = re.search(r"\[\[429:(\d+)\]\]", scenario)
        if limited and self.refused.get(prompt, 0) >= int(limited.group(1)):
            scenario = scenario.replace(limited.group(0), "")       # refused enough: answer as the rest says
        m = re.search(r"\[\[(\w+)(?::(.*?))?\]\]", scenario, re.DOTALL)
        kind, arg = (m.group(1), m.group(2)) if m else ("echo", None)
        err = {"401": (401, "authentication_error", "invalid x-api-key"),
               "500": (500, "api_error", "internal failure")}.get(kind)
        if err:
            return Response(json.dumps({"type": "error", "error": {"type": err[1], "message": err[2]}}),
                            status=err[0], content_type="application/json")
        if kind == "429" and self.refused.get(prompt, 0) < int(arg):
            self.refused[prompt] = self.refused.get(prompt, 0) + 1
            return Response(json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
                            status=429, content_type="application/json", headers={"retry-after": "1"})
        if kind in ("cutonce", "droponce") and self.refused.get(prompt, 0) >= 1:
            kind, arg = "text", "recovered"
        elif kind in ("cutonce", "droponce"):
            self.refused[prompt] = 1
        usage = (1000, 50)
        pause = 0.0
        hang = False
        stop = "end_turn"
        done_tools = tool_results(body)
        if kind == "sleep":
            await trio.sleep(float(arg))
        if "[[gate]]" in prompt:
            await self.gate.wait()
        if kind == "usage":
            a, b = arg.split(",")
            usage = (int(a), int(b))
            blocks = [{"type": "text", "text": "counted"}]
        elif kind == "echokey":
            blocks = [{"type": "text", "text": f"the key is {headers.get('x-api-key')}"}]
        elif kind == "text":
            blocks = [{"type": "text", "text": arg}]
        elif kind == "badonce" and "[swarmbase schema nudge]" in prompt and not done_tools:
            blocks = [{"type": "tool_use", "id": "toolu_s2", "name": "StructuredOutput", "input": json.loads(arg)}]
            stop = "tool_use"
        elif kind == "badonce":
            blocks = [{"type": "text", "text": "I would rather answer in prose."}]
        elif kind == "structured" and not done_tools:
            blocks = [{"type": "tool_use", "id": "toolu_s1", "name": "StructuredOutput", "input": json.loads(arg)}]
            stop = "tool_use"
        elif kind == "deep" and not done_tools:
            n = int(arg)
            blocks = [{"type": "tool_use", "id": "toolu_d1", "name": "StructuredOutput",
                       "input_json": '{"a":' * n + "1" + "}" * n}]
            stop = "tool_use"
        elif kind == "tools" and not done_tools:
            listed = json.loads(prompt.split("CALLS:", 1)[1].split(":END", 1)[0])
            blocks = [{"type": "tool_use", "id": f"toolu_t{i}", "name": c["name"], "input": c["input"]}
                      for i, c in enumerate(listed)]
            stop = "tool_use"
        elif kind == "tools":
            if "[[gatelater]]" in prompt:
                await self.gate.wait()
            said = [("ERR " if r.get("is_error") else "") + str(r.get("content")) for r in done_tools]
            blocks = [{"type": "text", "text": "tool said: " + " || ".join(said)}]
        elif kind == "readloop":
            blocks = [{"type": "tool_use", "id": f"toolu_l{len(done_tools)}", "name": "Read",
                       "input": {"file_path": arg}}]
            stop = "tool_use"
        elif kind == "read" and not done_tools:
            blocks = [{"type": "tool_use", "id": "toolu_r1", "name": "Read", "input": {"file_path": arg}}]
            stop = "tool_use"
        elif kind == "bashhang" and done_tools:
            hang = True
            blocks = []
        elif kind in ("bash", "bashhang") and not done_tools:
            blocks = [{"type": "tool_use", "id": "toolu_b1", "name": "Bash",
                       "input": {"command": arg, "description": "run it"}}]
            stop = "tool_use"
        elif kind in ("read", "bash"):
            content = done_tools[-1].get("content")
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            blocks = [{"type": "text", "text": f"tool said: {content}"}]
        elif kind == "slow":
            pause = float(arg)
            blocks = [{"type": "text", "text": "slowly done"}]
        elif kind == "hang":
            hang = True
            blocks = []
        elif kind == "droponce":
            return self.dropped(model, usage)
        elif kind in ("cut", "cutonce"):
            return Response(b"".join(message_events(model, [{"type": "text", "text": "half an ans"}], "end_turn",
                                                     usage)[:3]), content_type="text/event-stream")
        elif kind == "drip":
            return self.drip(model, int(arg))
        else:
            blocks = [{"type": "text", "text": "echo: " + prompt[-200:]}]
        events = message_events(model, blocks, stop, usage)

        async def stream() -> AsyncIterator[bytes]:
            self.live += 1
            self.max_live = max(self.max_live, self.live)
            try:
                if hang:
                    yield events[0]
                    await trio.sleep_forever()
                for ev in events:
                    yield ev
                    if pause:
                        await trio.sleep(pause)
            finally:
                self.live -= 1

        resp = Response(stream(), content_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        resp.timeout = None
        return resp

    def dropped(self, model: str, usage: tuple[int, int]) -> Any:
        events = message_events(model, [{"type": "text", "text": "half an ans"}], "end_turn", usage)

        async def stream() -> AsyncIterator[bytes]:
            yield b"".join(events[:3])
            await trio.sleep(0.05)
            raise ConnectionResetError("dropped by the fake mid-response")   # the server aborts the connection

        resp = Response(stream(), content_type="text/event-stream")
        resp.timeout = None
        return resp

    def drip(self, model: str, n: int) -> Any:
        events = message_events(model, [{"type": "text", "text": ""}], "end_turn", (1000, n * 250))

        async def stream() -> AsyncIterator[bytes]:
            finished = False
            try:
                yield events[0] + events[1]
                for _ in range(n):
                    await trio.sleep(0.05)
                    yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                      "delta": {"type": "text_delta", "text": "x" * 1000}})
                    self.drip_sent += 1
                for ev in events[2:]:
                    yield ev
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
