"""GET /metrics: read back with prometheus_client's own text parser; counters move by the
amounts the observer calls carry, gauges follow the supervisor, access follows the rule."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from swarmbase import config, daemon
from swarmbase.lag import LagProbe
from swarmbase.metrics import Metrics, register_metrics
from swarmbase.prices import Tokens
from swarmbase.runs.model import Run
from swarmbase.runs.records import AgentRecord
from swarmbase.runs.live import LiveRun

from .conftest import write_config

ADMIN = "admin@example.com"
HOST = {"Host": "127.0.0.1:7360"}


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def val(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def services(tmp_path: Path) -> Any:
    state = tmp_path / "state"
    write_config(state, callers=["alice", "bob"], dashboard={"adminLogins": [ADMIN]})
    return daemon.build_services(config.load(state / "config.json"))


def new_run(caller: str, status: str = "running") -> Run:
    run = Run(id=f"run_{time.time_ns() % 10**12:012x}", caller=caller, dir_name="d", created_at=time.time())
    if status != "queued":
        run.set_status(status, time.time())
    return run


def agent(n: int, engine: str, state: str, cost: float = 0.0, tokens: Tokens = Tokens(),
          replayed: bool = False) -> AgentRecord:
    rec = AgentRecord(n=n, dir=Path("/nonexistent"), label=f"a{n}", engine=engine, model=None, profile="read",
                      replayed=replayed)
    rec.state, rec.cost_usd, rec.tokens = state, cost, tokens
    return rec


async def scrape(client: Any, **headers: str) -> tuple[int, str]:
    r = await client.get("/metrics", headers={**HOST, **headers})
    return r.status_code, await r.get_data(as_text=True)


async def test_counters_and_gauges(services: Any) -> None:
    app = daemon.make_app(services)
    m = register_metrics(app, services)
    client = app.test_client()
    sup = services.supervisor
    code, text = await scrape(client)
    before = parse(text)
    assert code == 200 and val(before, "swarmbase_active_runs") == 0
    assert val(before, "swarmbase_info", version="0.1.0") == 1 and ("process_resident_memory_bytes", frozenset()) in before

    # A run of alice's with three agents ending (one replayed) and two in flight.
    run = new_run("alice")
    sup.runs[run.id] = run
    m.run_started(run)
    live = LiveRun(run=run, caller=services.cfg.caller("alice"), env=services.env, slots=trio.Semaphore(1))
    sup.live[run.id] = live
    for rec in (agent(4, "claude", "running"), agent(5, "codex", "queued"), agent(6, "codex", "running")):
        live.agents[rec.n] = rec
    ended = [agent(1, "claude", "done", 0.25, Tokens(input=1000, output=200, cache_read=50)),
             agent(2, "codex", "failed", 0.125, Tokens(input=3000, output=10)),
             agent(3, "claude", "done", 0.0, Tokens(), replayed=True)]
    for rec in ended:
        m.agent_started(run, rec)
        m.agent_ended(run, rec)
    bob = new_run("bob", "queued")
    sup.runs[bob.id] = bob
    m.notice_failed("alice", "e1", "offline")
    m.notice_failed("alice", "e1", "offline")
    m.notice_delivered("alice", "e0")
    services.outbox.add("alice", {"eventId": "run_x:end", "runId": "run_x"})
    code, text = await scrape(client)
    mid = parse(text)
    assert val(mid, "swarmbase_spend_usd_total", caller="alice", engine="claude") == pytest.approx(0.25)
    assert val(mid, "swarmbase_spend_usd_total", caller="alice", engine="codex") == pytest.approx(0.125)
    assert val(mid, "swarmbase_tokens_total", caller="alice", engine="claude", kind="input") == 1000
    assert val(mid, "swarmbase_tokens_total", caller="alice", engine="claude", kind="cache_read") == 50
    assert val(mid, "swarmbase_tokens_total", caller="alice", engine="codex", kind="output") == 10
    assert val(mid, "swarmbase_agents_ended_total", caller="alice", engine="claude", state="done") == 2
    assert val(mid, "swarmbase_agents_replayed_total", caller="alice", engine="claude") == 1
    assert val(mid, "swarmbase_runs_started_total", caller="alice") == 1
    assert val(mid, "swarmbase_runs", status="running") == 1 and val(mid, "swarmbase_runs", status="queued") == 1
    assert val(mid, "swarmbase_active_runs") == 2
    assert val(mid, "swarmbase_agents", engine="claude", state="running") == 1
    assert val(mid, "swarmbase_agents", engine="codex", state="running") == 1
    assert val(mid, "swarmbase_agents", engine="codex", state="queued") == 1
    assert val(mid, "swarmbase_notice_delivery_failures_total", caller="alice") == 2
    assert val(mid, "swarmbase_notices_delivered_total", caller="alice") == 1
    assert val(mid, "swarmbase_outbox_depth", caller="alice") == 1

    # The run ends: a second ending agent adds to the same counters.
    m.agent_ended(run, agent(4, "claude", "done", 0.5, Tokens(input=10)))
    del live.agents[4], live.agents[5], live.agents[6]
    sup.live.pop(run.id)
    run.set_status("completed", time.time())
    m.run_ended(run)
    code, text = await scrape(client)
    after = parse(text)
    assert val(after, "swarmbase_spend_usd_total", caller="alice", engine="claude") - \
        val(mid, "swarmbase_spend_usd_total", caller="alice", engine="claude") == pytest.approx(0.5)
    assert val(after, "swarmbase_runs_ended_total", caller="alice", status="completed") == 1
    assert val(after, "swarmbase_active_runs") == 1 and val(after, "swarmbase_agents", engine="codex", state="running") == 0


def test_registering_twice_is_harmless(services: Any) -> None:
    app = daemon.make_app(services)
    m = register_metrics(app, services)
    assert register_metrics(app, services) is m


async def test_access(services: Any) -> None:
    app = daemon.make_app(services)
    register_metrics(app, services)
    client = app.test_client()
    assert (await scrape(client))[0] == 200                                  # loopback, no tailnet login
    assert (await scrape(client, **{"Tailscale-User-Login": ADMIN}))[0] == 200
    code, text = await scrape(client, **{"Tailscale-User-Login": "mallory@example.com"})
    assert code == 403 and "adminLogins" in text and "swarmbase_" not in text
    assert (await scrape(client, **{"Tailscale-User-Login": ""}))[0] == 403
    r = await client.get("/metrics", headers={"Host": "evil.example"})
    assert r.status_code == 403                                              # the dashboard's Host allowlist


async def test_event_loop_lag(mock_clock: trio.testing.MockClock) -> None:
    m = Metrics()
    probe = LagProbe(tick=1.0)
    probe.on_sample = m.record_lag
    async with trio.open_nursery() as n:
        n.start_soon(probe.run)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.25)                    # the loop "wakes" the sleeper 0.25 s late
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(1.0)                     # on time
        await trio.testing.wait_all_tasks_blocked()
        n.cancel_scope.cancel()
    s = parse(m.render().decode())
    assert val(s, "swarmbase_event_loop_lag_seconds_count") == 2
    assert val(s, "swarmbase_event_loop_lag_seconds_sum") == pytest.approx(0.25)
    assert val(s, "swarmbase_event_loop_lag_last_seconds") == pytest.approx(0.0)
    assert val(s, "swarmbase_event_loop_lag_seconds_bucket", le="0.1") == 1


async def test_sse_clients_counted(services: Any, nursery: trio.Nursery) -> None:
    """A real dashboard event stream over loopback counts while it is open."""
    app = daemon.make_app(services)
    register_metrics(app, services)
    url = await nursery.start(daemon.serve_on_loopback, app)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10, read=None)) as c:
        assert val(parse((await c.get("/metrics")).text), "swarmbase_sse_clients") == 0
        with trio.fail_after(20):
            async with c.stream("GET", "/events") as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                assert val(parse((await c.get("/metrics")).text), "swarmbase_sse_clients") == 1
            while val(parse((await c.get("/metrics")).text), "swarmbase_sse_clients") != 0:
                await trio.sleep(0.02)
