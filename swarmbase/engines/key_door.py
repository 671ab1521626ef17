"""The key door: a loopback HTTP relay between claude agents and their model API, so that
the caller's key never enters an agent (issue 31 #3).

- A claude agent gets a per-agent bearer as its ANTHROPIC_API_KEY and this relay's URL as
  its ANTHROPIC_BASE_URL; its network namespace has one door, to this relay
  (launch/egress.py carries the TCP; TLS to the model API starts here, so the headers can
  be rewritten). A stolen environment, argv, transcript or core dump holds a bearer that
  is worth nothing once the agent ends, and nothing anywhere but here.
- Each request must carry a live bearer (`x-api-key`, or `authorization: Bearer`); else it
  is refused with 401 and nothing goes upstream. The bearer's headers are dropped and the
  caller's key is sent as `x-api-key` to the agent's upstream (engines.claude.baseUrl, or
  the vendor API), at the path the CLI asked for under it. Other headers pass (the CLI's
  anthropic-version, anthropic-beta, x-gate-*), hop-by-hop ones excepted.
- The answer streams back as it arrives (raw bytes: no decoding, no re-encoding); the
  usage is read from the CLI's own stream-json as before, so nothing is parsed here.
- Unregistering an agent (it ended or was killed) closes its upstream connections at once.
- Cost (bench/key_door.py, loaded 2 cores): a 200 MiB response at ~173 MiB/s through the
  agent's door and the key door against ~614 MiB/s through the door straight to the
  upstream (today's byte relay); a model API streams a few KB/s per agent. A claude agent
  run took a median +71 ms (50 alternated, within the run-to-run spread: p95 ~2.3–2.7 s).
The same shape as the codex meter (engines/meter.py), which swaps its bearer for the
gateway token; the pieces both use are engines/bearer_relay.py.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import httpx
import trio

from .bearer_relay import BearerRelay, lifespan, new_bearer, plain, read_body, request_scope

log = logging.getLogger("swarmbase.key_door")

# Never relayed: the bearer's headers (the key replaces them), what names the relay
# itself (host, length: httpx sets them), and hop-by-hop headers (RFC 9110 7.6.1).
DROPPED = frozenset({"x-api-key", "authorization", "host", "content-length", "connection", "keep-alive",
                     "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"})
ERROR_KIND = "key_door_error"


@attrs.define(eq=False)
class DoorAgent:
    bearer: str
    key: str                          # the caller's key, sent upstream as x-api-key
    upstream: str                     # base URL without a trailing slash
    relays: set[trio.CancelScope] = attrs.Factory(set)

    def close_relays(self) -> None:
        for scope in list(self.relays):
            scope.cancel()


def bearer_of(headers: list[tuple[str, str]]) -> str | None:
    """The bearer a request carries: x-api-key (what the CLI sends for ANTHROPIC_API_KEY),
    else an `authorization: Bearer` header."""
    for k, v in headers:
        if k == "x-api-key":
            return v
    for k, v in headers:
        if k == "authorization" and v.startswith("Bearer "):
            return v[7:]
    return None


def upstream_url(upstream: str, raw_path: bytes, query: bytes) -> httpx.URL | None:
    """Where a request goes: the path it asked for under the agent's upstream, or None if
    that would leave the upstream's scheme, host or port (an absolute-form target)."""
    if not raw_path.startswith(b"/"):
        return None
    base = httpx.URL(upstream)
    try:
        url = httpx.URL(upstream + raw_path.decode("latin-1") + (("?" + query.decode("latin-1")) if query else ""))
    except httpx.InvalidURL:
        return None
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        return None
    return url


def request_headers(headers: list[tuple[str, str]], key: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k not in DROPPED] + [("x-api-key", key)]


def response_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers.raw if k.lower().decode("latin-1") not in DROPPED]


class KeyDoor(BearerRelay[DoorAgent]):
    """The registry of live claude agents' bearers plus the ASGI app that relays them."""
    refused = 0                      # requests refused for their bearer (tests, benches)

    def register(self, key: str, upstream: str, bearer: str | None = None) -> DoorAgent:
        """A live agent: its bearer is new, or the one given (a node's door: the daemon made it)."""
        return self.hold(DoorAgent(bearer=bearer or new_bearer(), key=key, upstream=upstream.rstrip("/")))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        if scope["type"] != "http":
            return
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
        bearer = bearer_of(headers)
        agent = self.agents.get(bearer) if bearer else None
        if agent is None:
            self.refused += 1
            return await plain(send, 401, "unauthorized: no live agent holds this key", ERROR_KIND)
        url = upstream_url(agent.upstream, scope.get("raw_path") or scope["path"].encode(), scope["query_string"])
        if url is None:
            return await plain(send, 400, "the key door relays paths under the model API only", ERROR_KIND)
        body = await read_body(receive)
        if body is None:
            return await plain(send, 413, "request too large", ERROR_KIND)
        await self._relay(agent, scope["method"], url, request_headers(headers, agent.key), body, send)

    async def _relay(self, agent: DoorAgent, method: str, url: httpx.URL, headers: list[tuple[str, str]],
                     body: bytes, send: Any) -> None:
        started = False
        with request_scope(agent.relays) as scope:
            try:
                async with self.client().stream(method, url, headers=headers, content=body) as resp:
                    await send({"type": "http.response.start", "status": resp.status_code,
                                "headers": response_headers(resp.headers)})
                    started = True
                    try:
                        async for chunk in resp.aiter_raw():
                            await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    finally:
                        # Cancelled, httpx's own cleanup would be cancelled too and leave
                        # the upstream socket open: close it shielded, bounded.
                        with trio.CancelScope(shield=True), trio.move_on_after(2):
                            await resp.aclose()
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            except (httpx.HTTPError, OSError) as e:
                log.info("key door: upstream %s failed: %r", agent.upstream, e)
                if not started:
                    await plain(send, 502, f"key door: cannot reach the model API: {e}", ERROR_KIND)
                    started = True
        if scope.cancelled_caught and not started:
            await plain(send, 503, "the agent was stopped", ERROR_KIND)
