"""Prometheus metrics at GET /metrics (the official prometheus-client, text format 0.0.4).

Counters move through the observer methods (runs/observers.py): runs started and
ended, agents ended, spend and tokens by caller and engine, notices delivered and failed.
Gauges are read from the supervisor when scraped: runs by status, active runs, agents by
engine and state, the outbox depth, damaged files, SSE clients, and the event-loop lag the
daemon's LagProbe (swarmbase/lag.py) feeds in as sleep overshoot.

Access: a request that came through the tailnet (it carries Tailscale-User-Login) needs a
login listed in dashboard.adminLogins; a plain loopback request (a local Prometheus) is
served. The dashboard's Host allowlist applies as to every route.

Each daemon gets its own registry (not prometheus_client's global one), so several daemons
in one process (tests) never share counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from quart import Blueprint, Quart, Response, request

from . import __version__
from .config import Config
from .runs.observers import NoObserver

if TYPE_CHECKING:
    from .prices import Tokens
    from .runs.env import RunEnv
    from .runs.model import Run
    from .runs.records import AgentRecord
    from .runs.supervisor import Supervisor

RUN_STATUSES = ("queued", "running", "completed", "failed", "cancelled", "interrupted")
WAITING_STATES = ("queued", "waiting-budget", "waiting-node", "running")
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LOCAL_PEERS = {"127.0.0.1", "::1", "<local>"}     # "<local>": no network peer (in-process clients)


class _StateCollector:
    """Gauges computed from the supervisor at scrape time."""

    def __init__(self, metrics: "Metrics") -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []        # nothing to check at registration; collect() reads live state

    def collect(self) -> Iterator[Metric]:
        sup, env = self.m.sup, self.m.env       # None: a Metrics watching no daemon (zero gauges)
        runs = list(sup.runs.values()) if sup is not None else []
        by_status = GaugeMetricFamily("swarmbase_runs", "Runs the daemon holds, by status", labels=["status"])
        counts = {s: 0 for s in RUN_STATUSES}
        for r in runs:
            counts[r.status] = counts.get(r.status, 0) + 1
        for s, c in counts.items():
            by_status.add_metric([s], c)
        yield by_status
        yield GaugeMetricFamily("swarmbase_active_runs", "Runs queued or running",
                                value=sum(1 for r in runs if r.status in ("queued", "running")))
        agents = GaugeMetricFamily("swarmbase_agents", "Agents of runs in flight, by engine and state",
                                   labels=["engine", "state"])
        tally: dict[tuple[str, str], int] = {}
        for live in list(sup.live.values()) if sup is not None else []:
            for rec in list(live.agents.values()):
                if rec.state in WAITING_STATES:
                    tally[(rec.engine, rec.state)] = tally.get((rec.engine, rec.state), 0) + 1
        for engine in sorted({e for e, _ in tally} | {"claude"}):
            for state in WAITING_STATES:
                agents.add_metric([engine, state], tally.get((engine, state), 0))
        yield agents
        depth = GaugeMetricFamily("swarmbase_outbox_depth", "Run-end notices waiting for their caller's host",
                                  labels=["caller"])
        if env is not None:
            for caller in sorted(c.name for c in env.cfg.callers):
                depth.add_metric([caller], len(env.outbox.pending(caller)))
        yield depth
        yield GaugeMetricFamily("swarmbase_damaged_files", "Files quarantined at boot",
                                value=len(env.store.damaged) if env is not None else 0)
        yield GaugeMetricFamily("swarmbase_sse_clients", "Open dashboard event streams", value=self.m.sse_clients)
        info = GaugeMetricFamily("swarmbase_info", "The daemon's version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info


class Metrics(NoObserver):
    """The registry, the counters, and the observer methods that move them."""

    def __init__(self, sup: Supervisor | None = None, env: RunEnv | None = None) -> None:
        self.sup = sup          # the gauges read the daemon's state when scraped
        self.env = env
        self.sse_clients = 0
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.runs_started = Counter("swarmbase_runs_started", "Runs started", ["caller"], registry=r)
        self.runs_ended = Counter("swarmbase_runs_ended", "Runs ended, by final status", ["caller", "status"],
                                  registry=r)
        self.agents_ended = Counter("swarmbase_agents_ended", "Agents ended, by engine and final state",
                                    ["caller", "engine", "state"], registry=r)
        self.agents_replayed = Counter("swarmbase_agents_replayed", "Agents answered from the journal",
                                       ["caller", "engine"], registry=r)
        self.spend = Counter("swarmbase_spend_usd", "Settled agent spend in USD (estimates included)",
                             ["caller", "engine"], registry=r)
        self.tokens = Counter("swarmbase_tokens", "Agent tokens, by kind", ["caller", "engine", "kind"], registry=r)
        self.notices_delivered = Counter("swarmbase_notices_delivered", "Run-end notices accepted by a host",
                                         ["caller"], registry=r)
        self.notice_failures = Counter("swarmbase_notice_delivery_failures",
                                       "Run-end notice pushes that failed (each retry counts)", ["caller"],
                                       registry=r)
        self.loop_lag = Histogram("swarmbase_event_loop_lag_seconds", "How late the event loop woke a sleeper",
                                  buckets=LAG_BUCKETS, registry=r)
        self.loop_lag_last = Gauge("swarmbase_event_loop_lag_last_seconds", "The last event-loop lag sample",
                                   registry=r)
        ProcessCollector(registry=r)
        r.register(_StateCollector(self))

    # -- observer methods -----------------------------------------------------------
    def run_started(self, run: Run) -> None:
        self.runs_started.labels(run.caller).inc()

    def run_ended(self, run: Run) -> None:
        self.runs_ended.labels(run.caller, run.status).inc()

    def agent_ended(self, run: Run, rec: AgentRecord) -> None:
        self.agents_ended.labels(run.caller, rec.engine, rec.state).inc()
        if rec.replayed:
            self.agents_replayed.labels(run.caller, rec.engine).inc()
            return
        if rec.cost_usd > 0:
            self.spend.labels(run.caller, rec.engine).inc(rec.cost_usd)
        t: Tokens = rec.tokens
        for kind, n in (("input", t.input), ("output", t.output), ("cache_read", t.cache_read),
                        ("cache_write", t.cache_write)):
            if n > 0:
                self.tokens.labels(run.caller, rec.engine, kind).inc(n)

    def notice_failed(self, caller: str, event_id: str, reason: str) -> None:
        self.notice_failures.labels(caller).inc()

    def notice_delivered(self, caller: str, event_id: str) -> None:
        self.notices_delivered.labels(caller).inc()

    # -- the event-loop lag (samples from swarmbase/lag.py) ---------------------------------------------------------
    def record_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)
        self.loop_lag_last.set(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- counting SSE clients -------------------------------------------------------------
    def count_sse(self, app: Quart) -> None:
        """Wrap the app's ASGI entry: a response that starts as text/event-stream counts as
        a client until its request ends."""
        inner = app.asgi_app

        async def asgi(scope: Any, receive: Any, send: Any) -> None:  # ASGI: untyped dicts
            if scope.get("type") != "http":
                return await inner(scope, receive, send)
            counted = False

            async def send_counting(msg: Any) -> None:
                nonlocal counted
                if msg.get("type") == "http.response.start" and not counted and any(
                        k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                        for k, v in msg.get("headers", [])):
                    counted = True
                    self.sse_clients += 1
                await send(msg)

            try:
                await inner(scope, receive, send_counting)
            finally:
                if counted:
                    self.sse_clients -= 1

        app.asgi_app = asgi  # type: ignore[method-assign]


class Served(Protocol):
    """What the metrics page needs of the daemon's services."""
    cfg: Config
    metrics: Metrics


def register_metrics(app: Quart, services: Served, metrics: Metrics | None = None) -> Metrics:
    """GET /metrics on `app`. Returns the Metrics (the daemon's observers hold it and its
    LagProbe.on_sample points at its record_lag). Registering twice returns the first Metrics."""
    if "metrics" in app.blueprints:
        registered: Metrics = app.extensions["swarmbase.metrics"]
        return registered
    m = metrics or services.metrics
    app.extensions["swarmbase.metrics"] = m
    admins = set(services.cfg.dashboard.adminLogins)
    bp = Blueprint("metrics", __name__)

    @bp.get("/metrics")
    async def metrics_page() -> Response:
        login = request.headers.get("Tailscale-User-Login")
        if login is not None:
            if login not in admins:
                return Response(f"{login or 'this login'} is not listed in dashboard.adminLogins\n", status=403,
                                content_type="text/plain")
        elif request.remote_addr not in LOCAL_PEERS:
            return Response("metrics are served to loopback or to admin logins\n", status=403,
                            content_type="text/plain")
        return Response(m.render(), status=200, content_type=CONTENT_TYPE_LATEST)

    app.register_blueprint(bp)
    m.count_sse(app)
    return m
