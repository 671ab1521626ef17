"""Serving a fake API app on loopback port 0 (shared by the fake model APIs)."""

from __future__ import annotations

from typing import Any

import trio

from swarmbase.daemon import serve_on_loopback as _serve


async def serve_on_loopback(app: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on 127.0.0.1:<free port> with a short shutdown grace; task_status gets the URL."""
    await _serve(app, graceful=0.1, task_status=task_status)
