"""The daemon: one Hypercorn server with a Quart-Trio app on 127.0.0.1:<port>, the
supervisor beside it, and a graceful drain on SIGTERM/SIGINT.

Shutdown order (Hypercorn installs no signal handlers and does not close open
WebSockets itself): stop accepting runs (in the signal handler itself), stop every
in-flight run and record it as interrupted (its notice goes to the outbox), let every
connected host receive and answer what is pending (at most DELIVERY_DRAIN_S), write the
acknowledgements and close the outbox, close every WebSocket with 1001, then let
Hypercorn return.
"""

from __future__ import annotations

import logging
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING, Any, Mapping

import attrs
import hypercorn.config
import hypercorn.trio
import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from . import identity, live_reload
from .config import Config, key_file_problems, key_files_unfilled
from .engines.base import Engine
from .engines.claude_agent import ClaudeEngine
from .caller_secrets import caller_secrets
from .engines.codex_agent import CodexEngine
from .engines.codex_deny import CodexDenyList
from .engines.bearer_relay import serve_on_loopback as serve_on_loopback, serve_relay  # the tests' servers too
from .engines.key_door import KeyDoor
from .engines.meter import Meter
from .engines.think_codex import CodexThink
from .engines.think_route import ThinkRouter
from .engines.read_run import ClaudeRead
from .engines.think_run import ClaudeThink, InDaemon
from .lag import LagProbe
from .launch.local import LocalLauncher
from .launch.spec import Launcher, Placements, ProcessOpener
from .mcpl.refusals import token_sha256
from .mcpl.session import CLOSE_GOING_AWAY, Hub, Session, caller_for_token
from .metrics import Metrics, register_metrics
from .notify.outbox import Outbox
from .progress_feed import ProgressFeed
from .runs import worktrees
from .runs.agent_service import AgentService
from .runs.agents import Agents
from .runs.env import RunEnv
from .runs.git_sandbox import SandboxedGit
from .runs.model import Run
from .runs.records import Redactor
from .runs.runners import Runners
from .runs.store import RunStore
from .runs.supervisor import Supervisor
from .script.runner import RunnerLimits
from .statelock import StateLock
from .telemetry import make_trace_observer

if TYPE_CHECKING:
    from .launch.ray import RayLauncher

log = logging.getLogger("swarmbase")

DELIVERY_DRAIN_S = 5.0      # how long shutdown waits for connected hosts to answer pushes


@attrs.define
class Services:
    """The daemon's parts, built in build_services in the order they depend on each other:
    the state, the RunEnv, the launchers, the engines, the agent service and the runners,
    and the Supervisor last."""
    cfg: Config
    env: RunEnv
    launcher: LocalLauncher
    supervisor: Supervisor
    runners: Runners
    hub: Hub
    metrics: Metrics
    meter: Meter | None = None
    key_door: KeyDoor | None = None       # when claude is configured
    ray: RayLauncher | None = None        # when placement.ray is configured
    drain: trio.Event = attrs.Factory(trio.Event)
    progress: ProgressFeed | None = None
    in_daemon: list[InDaemon] = attrs.Factory(list)    # think engines' HTTP clients, closed at stop
    lag: LagProbe = attrs.Factory(LagProbe)

    @property
    def store(self) -> RunStore:
        return self.env.store

    @property
    def outbox(self) -> Outbox:
        return self.env.outbox


def build_services(cfg: Config, agents: AgentService | None = None,
                   limits: RunnerLimits | None = None) -> Services:
    """Everything the daemon serves with, each part given what it uses. `agents`: another
    agent service (tests)."""
    (cfg.state_dir / "procs").mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg.homes_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cfg.homes_dir.chmod(0o700)
    env = RunEnv(cfg=cfg, store=RunStore(cfg.state_dir), outbox=Outbox(cfg.state_dir / "outbox.jsonl"))
    for secret in caller_secrets(cfg):
        env.redact.add(secret)
    launcher = LocalLauncher(mode=cfg.sandbox_mode, homes=cfg.homes_dir, procs=cfg.state_dir / "procs",
                             forbidden=[cfg.state_dir, cfg.homes_dir], sandbox_user=cfg.sandboxUser,
                             identities=identity.Identities(cfg.state_dir / identity.ALLOCATIONS,
                                                            identity.UidRange.parse(cfg.sandboxUids or identity.DEFAULT_UIDS)))
    ray = None
    others: dict[str, Launcher] = {}
    if cfg.placement.ray is not None:
        from .launch.ray import RayLauncher     # imports Ray itself only when it connects
        ray = others["ray"] = RayLauncher(cfg, launcher.user_for)
    runs: dict[str, Run] = {}                    # the registry: the Supervisor's, read by the deny list
    engines, meter, key_door = build_engines(cfg, env.redact, env.store, runs, launcher)
    if agents is None:
        agents = Agents(env, engines, Placements(launcher, **others))
    runners = Runners(cfg, launcher, limits)
    sup = Supervisor(env, agents, runners, runs)
    metrics = Metrics(sup, env)
    env.observers.add(metrics)
    progress = ProgressFeed(env.outbox, env.links.run, env.redact)
    env.observers.add(progress)
    routers = [e for e in engines.values() if isinstance(e, ThinkRouter)]
    in_daemon: list[InDaemon] = []
    for r in [*(e.in_daemon for e in routers), *(e.reader for e in routers)]:
        if isinstance(r, InDaemon):
            in_daemon.append(r)
    return Services(cfg=cfg, env=env, launcher=launcher, supervisor=sup, runners=runners, hub=Hub(env.observers),
                    metrics=metrics, meter=meter, key_door=key_door, ray=ray, progress=progress, in_daemon=in_daemon)


