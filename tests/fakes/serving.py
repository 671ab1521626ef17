"""Serving a fake API app on loopback port 0 (shared by the fake model APIs)."""

from __future__ import annotations

from functools import partial
from typing import Any

import hypercorn.config
import hypercorn.trio
import trio


async def serve_on_loopback(app: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on 127.0.0.1:<free port>; task_status gets the base URL."""
    cfg = hypercorn.config.Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 0.1
    async with trio.open_nursery() as n:
        binds = await n.start(partial(hypercorn.trio.serve, app, cfg))
        task_status.started(binds[0])
