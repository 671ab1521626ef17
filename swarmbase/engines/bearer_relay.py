"""What the daemon's two loopback relays share (the codex meter, engines/meter.py, and the
claude key door, engines/key_door.py): agents reach them with a per-agent bearer that
means nothing elsewhere, and they carry each request to the agent's upstream with the
credential the agent never holds.

`BearerRelay` keeps the live bearers (secrets for the redactor while they live) and one
upstream client; the functions are the ASGI pieces both answer with, and the loopback
server a relay is served on (by the daemon, and by a Ray node for its agent's key door:
nothing here is the daemon's own).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
from contextlib import contextmanager
from functools import partial
from typing import Any, Generic, Iterator, Protocol, TypeVar

import httpx
import hypercorn.config
import hypercorn.trio
import trio

MAX_REQUEST_BYTES = 64 * 1024 * 1024


def ssl_context(env: dict[str, str] | None = None) -> ssl.SSLContext:
    """The system store plus NODE_EXTRA_CA_CERTS, as Node (and so the spec) promises."""
    env = dict(os.environ) if env is None else env
    ctx = ssl.create_default_context()
    extra = env.get("NODE_EXTRA_CA_CERTS")
    if extra and os.path.exists(extra):
        ctx.load_verify_locations(extra)
    return ctx


def upstream_client() -> httpx.AsyncClient:
    """A relay's client to its upstream: no read timeout (a response streams as long as the
    model writes), many connections (one per live agent request)."""
    return httpx.AsyncClient(verify=ssl_context(), timeout=httpx.Timeout(30, read=None),
                             limits=httpx.Limits(max_connections=1000, max_keepalive_connections=50))


async def lifespan(receive: Any, send: Any) -> None:
    """An ASGI lifespan with nothing to start or stop."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def plain(send: Any, status: int, text: str, kind: str) -> None:
    """A relay's own answer (a refusal, an upstream failure), as an API error body."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body",
                "body": json.dumps({"error": {"message": text, "type": kind}}).encode()})


async def read_body(receive: Any, limit: int = MAX_REQUEST_BYTES) -> bytes | None:
    """The whole request body, or None when it is larger than `limit`."""
    body = bytearray()
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if len(body) > limit:
            return None
        if not msg.get("more_body"):
            return bytes(body)


@contextmanager
def request_scope(relays: set[trio.CancelScope]) -> Iterator[trio.CancelScope]:
    """One relayed request's cancel scope, in its agent's set while it runs, so that ending
    the agent (close_relays) closes the upstream connection at once."""
    scope = trio.CancelScope()
    relays.add(scope)
    try:
        with scope:
            yield scope
    finally:
        relays.discard(scope)


def new_bearer() -> str:
    return secrets.token_urlsafe(32)


class Redacts(Protocol):
    def add(self, secret: str | None) -> None: ...

    def discard(self, secret: str | None) -> None: ...

    def __call__(self, text: str) -> str:
        """The text with every secret known now replaced."""


class HasBearer(Protocol):
    @property
    def bearer(self) -> str: ...

    def close_relays(self) -> None:
        """End its requests in flight (it was unregistered: killed, or done)."""


A = TypeVar("A", bound=HasBearer)


class BearerRelay(Generic[A]):
    """Live agents by bearer, and the one client to the upstreams."""

    def __init__(self, client: httpx.AsyncClient | None = None, redact: Redacts | None = None) -> None:
        self.agents: dict[str, A] = {}
        self.url = ""                 # set once served (serve_relay)
        self._client = client
        self.redact = redact          # live bearers are secrets too, while they live

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = upstream_client()
        return self._client

    async def aclose(self) -> None:
        """Close the upstream connections (when the relay stops serving)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def hold(self, agent: A) -> A:
        self.agents[agent.bearer] = agent
        if self.redact is not None:
            self.redact.add(agent.bearer)
        return agent

    def unregister(self, agent: A) -> None:
        self.agents.pop(agent.bearer, None)
        agent.close_relays()
        if self.redact is not None:
            self.redact.discard(agent.bearer)


async def serve_on_loopback(app: Any, *, graceful: float = 0.5,
                            task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve an ASGI app on 127.0.0.1:<free port>; task_status gets its base URL."""
    hc = hypercorn.config.Config()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = graceful
    hc.keep_alive_timeout = 60
    async with trio.open_nursery() as n:
        binds = await n.start(partial(hypercorn.trio.serve, app, hc))
        task_status.started(binds[0])


async def serve_relay(relay: BearerRelay[Any], *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The codex usage meter or a claude key door: a loopback port of its own (plain
    HTTP; agents reach it by URL, through their one door). Its upstream connections are
    closed when it stops (else they are left to the GC)."""
    try:
        async with trio.open_nursery() as n:
            relay.url = await n.start(serve_on_loopback, relay)
            task_status.started()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await relay.aclose()
