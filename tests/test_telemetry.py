"""OpenTelemetry traces: the observer is driven with real Run and AgentRecord objects, the
official OTLP/HTTP exporter posts to a receiver on loopback, and the receiver decodes the
protobuf with the official opentelemetry-proto types."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest
import trio

from swarmbase import config, telemetry
from swarmbase.daemon import serve_on_loopback
from swarmbase.prices import Tokens
from swarmbase.runs import records
from swarmbase.runs.model import Run, iso
from swarmbase.runs.records import AgentRecord

from .fakes.otlp import OtlpReceiver, attrs_of

CANARY = "canary-prompt-7f3a9c"


@attrs.define
class NestedRecord(AgentRecord):
    """AgentRecord with the `workflow` field the core adds for nested workflows."""
    workflow: str = ""


def make_run(tmp_path: Path) -> Run:
    now = time.time() - 30
    run = Run(id="run_0123456789ab", caller="alice", dir_name="d", created_at=now, label="traced run",
              budget_usd=5.0, budget_tokens=1_000_000)
    run.set_status("running", now + 0.1)
    return run


def make_agent(tmp_path: Path, n: int, *, engine: str = "claude", model: str = "claude-sonnet-5-5",
               state: str = "done", workflow: str = "", cost: float = 0.02, budget_wait: bool = False) -> NestedRecord:
    rec = NestedRecord(n=n, dir=tmp_path / "agents" / str(n), label=f"agent-{n}", engine=engine, model=model,
                       profile="read", workflow=workflow)
    rec.set_state("queued")
    records.create(rec.dir, rec, f"{CANARY} prompt {n}", {})
    if budget_wait:
        rec.history.append({"state": "waiting-budget", "at": iso(time.time() + 0.5)})
    rec.set_state("running")
    rec.cost_usd, rec.tokens = cost, Tokens(input=1000 * n, output=100 * n, cache_read=10 * n)
    if state == "failed":
        rec.error = "the model said no"
    rec.set_state(state, **({"error": rec.error} if rec.error else {}))
    (rec.dir / "transcript.jsonl").write_text(json.dumps({"type": "result", "result": f"{CANARY} output {n}"}) + "\n")
    return rec


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> tuple[OtlpReceiver, str]:
    r = OtlpReceiver()
    url = await nursery.start(serve_on_loopback, r)
    return r, url


async def drive(obs: telemetry.TraceObserver, tmp_path: Path) -> tuple[Run, list[NestedRecord]]:
    run = make_run(tmp_path)
    obs.run_started(run)
    obs.phase(run, "fan-out", "")
    obs.workflow_started(run, "3", "inner workflow")
    agents = [make_agent(tmp_path, 1, budget_wait=True), make_agent(tmp_path, 2, engine="codex", model="gpt-5",
                                                                   state="failed", cost=0.0),
              make_agent(tmp_path, 3, workflow="3")]
    for rec in agents:
        obs.agent_started(run, rec)
        obs.agent_ended(run, rec)
    obs.workflow_ended(run, "3", True)
    run.spent_usd = sum(a.cost_usd for a in agents)
    run.agents_total = run.agents_done = 3
    run.error = "agent-2 failed"
    run.set_status("failed", time.time())
    obs.run_ended(run)
    with trio.fail_after(30):
        assert await trio.to_thread.run_sync(obs.force_flush)
    return run, agents


async def test_trace_of_a_run(receiver: tuple[OtlpReceiver, str], tmp_path: Path) -> None:
    rcv, url = receiver
    cfg = SimpleNamespace(telemetry=SimpleNamespace(otlpEndpoint=url, includeContent=False))
    obs = telemetry.make_trace_observer(cfg, environ={}, schedule_delay_ms=50)
    assert obs is not None
    run, agents = await drive(obs, tmp_path)
    await trio.to_thread.run_sync(obs.shutdown)

    assert {p for p, _, _ in rcv.posts} == {"/v1/traces"}
    assert all(h["content-type"] == "application/x-protobuf" for _, h, _ in rcv.posts)
    resource = attrs_of(rcv.posts[0][2].resource_spans[0].resource)
    assert resource["service.name"] == "swarmbase"
    spans = rcv.spans()
    by_name = {s.name: s for s in spans}
    assert len(spans) == 5 and len({s.trace_id for s in spans}) == 1          # one trace per run
    root = by_name["swarmbase.run"]
    assert root.parent_span_id == b""
    ra = attrs_of(root)
    assert ra["swarmbase.run_id"] == run.id and ra["swarmbase.caller"] == "alice"
    assert ra["swarmbase.cost_usd"] == pytest.approx(0.04) and ra["swarmbase.status"] == "failed"
    assert root.status.code == root.status.STATUS_CODE_ERROR and "agent-2 failed" in root.status.message
    assert [e.name for e in root.events] == ["phase"] and attrs_of(root.events[0])["swarmbase.phase"] == "fan-out"
    wf = by_name["swarmbase.workflow 3"]
    assert wf.parent_span_id == root.span_id
    for rec in agents:
        span = by_name[f"invoke_agent agent-{rec.n}"]
        a = attrs_of(span)
        assert span.parent_span_id == (wf.span_id if rec.workflow == "3" else root.span_id)
        assert a["gen_ai.system"] == ("openai" if rec.engine == "codex" else "anthropic")
        assert a["gen_ai.request.model"] == rec.model
        assert a["gen_ai.usage.input_tokens"] == 1000 * rec.n and a["gen_ai.usage.output_tokens"] == 100 * rec.n
        assert a["swarmbase.cost_usd"] == pytest.approx(rec.cost_usd)
        assert a["swarmbase.caller"] == "alice" and a["swarmbase.run_id"] == run.id
        assert span.start_time_unix_nano == int(rec.queued_at * 1e9)
        assert span.end_time_unix_nano == int(rec.ended_at * 1e9)
        assert [e.name for e in span.events][0] == "agent.queued" and "agent.running" in [e.name for e in span.events]
    failed = by_name["invoke_agent agent-2"]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR and failed.status.message == "the model said no"
    waited = attrs_of(by_name["invoke_agent agent-1"])
    assert "agent.waiting-budget" in [e.name for e in by_name["invoke_agent agent-1"].events]
    assert waited["swarmbase.wait.waiting_budget_s"] >= 0 and "swarmbase.wait.queued_s" in waited
    blob = b"".join(req.SerializeToString() for _, _, req in rcv.posts)
    assert CANARY.encode() not in blob                                       # no content unless asked


async def test_content_only_when_asked(receiver: tuple[OtlpReceiver, str], tmp_path: Path) -> None:
    rcv, url = receiver
    obs = telemetry.TraceObserver(endpoint=url + "/v1/traces", include_content=True, schedule_delay_ms=50,
                                  redactor_for=lambda run_id: lambda text: text.replace(" prompt ", " [redacted] "))
    await drive(obs, tmp_path)
    await trio.to_thread.run_sync(obs.shutdown)
    a = attrs_of(next(s for s in rcv.spans() if s.name == "invoke_agent agent-1"))
    assert json.loads(a["gen_ai.input.messages"])[0]["parts"][0]["content"] == f"{CANARY} [redacted] 1"
    assert json.loads(a["gen_ai.output.messages"])[0]["parts"][0]["content"] == f"{CANARY} output 1"


async def test_dead_collector_never_touches_runs(tmp_path: Path) -> None:
    """Nothing listens on the endpoint: every observer call returns, flush reports failure,
    and closing keeps to its deadline."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    obs = telemetry.TraceObserver(endpoint=f"http://127.0.0.1:{port}/v1/traces", schedule_delay_ms=10)
    run = make_run(tmp_path)
    obs.run_started(run)
    for n in range(1, 21):
        rec = make_agent(tmp_path, n)
        obs.agent_started(run, rec)
        obs.agent_ended(run, rec)
    run.set_status("completed", time.time())
    obs.run_ended(run)
    with trio.fail_after(20):
        await obs.aclose(timeout_s=2.0)


