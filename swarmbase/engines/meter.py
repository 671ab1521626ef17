"""The usage meter: a loopback HTTP relay between codex agents and engines.codex.baseUrl.

- One route: `POST /responses`, for a live per-agent bearer; anything else is 404 (other
  paths) or 401 (no or dead bearer), so a bearer is worth nothing elsewhere.
- It holds the caller's gateway token (the CLI never sees it) and adds x-gate-* headers.
- The upstream SSE passes through as it arrives; a side parser keeps at most one event
  (capped) to read usage, so a long response costs no more memory than a short one.
- Usage from every `response.completed` is booked on the agent; while a response streams,
  its output is estimated from the text deltas, so a ceiling is caught mid-stream. Crossing
  the token ceiling (or, for priced models, the USD cap) kills the agent.
- Each relay runs in a cancel scope registered on the agent: killing the agent (cancel,
  skip, timeout, ceiling) closes the upstream connection at once.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from typing import Any, Callable

import attrs
import httpx
import trio

from .. import json_depth
from .bearer_relay import BearerRelay, lifespan, new_bearer, plain, read_body, request_scope
from ..config import PriceRow
from .. import money
from ..prices import Tokens, cost

log = logging.getLogger("swarmbase.meter")

EVENT_PARSE_CAP = 1024 * 1024            # events above this are not JSON-parsed whole
TAIL_KEEP = 64 * 1024
CERT_HINT = ("meter: upstream unable to verify the first certificate — if engines.codex.baseUrl uses a "
             "private CA, start the daemon with NODE_EXTRA_CA_CERTS=<ca.pem>")
PASS_HEADERS = ("originator", "user-agent", "session-id", "thread-id", "x-client-request-id",
                "x-codex-turn-metadata", "x-codex-beta-features", "x-codex-window-id", "openai-beta")
DELTA_PREFIX = b"event: response.output_text.delta\n"
DELTA_OVERHEAD = 160             # the JSON around a delta's text, roughly; estimates only
USAGE_RE = re.compile(rb'"usage"\s*:\s*(\{(?:[^{}]|\{[^{}]*\})*\})')


@attrs.define(eq=False)
class MeterAgent:
    bearer: str
    run_id: str
    n: int
    label: str
    gateway_token: str
    upstream: str                    # engines.codex.baseUrl without trailing slash
    max_tokens: int
    max_usd: float | None            # None: unpriced, no USD cap from the meter
    price: PriceRow | None
    kill: Callable[[str], None]      # stops the agent with a reason
    changed: Callable[[], None] = lambda: None    # usage moved (live view)
    used: Tokens = Tokens()          # booked from response.completed usage
    pending: Tokens = Tokens()       # the meter's estimate of responses still streaming
    responses: int = 0
    unparsed: int = 0                # responses whose usage could not be read
    estimated: bool = False          # some tokens are the meter's estimate for a cut-off response
    error: str | None = None
    relays: set[trio.CancelScope] = attrs.Factory(set)

    @property
    def tokens(self) -> int:
        return self.used.total

    @property
    def live(self) -> Tokens:
        """Booked usage plus the estimate of what is streaming now."""
        return self.used + self.pending

    def cost(self, tokens: Tokens | None = None) -> float:
        return cost(self.used if tokens is None else tokens, self.price) if self.price else 0.0

    def over(self, extra: Tokens = Tokens()) -> str | None:
        """A reason to stop the agent if booked usage plus `extra` (an estimate of an
        unfinished response: input priced as input, streamed text as output) crosses
        its token ceiling or, for a priced model, its USD cap."""
        total = self.used + extra
        if total.total > self.max_tokens:
            return f"meter: token ceiling of {self.max_tokens:,} crossed ({total.total:,} tokens)"
        if self.max_usd is not None and self.price is not None:
            spend = self.cost(total)
            if spend > self.max_usd:
                return f"meter: USD cap of {money.usd(self.max_usd)} crossed ({money.usd(spend)})"
        return None

    def close_relays(self) -> None:
        for scope in list(self.relays):
            scope.cancel()


class EventScanner:
    """Finds SSE event boundaries in a byte stream, holding at most one (capped) event."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.tail = bytearray()
        self.overflow = False
        self.last_nl = False        # the event so far ends with "\n" (a boundary may span chunks)

    def _append(self, part: bytes) -> None:
        if not self.overflow:
            self.buf += part
            if len(self.buf) > EVENT_PARSE_CAP:
                self.overflow = True
                self.tail = bytearray(self.buf[-TAIL_KEEP:])
                self.buf = bytearray()
        else:
            self.tail += part
            del self.tail[:-TAIL_KEEP]

    def _finish(self) -> tuple[bytes | None, bytes]:
        done = (None, bytes(self.tail)) if self.overflow else (bytes(self.buf), b"")
        self.buf, self.tail, self.overflow, self.last_nl = bytearray(), bytearray(), False, False
        return done

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, bytes]]:
        """Complete events as (whole event, or None if it was too big; the tail of a big one)."""
        out: list[tuple[bytes | None, bytes]] = []
        data = bytes(chunk)
        pos = 0
        while pos < len(data):
            if self.last_nl and data[pos:pos + 1] == b"\n":
                end = pos + 1
            else:
                idx = data.find(b"\n\n", pos)
                end = idx + 2 if idx >= 0 else -1
            part = data[pos:end] if end >= 0 else data[pos:]
            self._append(part)
            if end >= 0:
                out.append(self._finish())
                pos = end
            else:
                self.last_nl = part.endswith(b"\n")
                pos = len(data)
        return out


    def scan(self, chunk: bytes, skip: bytes, overhead: int) -> tuple[list[tuple[bytes | None, bytes]], int]:
        """feed(), except that a whole event lying in this chunk and starting with `skip`
        is measured, never copied out: returns (the other events, the sum over skipped
        events of their length less `overhead`, at least 0 each). The relay's hot path:
        a response of 100,000 text deltas made 200,000 small bytes objects through feed()."""
        out: list[tuple[bytes | None, bytes]] = []
        measured = 0
        data = bytes(chunk)
        pos, n = 0, len(data)
        while pos < n:
            if self.buf or self.tail or self.overflow or self.last_nl:
                # An event begun in an earlier chunk: the exact path, up to its end.
                if self.last_nl and data[pos:pos + 1] == b"\n":
                    end = pos + 1
                else:
                    idx = data.find(b"\n\n", pos)
                    end = idx + 2 if idx >= 0 else n
                out += self.feed(data[pos:end])
                pos = end
                continue
            idx = data.find(b"\n\n", pos)
            if idx < 0:
                out += self.feed(data[pos:])
                break
            end = idx + 2
            if data.startswith(skip, pos):
                measured += max(0, end - pos - overhead)
            else:
                out.append(self._whole(data[pos:end]))
            pos = end
        return out, measured

    def _whole(self, event: bytes) -> tuple[bytes | None, bytes]:
        """A complete event found at a boundary, as feed() would return it."""
        if len(event) > EVENT_PARSE_CAP:
            return None, event[-TAIL_KEEP:]
        return event, b""