def build_engines(cfg: Config, redact: Redactor, store: RunStore, runs: Mapping[str, Run],
                  opener: ProcessOpener | None = None) -> tuple[dict[str, Engine], Meter | None, KeyDoor | None]:
    """The configured engines by name, the codex meter when codex is configured, and the
    claude key door when claude is. `opener` starts in-daemon read agents' tool hosts
    (None: read agents run their CLI, as on a Ray node)."""
    engines: dict[str, Engine] = {}
    meter = key_door = None
    if cfg.engines.claude is not None:
        key_door = KeyDoor(redact=redact)
        engines["claude"] = ThinkRouter(ClaudeEngine(cfg, key_door, redact=redact), ClaudeThink(cfg),
                                        cfg.engines.claude.inProcessThink,
                                        ClaudeRead(cfg, opener) if opener is not None else None)
    if cfg.engines.codex is not None:
        meter = Meter(redact=redact)
        engines["codex"] = ThinkRouter(CodexEngine(cfg, meter, deny=CodexDenyList(cfg, store, runs)), CodexThink(cfg),
                                       cfg.engines.codex.inProcessThink)
    return engines, meter, key_door


class _QuartTransport:
    """Bound to one connection's websocket object: Quart's `websocket` global is a
    context variable, and sessions are also closed from other connections' tasks."""

    def __init__(self) -> None:
        self.ws = websocket._get_current_object()  # type: ignore[attr-defined]  # a werkzeug LocalProxy

    async def send(self, text: str) -> None:
        await self.ws.send(text)

    async def receive(self) -> str | bytes:
        return await self.ws.receive()

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code, reason)


def make_app(services: Services) -> QuartTrio:
    from dashboard.app import register as register_dashboard
    from dashboard.audit_view import register_audit
    from dashboard.spend import register_spend

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
        token = websocket.args.get("token")
        caller = caller_for_token(services.cfg, token)
        session = Session(_QuartTransport(), caller, services.supervisor, services.outbox, services.hub,
                          peer=websocket.remote_addr or "unknown",
                          presented_sha256=None if caller is not None else token_sha256(token))
        async with trio.open_nursery() as nursery:
            async def serve() -> None:
                await session.serve()
                nursery.cancel_scope.cancel()
            nursery.start_soon(serve)
            await services.drain.wait()
            nursery.cancel_scope.cancel()
        await session.close(CLOSE_GOING_AWAY, "server shutting down")

    register_dashboard(app, services)
    register_spend(app, services)
    register_audit(app, services)
    register_metrics(app, services, services.metrics)
    close_when_asked(app)
    return app


def close_when_asked(app: Any) -> None:
    """Send every response's last body in a shielded scope, so `Connection: close` (and
    HTTP/1.0) gets its EOF. Hypercorn closes such a connection from inside that send
    (its stream ends, the socket is shut down and closed), but by then quart-trio has
    seen the ASGI disconnect and cancelled the request's nursery, so the shutdown's first
    checkpoint raised Cancelled and the socket stayed open: a client reading to EOF hung
    (issue 25 #8; Hypercorn 0.18, quart-trio 0.12). Hypercorn already shields the bytes'
    own send; this only lets its close run to the end."""
    inner = app.asgi_app

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return await inner(scope, receive, send)

        async def send_last_shielded(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)
        await inner(scope, receive, send_last_shielded)

    app.asgi_app = asgi


