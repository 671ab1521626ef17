"""Serving a fake API app on loopback port 0 (shared by the fake model APIs)."""

from __future__ import annotations

from typing import Any

import trio

from swarmbase.daemon import serve_on_loopback as _serve


async def serve_on_loopback(app: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on 127.0.0.1:<free port> with a short shutdown grace; task_status gets the URL."""
    await _serve(app, graceful=0.1, task_status=task_status)


def event_stream_response(chunks: Any) -> Any:
    """An SSE response of these chunks (an async iterator of bytes), with no response timeout."""
    from quart import Response
    resp = Response(chunks, content_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    resp.timeout = None
    return resp


async def serve_fake(fake: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `fake.app()` on loopback; `fake.url` is set before task_status gets the fake."""
    async with trio.open_nursery() as n:
        fake.url = await n.start(serve_on_loopback, fake.app())
        task_status.started(fake)