def event_data(raw: bytes) -> Any:
    lines = [ln[5:].lstrip() for ln in raw.split(b"\n") if ln.startswith(b"data:")]
    if not lines:
        return None
    try:
        return json_depth.loads(b"\n".join(lines), json_depth.LINE_DEPTH)
    except ValueError:           # not JSON, or nested too deep to be an event worth reading
        return None


def usage_tokens(u: Any) -> Tokens | None:
    if not isinstance(u, dict):
        return None
    try:
        inp = int(u.get("input_tokens") or 0)
        out = int(u.get("output_tokens") or 0)
        cached = int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    except (TypeError, ValueError):
        return None
    return Tokens(input=max(0, inp - cached), output=out, cache_read=cached)


class Meter(BearerRelay[MeterAgent]):
    """The registry of live agents plus the ASGI app that relays their requests."""

    def register(self, **kw: Any) -> MeterAgent:
        return self.hold(MeterAgent(bearer=new_bearer(), **kw))

    # -- ASGI ---------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["path"] != "/responses" or scope["method"] != "POST":
            return await self._plain(send, 404, "not found: the meter relays POST /responses only")
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope["headers"]}
        auth = headers.get("authorization", "")
        agent = self.agents.get(auth[7:]) if auth.startswith("Bearer ") else None
        if agent is None:
            return await self._plain(send, 401, "unauthorized: no live agent holds this bearer")
        body = await read_body(receive)
        if body is None:
            return await self._plain(send, 413, "request too large")
        await self._relay(agent, headers, body, send)

    async def _plain(self, send: Any, status: int, text: str) -> None:
        await plain(send, status, text, "meter_error")

    async def _relay(self, agent: MeterAgent, headers: dict[str, str], body: bytes, send: Any) -> None:
        out_headers = {k: v for k, v in headers.items() if k in PASS_HEADERS}
        out_headers.update({
            "authorization": f"Bearer {agent.gateway_token}", "content-type": "application/json",
            "accept": "text/event-stream", "x-gate-origin": "swarmbase", "x-gate-channel": agent.run_id,
            "x-gate-counterparty": f"{agent.n}:{''.join(c for c in agent.label if 32 <= ord(c) < 127)[:120]}"})
        input_estimate = len(body) // 4
        started = False
        with request_scope(agent.relays) as scope:
            try:
                async with self.client().stream("POST", agent.upstream + "/responses", headers=out_headers,
                                                content=body) as resp:
                    await send({"type": "http.response.start", "status": resp.status_code,
                                "headers": [(b"content-type", resp.headers.get("content-type", "text/event-stream")
                                             .encode())]})
                    started = True
                    try:
                        await self._stream(agent, resp, send, input_estimate)
                    finally:
                        # Under cancellation httpx's own cleanup would be cancelled too and
                        # leave the upstream socket open: close it shielded, bounded.
                        with trio.CancelScope(shield=True), trio.move_on_after(2):
                            await resp.aclose()
            except httpx.ConnectError as e:
                if _is_cert_error(e):
                    agent.error = CERT_HINT
                    agent.kill(CERT_HINT)
                else:
                    agent.error = f"meter: cannot reach the upstream: {e}"
                if not started:
                    await self._plain(send, 502, agent.error)
                    started = True
            except (httpx.HTTPError, OSError) as e:
                agent.error = f"meter: upstream failed: {e!r}"
                if not started:
                    await self._plain(send, 502, agent.error)
                    started = True
        if scope.cancelled_caught and not started:
            await self._plain(send, 503, "the agent was stopped")

    async def _stream(self, agent: MeterAgent, resp: httpx.Response, send: Any, input_estimate: int) -> None:
        scanner = EventScanner()
        out_chars = 0
        in_flight = True              # this response has not reported its usage yet
        agent.pending = agent.pending + Tokens(input=input_estimate)
        mine = Tokens(input=input_estimate)
        try:
            async for chunk in resp.aiter_raw():
                # The hot path: text deltas are counted by their size, without copying or
                # decoding them.
                events, measured = scanner.scan(chunk, DELTA_PREFIX, DELTA_OVERHEAD)
                out_chars += measured
                for whole, tail in events:
                    if whole is not None and whole.startswith(DELTA_PREFIX):
                        out_chars += max(0, len(whole) - DELTA_OVERHEAD)
                        continue
                    data = event_data(whole) if whole is not None else None
                    if not isinstance(data, dict):
                        data = {}               # not an event: nothing below matches it
                    kind = data.get("type")
                    if kind == "response.output_text.delta" and isinstance(data.get("delta"), str):
                        out_chars += len(data["delta"])
                    elif kind in ("response.completed", "response.incomplete", "response.failed"):
                        u = usage_tokens((data.get("response") or {}).get("usage"))
                        if u is None and whole is None:
                            m = USAGE_RE.search(tail)
                            u = usage_tokens(json.loads(m.group(1))) if m else None
                        agent.responses += 1
                        if u is not None:
                            agent.used = agent.used + u
                            in_flight = False
                        out_chars = 0
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                estimate = Tokens(input=input_estimate, output=out_chars // 4) if in_flight else Tokens()
                if estimate == mine and not events:
                    continue                     # nothing booked, nothing estimated anew
                agent.pending = agent.pending - mine + estimate
                mine = estimate
                agent.changed()
                reason = agent.over(estimate)
                if reason:
                    # The cut-off response will never report usage: book the estimate (marked),
                    # never zero, or a budget of killed agents would never run out.
                    if estimate.total:
                        agent.used = agent.used + estimate
                        agent.estimated = True
                    agent.error = reason
                    agent.kill(reason)
                    return
        finally:
            agent.pending = agent.pending - mine
        if in_flight and resp.status_code == 200:
            agent.unparsed += 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _is_cert_error(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(e):
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False