async def serve(cfg: Config, *, agents: AgentService | None = None, limits: RunnerLimits | None = None,
                stop: trio.Event | None = None, locked: bool = False,
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run the daemon until SIGTERM/SIGINT (or `stop`). task_status gets the bound URL.
    Raises LockHeld, touching nothing, when another daemon holds the state dir (unless the
    caller already holds the lock: `locked`)."""
    lock = None if locked else StateLock(cfg.state_dir).acquire()
    hangups = live_reload.Hangups()     # from here a SIGHUP reloads the config (once serving) instead of killing
    try:
        await _serve_locked(cfg, agents=agents, limits=limits, stop=stop, task_status=task_status, hangups=hangups)
    finally:
        hangups.restore()
        if lock is not None:
            lock.release()


async def _serve_locked(cfg: Config, *, agents: AgentService | None, limits: RunnerLimits | None,
                        stop: trio.Event | None, task_status: Any, hangups: live_reload.Hangups) -> None:
    services = build_services(cfg, agents, limits)
    # Never run a child with privilege silently: a host without user namespaces (or
    # libseccomp) stops the daemon here, naming the cause.
    await services.launcher.self_check()
    if cfg.sandbox_mode == "bwrap":
        log.info("children run sandboxed as %s, without capabilities", services.launcher.describe_users())
    if services.launcher.identities is not None:
        # Allocated now, not at a caller's first agent: the operator can chown its roots
        # to the uid this line (and identities.json) names before anything runs.
        for c in cfg.callers:
            log.info("caller %s: children run as uid %d", c.name, services.launcher.identities.user_for(c.name).uid)
    for name, problem in key_file_problems(cfg):
        log.error("caller %s: %s; that caller's runs are refused until it is fixed, the others are served",
                  name, problem)
    for name, problem in key_files_unfilled(cfg):
        log.warning("caller %s: %s; that caller's agents fail until then", name, problem)
    interrupted = services.supervisor.recover()
    if interrupted:
        log.warning("marked %d runs interrupted after an unclean stop", len(interrupted))
    # Worktrees a dead daemon left registered in users' repositories (issue 25).
    sup = services.supervisor
    await worktrees.recover([(services.store.dir(r), r.caller) for r in sup.runs.values()],
                            git=SandboxedGit(services.launcher))
    stop = trio.Event() if stop is None else stop
    app = make_app(services)
    # Off unless telemetry.otlpEndpoint or OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set; only
    # then is OpenTelemetry imported. Content (includeContent) is redacted like the records.
    tracer = make_trace_observer(cfg, redactor_for=lambda run_id: services.env.redact)
    if tracer is not None:
        services.env.observers.add(tracer)
    hc = hypercorn.config.Config()
    hc.bind = [f"127.0.0.1:{cfg.port}"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = 3
    hc.websocket_ping_interval = 20
    hc.websocket_max_message_size = 4 * 1024 * 1024

    async def shutdown_trigger() -> None:
        await _until_stopped(stop, services.supervisor)
        log.info("shutting down: stopping runs")
        await services.supervisor.shutdown()
        # Connected hosts get the notices now queued (interrupted runs), and every answer
        # on the wire is acknowledged before the outbox closes (issue 25 #2).
        with trio.move_on_after(DELIVERY_DRAIN_S):
            await services.hub.drain()
        services.outbox.flush()
        services.outbox.close()
        services.drain.set()
        services.env.events.wake_all()           # SSE streams see the drain and end
        if tracer is not None:
            await tracer.aclose(3.0)             # flush within 3 s; a dead collector is left behind
        await trio.sleep(0.1)

    try:
        async with trio.open_nursery() as nursery:
            for relay in (services.meter, services.key_door):
                if relay is not None:
                    await nursery.start(serve_relay, relay)
            await nursery.start(services.launcher.deleter.serve)
            resume = interrupted if cfg.resumeInterruptedOnBoot else []
            if services.ray is not None:
                await nursery.start(services.ray.serve)
            await nursery.start(services.runners.serve)
            await nursery.start(partial(services.supervisor.serve, resume=resume))
            nursery.start_soon(services.outbox.maintain)
            if services.progress is not None:
                nursery.start_soon(services.progress.serve)
            services.lag.busy = lambda: bool(services.supervisor.live)
            services.lag.on_sample = services.metrics.record_lag
            nursery.start_soon(services.lag.run)
            nursery.start_soon(hangups.serve, partial(live_reload.reload_once, services))
            # Quota callers' spend this month, read from their agent records after the daemon listens.
            nursery.start_soon(partial(trio.to_thread.run_sync, services.supervisor.quota.prime_all,
                                       services.supervisor.quota.begin_priming(cfg.callers)))
            async with trio.open_nursery() as web:
                binds = await web.start(partial(hypercorn.trio.serve, app, hc, shutdown_trigger=shutdown_trigger))
                url = binds[0] if binds else f"http://127.0.0.1:{cfg.port}"
                services.env.links.base = cfg.publicUrl or url
                task_status.started((url, services))
            # Hypercorn returned after the drain; the supervisor has no runs left.
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):     # the think engines' pooled connections
            for engine in services.in_daemon:
                await engine.aclose()


async def _until_stopped(stop: trio.Event, sup: Supervisor) -> None:
    """Wait for SIGTERM/SIGINT (or `stop`). The signal handler itself stops the supervisor
    accepting runs, in the instant the signal is handled: with trio's signal receiver a
    `run` that arrived just after SIGTERM was often dispatched before the receiving task
    ran, accepted, then interrupted (2 of 4 trials in issue 25 #2; 3 of 4 here)."""
    token = trio.lowlevel.current_trio_token()

    def on_signal(signum: int, frame: Any) -> None:
        sup.accepting = False
        token.run_sync_soon(stop.set, idempotent=True)    # signal-safe (trio's docs)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        await stop.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    sup.accepting = False


def print_ready(url: str, cfg: Config, out: Any = sys.stderr) -> None:
    ws = url.replace("http://", "ws://") + "/mcpl?token=<token>"
    print(f"swarmbase: listening on {url} (dashboard) and {ws}", file=out, flush=True)