def test_settings() -> None:
    off = config.Telemetry()
    assert telemetry.telemetry_settings(off, {}) is None
    assert telemetry.telemetry_settings(config.Telemetry(otlpEndpoint=None), {}) is None
    on = config.Telemetry(otlpEndpoint="http://collector:4318/", includeContent=True)
    assert telemetry.telemetry_settings(on, {}) == telemetry.Settings("http://collector:4318/v1/traces", True)
    full = config.Telemetry(otlpEndpoint="http://c:4318/v1/traces")
    assert telemetry.telemetry_settings(full, {}).endpoint == "http://c:4318/v1/traces"
    assert telemetry.telemetry_settings(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == \
        telemetry.Settings(None, False)
    assert telemetry.telemetry_settings(off, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"}) is not None
    assert telemetry.telemetry_settings(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert telemetry.telemetry_settings(on, {"OTEL_TRACES_EXPORTER": "none"}) is None


def test_waits_from_history() -> None:
    h = [{"state": "queued", "at": "2026-03-01T12:00:00.000Z"}, {"state": "waiting-budget", "at": "2026-03-01T12:00:01.500Z"},
         {"state": "running", "at": "2026-03-01T12:00:04.000Z"}, {"state": "done", "at": "2026-03-01T12:00:09.000Z"}]
    assert telemetry.state_waits(telemetry.history_times(h)) == {"queued": 1.5, "waiting-budget": 2.5}
    assert telemetry.parse_iso("2026-03-01T12:00:00Z") == telemetry.parse_iso("2026-03-01T12:00:00.000Z")
    assert telemetry.parse_iso("not a time") is None and telemetry.parse_iso(None) is None


def test_off_means_opentelemetry_is_never_imported(tmp_path: Path) -> None:
    """The daemon's modules and the telemetry/metrics modules import no OpenTelemetry while
    telemetry is off (start-up time and idle RSS)."""
    code = ("import sys, types\n"
            "import swarmbase.daemon, swarmbase.telemetry as t, swarmbase.metrics, dashboard.spend, dashboard.audit_view\n"
            "assert t.make_trace_observer(types.SimpleNamespace(telemetry=swarmbase.config.Telemetry()), {}) is None\n"
            "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
            "assert not bad, bad\n"
            "print('clean')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                       cwd=Path(__file__).resolve().parent.parent)
    assert p.returncode == 0 and "clean" in p.stdout, p.stderr
