"""One streamed model request made by the daemon, with the CLIs' retries: the HTTP side of
an in-daemon think agent (engines/think_run.py), for either API.

Retries, as `claude -p` does them with CLAUDE_CODE_MAX_RETRIES=2 (what the claude engine
sets) and codex with request_max_retries=1: a connection that failed before any event, HTTP
408/409/429/5xx (529 overloaded included), or an SSE `error` event before the message
began, are retried up to `retries` times. The wait honours `retry-after-ms` and
`retry-after` (seconds or an HTTP date), else the SDKs' backoff (0.5 s doubling, at most
8 s, less up to 25 % jitter), never more than RETRY_AFTER_MAX_S; it is a trio.sleep, so
tests run it under MockClock. A stream cut mid-reply (a connection reset, or a stream that
ends without message_stop) is retried like the others when the caller says how to tell a
whole reply (`complete`: the claude think agent, as `claude -p` retries it); what the cut
attempt streamed is charged (estimated). Without it (codex), a stream that already carried
events is not retried: what it streamed is charged and the agent fails saying where.

Cancelling the caller (the agent's scope: skip, run cancel, timeout) destroys the request:
the response is closed shielded and bounded (httpx's own cleanup, cancelled too, would
leave the socket open), which closes the connection, so no further byte is read.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import httpx
import trio

from .meter import EventScanner, event_data
from .think_messages import obj

RETRY_STATUSES = frozenset({408, 409, 429})
RETRY_AFTER_MAX_S = 60.0
ERROR_BODY_LIMIT = 2_000


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


def retry_delay(attempt: int, headers: Mapping[str, str], now: float | None = None,
                jitter: Callable[[], float] = random.random) -> float:
    """Seconds to wait before retry number `attempt` (1-based)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return min(max(float(ms) / 1000, 0.0), RETRY_AFTER_MAX_S)
        except ValueError:
            pass
    after = headers.get("retry-after")
    if after is not None:
        try:
            return min(max(float(after), 0.0), RETRY_AFTER_MAX_S)
        except ValueError:
            when = email.utils.parsedate_to_datetime(after) if _is_date(after) else None
            if when is not None:
                return min(max(when.timestamp() - (time.time() if now is None else now), 0.0), RETRY_AFTER_MAX_S)
    return min(0.5 * 2 ** (attempt - 1), 8.0) * (1 - 0.25 * jitter())


def _is_date(text: str) -> bool:
    try:
        return email.utils.parsedate_to_datetime(text) is not None
    except (TypeError, ValueError):
        return False


@attrs.define
class Outcome:
    """How the request ended. `events`: SSE events read from the last attempt."""
    status: int | None = None
    error: str | None = None          # set when it failed (HTTP error, broken stream, refused)
    events: int = 0
    stopped: bool = False             # the caller's on_event asked to stop (a cap)
    ended: bool = False               # the stream ended on its own (not cut)
    attempts: int = 0
    headers: dict[str, str] = attrs.Factory(dict)     # the response's, lower-cased (retry-after)


OnEvent = Callable[[Any], bool]                      # an event's data; True: stop reading now
OnRetry = Callable[[int, int | None, str, float], None]   # attempt, status, why, delay


async def stream(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], body: bytes, *,
                 begin: Callable[[], None], on_event: OnEvent, on_retry: OnRetry, retries: int,
                 retry_sse_error: Callable[[Any], bool] = lambda data: False,
                 complete: Callable[[], bool] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = trio.sleep) -> Outcome:
    """`complete`: whether the reply read so far is whole; given, a stream cut mid-reply (the
    connection broke, or it ended before the reply did) is retried too, as `claude -p` does;
    `begin` (called before every attempt) is where the caller banks a cut attempt's usage."""
    attempt = 0
    while True:
        attempt += 1
        begin()
        out = await _once(client, url, headers, body, on_event, retry_sse_error)
        out.attempts = attempt
        cut = (complete is not None and out.events > 0 and not out.stopped and out.status == 200
               and (out.error is not None or not complete()))
        retry = cut or (out.error is not None and not out.stopped and (out.events == 0 or out.status == -1))
        if not retry or attempt > retries or not (cut or _worth_retrying(out)):
            return out
        delay = retry_delay(attempt, out.headers)
        on_retry(attempt, out.status if out.status and out.status > 0 else None, out.error or "", delay)
        await sleep(delay)


def _worth_retrying(out: Outcome) -> bool:
    if out.status is None or out.status == -1:     # no response, or an SSE error before any content
        return True
    return retryable_status(out.status)


async def _once(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], body: bytes,
                on_event: OnEvent, retry_sse_error: Callable[[Any], bool]) -> Outcome:
    out = Outcome()
    resp: httpx.Response | None = None
    try:
        req = client.build_request("POST", url, headers=dict(headers), content=body)
        resp = await client.send(req, stream=True)
        out.status = resp.status_code
        out.headers = {k.lower(): v for k, v in resp.headers.items()}
        if resp.status_code != 200:
            text = (await _bounded_body(resp)).decode("utf-8", "replace")
            out.error = f"HTTP {resp.status_code}: {_error_message(text)}"
            return out
        scanner = EventScanner()
        async for chunk in resp.aiter_bytes():
            for whole, _tail in scanner.feed(chunk):
                data = event_data(whole) if whole is not None else None
                if data is None:
                    continue
                if out.events == 0 and retry_sse_error(data):
                    out.status, out.error = -1, f"stream error before the reply began: {_sse_error(data)}"
                    return out
                out.events += 1
                if on_event(data):
                    out.stopped = True
                    return out
        out.ended = True
    except httpx.TimeoutException as e:
        out.error = f"the model API sent nothing for too long ({type(e).__name__})"
    except (httpx.HTTPError, OSError) as e:
        out.error = f"the model API connection failed: {type(e).__name__}: {e}"[:500]
    finally:
        if resp is not None:
            # Shielded and bounded: under cancellation httpx's own close is cancelled too and
            # would leave the socket open. Closing an unfinished response closes the connection.
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await resp.aclose()
    return out


async def _bounded_body(resp: httpx.Response) -> bytes:
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) > ERROR_BODY_LIMIT:
            break
    return bytes(buf[:ERROR_BODY_LIMIT])


def _error_message(text: str) -> str:
    """The API's error message from its JSON body (either API's shape), else the text."""
    try:
        data = event_data(b"data: " + text.encode())
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        return f"{err.get('type') or err.get('code') or 'error'}: {err.get('message') or ''}"[:500]
    return text.strip()[:500] or "(no body)"


def _sse_error(data: Any) -> str:
    err = obj(data.get("error")) if isinstance(data, dict) else {}
    return f"{err.get('type') or 'error'}: {err.get('message') or ''}"[:500]
