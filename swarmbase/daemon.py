"""The daemon: one Hypercorn server with a Quart-Trio app on 127.0.0.1:<port>, the
supervisor beside it, and a graceful drain on SIGTERM/SIGINT.

Shutdown order (Hypercorn installs no signal handlers and does not close open
WebSockets itself): stop accepting runs, stop every in-flight run and record it as
interrupted (its notice goes to the outbox), close every WebSocket with 1001, then let
Hypercorn return.
"""

from __future__ import annotations

import logging
import signal
import sys
from functools import partial
from typing import Any

import attrs
import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from .config import Config
from .engines.meter import Meter
from .mcpl.session import CLOSE_GOING_AWAY, Hub, Session, caller_for_token
from .outbox import Outbox
from .runner import RunnerLimits
from .runs.store import RunStore
from .runs.supervisor import AgentService, Supervisor

log = logging.getLogger("swarmbase")


@attrs.define
class Services:
    cfg: Config
    store: RunStore
    outbox: Outbox
    supervisor: Supervisor
    hub: Hub
    meter: Meter | None = None
    drain: trio.Event = attrs.Factory(trio.Event)


def build_services(cfg: Config, agents: AgentService | None = None,
                   limits: RunnerLimits | None = None) -> Services:
    store = RunStore(cfg.state_dir)
    outbox = Outbox(cfg.state_dir / "outbox.jsonl")
    meter = Meter() if cfg.engines.codex is not None else None
    sup = Supervisor(cfg, store, outbox, agents=agents, limits=limits, meter=meter)
    return Services(cfg=cfg, store=store, outbox=outbox, supervisor=sup, hub=Hub(), meter=meter)


class _QuartTransport:
    """Bound to one connection's websocket object: Quart's `websocket` global is a
    context variable, and sessions are also closed from other connections' tasks."""

    def __init__(self) -> None:
        self.ws = websocket._get_current_object()

    async def send(self, text: str) -> None:
        await self.ws.send(text)

    async def receive(self) -> str | bytes:
        return await self.ws.receive()

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code, reason)


def make_app(services: Services) -> QuartTrio:
    from dashboard.app import register as register_dashboard

    app = QuartTrio("swarmbase", static_folder=None)   # the dashboard serves its own assets
    app.config["RESPONSE_TIMEOUT"] = None   # SSE streams must not be cut at 60 s
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = 4 * 1024 * 1024

    @app.get("/healthz")
    async def healthz() -> tuple[str, int]:
        return "ok\n", 200

    @app.get("/mcpl")
    async def mcpl_http() -> Response:
        return Response("This is SwarmBase's MCPL WebSocket endpoint: connect with "
                        "ws://127.0.0.1:<port>/mcpl?token=<token>.\n", status=426,
                        headers={"Upgrade": "websocket", "Content-Type": "text/plain"})

    @app.websocket("/mcpl")
    async def mcpl_ws() -> None:
        await websocket.accept()
        caller = caller_for_token(services.cfg, websocket.args.get("token"))
        session = Session(_QuartTransport(), caller, services.supervisor,
                          services.outbox, services.hub)
        async with trio.open_nursery() as nursery:
            async def serve() -> None:
                await session.serve()
                nursery.cancel_scope.cancel()
            nursery.start_soon(serve)
            await services.drain.wait()
            nursery.cancel_scope.cancel()
        await session.close(CLOSE_GOING_AWAY, "server shutting down")

    register_dashboard(app, services)
    return app


async def serve(cfg: Config, *, agents: AgentService | None = None, limits: RunnerLimits | None = None,
                stop: trio.Event | None = None, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM/SIGINT (or `stop`). task_status gets the bound URL."""
    services = build_services(cfg, agents, limits)
    interrupted = services.supervisor.recover()
    if interrupted:
        log.warning("marked %d runs interrupted after an unclean stop", len(interrupted))
    stop = trio.Event() if stop is None else stop
    app = make_app(services)
    hc = hypercorn.config.Config()
    hc.bind = [f"127.0.0.1:{cfg.port}"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = 3
    hc.websocket_ping_interval = 20
    hc.websocket_max_message_size = 4 * 1024 * 1024

    async def shutdown_trigger() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as n:
                async def on_signal() -> None:
                    async for _ in signals:
                        stop.set()
                        return
                n.start_soon(on_signal)
                await stop.wait()
                n.cancel_scope.cancel()
        log.info("shutting down: stopping runs")
        await services.supervisor.shutdown()
        services.outbox.flush()
        services.drain.set()
        services.supervisor.events.wake_all()   # SSE streams see the drain and end
        await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        if services.meter is not None:
            await nursery.start(serve_meter, services.meter)
        resume = interrupted if cfg.resumeInterruptedOnBoot else []
        await nursery.start(partial(services.supervisor.serve, resume=resume))
        nursery.start_soon(services.outbox.maintain)
        async with trio.open_nursery() as web:
            binds = await web.start(partial(hypercorn.trio.serve, app, hc, shutdown_trigger=shutdown_trigger))
            url = binds[0] if binds else f"http://127.0.0.1:{cfg.port}"
            services.supervisor.public_base = cfg.publicUrl or url
            task_status.started((url, services))
        # Hypercorn returned after the drain; the supervisor has no runs left.
        nursery.cancel_scope.cancel()


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


async def serve_meter(meter: Meter, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The codex usage meter: its own loopback port (plain HTTP; agents reach it by URL)."""
    async with trio.open_nursery() as n:
        meter.url = await n.start(serve_on_loopback, meter)
        task_status.started()


def print_ready(url: str, cfg: Config, out: Any = sys.stderr) -> None:
    ws = url.replace("http://", "ws://") + "/mcpl?token=<token>"
    print(f"swarmbase: listening on {url} (dashboard) and {ws}", file=out, flush=True)
