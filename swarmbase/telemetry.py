"""OpenTelemetry traces of runs, off by default: one trace per run, exported over OTLP/HTTP.

    run span ("swarmbase.run")
    ├─ workflow span per nested workflow() ("swarmbase.workflow <path>"), nested by path
    └─ agent span per agent() ("invoke_agent <label>"), under its workflow's span

Agent spans carry the GenAI semantic conventions' attributes (gen_ai.system,
gen_ai.request.model, gen_ai.usage.input_tokens / output_tokens, …) plus swarmbase.cost_usd,
swarmbase.caller and swarmbase.run_id; their state history (queued, waiting-budget, running,
…) becomes span events and wait totals; a failed agent or run gets error status. Prompt and
output text are attached only with `telemetry.includeContent`.

Design log:
- This module imports nothing from OpenTelemetry at import time; `make_trace_observer`
  imports the SDK only when telemetry is on, so an idle daemon without it stays small.
- The observer is called synchronously on the event loop (runs/observers.py).
  It only builds span objects; the SDK's BatchSpanProcessor queues finished spans and its
  own thread encodes and posts them, so an export never runs on the loop. A dead or slow
  collector costs a log line in that thread and a dropped batch, never a run.
- An agent's span is made when the agent ends, with its real start time (when it was
  queued): all of its facts are known then, and nothing per agent is held while it runs.
- The provider is private (not the global one) and not shut down at interpreter exit:
  the daemon closes it with a deadline (`aclose`), so a dead collector cannot hold up a stop.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs

from .config import Config, Telemetry
from .runs.model import Run
from .runs.observers import NoObserver
from .runs.records import AgentRecord

log = logging.getLogger("swarmbase.telemetry")

CONTENT_CAP = 64 * 1024            # bytes of prompt or output text attached per agent
SYSTEMS = {"claude": "anthropic", "codex": "openai"}
FAILED_AGENT = ("failed", "interrupted")
FAILED_RUN = ("failed", "interrupted")


@attrs.frozen
class Settings:
    endpoint: str | None           # full traces URL; None: the exporter reads OTEL_EXPORTER_OTLP_* itself
    include_content: bool = False


def telemetry_settings(tel: Telemetry, environ: Mapping[str, str] | None = None) -> Settings | None:
    """On when the config names `telemetry.otlpEndpoint` or the standard
    OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variable is set; OTEL_SDK_DISABLED=true or
    OTEL_TRACES_EXPORTER=none turn it off. The config's endpoint is the collector's base
    URL (like OTEL_EXPORTER_OTLP_ENDPOINT): /v1/traces is added unless present."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    include = bool(tel.includeContent)
    endpoint = tel.otlpEndpoint
    if endpoint:
        endpoint = endpoint.rstrip("/")
        return Settings(endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces", include)
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return Settings(None, include)
    return None


def make_trace_observer(cfg: Config, environ: Mapping[str, str] | None = None, **kw: Any) -> "TraceObserver | None":
    settings = telemetry_settings(cfg.telemetry, environ)
    if settings is None:
        return None
    return TraceObserver(endpoint=settings.endpoint, include_content=settings.include_content, **kw)


def ns(t: float | None) -> int | None:
    return int(t * 1e9) if isinstance(t, (int, float)) else None


def parse_iso(at: Any) -> float | None:
    """The records' ISO times (`2026-03-01T12:00:00.123Z`) as epoch seconds."""
    if not isinstance(at, str):
        return None
    try:
        t = dt.datetime.fromisoformat(at)       # C-fast; takes the Z suffix since Python 3.11
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def clean(attrs_: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry attributes take str/bool/int/float (and lists of them); drop None."""
    return {k: v for k, v in attrs_.items() if isinstance(v, (str, bool, int, float))}


def history_times(history: list[dict[str, Any]]) -> list[tuple[Any, float | None, dict[str, Any]]]:
    """(state, epoch seconds, entry) for each state-history entry, each time parsed once."""
    return [(h.get("state"), parse_iso(h.get("at")), h) for h in history if isinstance(h, dict)]


def state_waits(marks: list[tuple[Any, float | None, dict[str, Any]]]) -> dict[str, float]:
    """Seconds spent in each waiting state before the agent ran (from its state history)."""
    waits: dict[str, float] = {}
    for (state, t, _), (_, t_next, _) in zip(marks, marks[1:], strict=False):
        if state in ("queued", "waiting-budget", "waiting-node") and t is not None and t_next is not None:
            waits[state] = waits.get(state, 0.0) + max(0.0, t_next - t)
    return waits


def read_capped(path: Path, tail: bool = False) -> str | None:
    try:
        with open(path, "rb") as f:
            if tail:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 4 * CONTENT_CAP))
            data = f.read(4 * CONTENT_CAP if tail else CONTENT_CAP)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def agent_output(rec_dir: Path) -> str | None:
    """The agent's final text from its (redacted) transcript: claude's `result` event or
    codex's last agent message."""
    text = read_capped(rec_dir / "transcript.jsonl", tail=True)
    for line in reversed((text or "").splitlines()):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("type") == "result" and isinstance(e.get("result"), str):
            return e["result"][:CONTENT_CAP]
        item = e.get("item") if isinstance(e, dict) else None
        if isinstance(item, dict) and item.get("type") == "agent_message" and isinstance(item.get("text"), str):
            return item["text"][:CONTENT_CAP]
    return None


class _RunSpans:
    def __init__(self, span: Any) -> None:
        self.span = span
        self.workflows: dict[str, Any] = {}


class TraceObserver(NoObserver):
    """The observer (runs/observers.py) that turns runs into traces."""

    def __init__(self, *, endpoint: str | None = None, include_content: bool = False, exporter: Any = None,
                 schedule_delay_ms: int = 1000, redactor_for: Callable[[str], Callable[[str], str] | None] | None = None,
                 version: str | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import Status, StatusCode

        from . import __version__
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
            exporter = OTLPSpanExporter(endpoint=endpoint)
        self.include_content = include_content
        self.redactor_for = redactor_for
        self._status, self._code = Status, StatusCode
        self._provider = TracerProvider(resource=Resource.create({"service.name": "swarmbase",
                                                                  "service.version": version or __version__}),
                                        shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_ms))
        self._tracer = self._provider.get_tracer("swarmbase", version or __version__)
        self._runs: dict[str, _RunSpans] = {}

    # -- helpers ------------------------------------------------------------------
    def _root_context(self) -> Any:
        from opentelemetry.context import Context
        return Context()          # a fresh trace, whatever context the calling task carries

    def _in(self, span: Any) -> Any:
        from opentelemetry.trace import set_span_in_context
        return set_span_in_context(span, self._root_context())

    def _run(self, run: Run) -> _RunSpans:
        spans = self._runs.get(run.id)
        if spans is None:        # an event for a run whose start this observer did not see
            self.run_started(run)
            spans = self._runs[run.id]
        return spans

    def _parent(self, run: Run, workflow: str) -> Any:
        spans = self._run(run)
        path = workflow
        while path:
            if path in spans.workflows:
                return spans.workflows[path]
            path = path.rsplit("/", 1)[0] if "/" in path else ""
        return spans.span

    def _error(self, span: Any, message: str | None) -> None:
        span.set_status(self._status(self._code.ERROR, (message or "")[:500]))

    # -- the observer methods ---------------------------------------------------------
    def run_started(self, run: Run) -> None:
        span = self._tracer.start_span("swarmbase.run", context=self._root_context(), start_time=ns(run.created_at),
                                       attributes=clean({
                                           "swarmbase.run_id": run.id, "swarmbase.caller": run.caller,
                                           "swarmbase.label": run.display_label,
                                           "swarmbase.profile": run.profile, "swarmbase.budget_usd": run.budget_usd,
                                           "swarmbase.budget_tokens": run.budget_tokens,
                                           "swarmbase.resumed_from": run.resumed_from,
                                           "gen_ai.operation.name": "invoke_workflow"}))
        self._runs[run.id] = _RunSpans(span)

    def run_ended(self, run: Run) -> None:
        spans = self._run(run)
        self._runs.pop(run.id, None)
        for path in sorted(spans.workflows, reverse=True):      # deepest first
            spans.workflows[path].end()
        span = spans.span
        span.set_attributes(clean({
            "swarmbase.status": run.status, "swarmbase.cost_usd": round(run.spent_usd, 6),
            "swarmbase.cost_estimated": run.spent_estimated, "swarmbase.agents.total": run.agents_total,
            "swarmbase.agents.done": run.agents_done, "swarmbase.error": run.error,
            "swarmbase.spent_tokens": run.spent_tokens}))
        if run.status in FAILED_RUN:
            self._error(span, run.error)
        span.end(end_time=ns(run.ended_at))

    def workflow_started(self, run: Run, path: str, label: str | None = None) -> None:
        spans = self._run(run)
        parent = self._parent(run, path.rsplit("/", 1)[0] if "/" in path else "")
        spans.workflows[path] = self._tracer.start_span(
            f"swarmbase.workflow {path}", context=self._in(parent),
            attributes=clean({"swarmbase.run_id": run.id, "swarmbase.caller": run.caller,
                              "swarmbase.workflow": path, "swarmbase.label": label}))

    def workflow_ended(self, run: Run, path: str, ok: bool) -> None:
        span = self._run(run).workflows.pop(path, None)
        if span is None:
            return
        if not ok:
            self._error(span, "the nested workflow failed")
        span.end()

    def phase(self, run: Run, title: str, workflow: str = "") -> None:
        self._parent(run, workflow).add_event("phase", clean({"swarmbase.phase": title,
                                                              "swarmbase.workflow": workflow}))

    def agent_started(self, run: Run, rec: AgentRecord) -> None:
        """Nothing: the agent's span is made whole when it ends (see the design log)."""

    def agent_ended(self, run: Run, rec: AgentRecord) -> None:
        workflow = rec.workflow or ""
        tokens = rec.tokens
        system = SYSTEMS.get(rec.engine, rec.engine)
        start = rec.queued_at if isinstance(rec.queued_at, (int, float)) else rec.started_at
        attributes = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.system": system, "gen_ai.provider.name": system,
            "gen_ai.agent.name": rec.label, "gen_ai.request.model": rec.model,
            "gen_ai.usage.input_tokens": tokens.input, "gen_ai.usage.output_tokens": tokens.output,
            "gen_ai.usage.cache_read.input_tokens": tokens.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": tokens.cache_write,
            "swarmbase.cost_usd": round(rec.cost_usd, 6), "swarmbase.cost_estimated": rec.cost_estimated,
            "swarmbase.priced": rec.priced, "swarmbase.caller": run.caller,
            "swarmbase.run_id": run.id, "swarmbase.agent.n": rec.n, "swarmbase.agent.state": rec.state,
            "swarmbase.engine": rec.engine, "swarmbase.profile": rec.profile, "swarmbase.workflow": workflow,
            "swarmbase.replayed": rec.replayed, "swarmbase.phase": rec.phase, "swarmbase.error": rec.error,
            "swarmbase.duration_s": rec.duration_s, "swarmbase.node": rec.node,
        }
        marks = history_times(rec.history)
        for state, secs in state_waits(marks).items():
            attributes[f"swarmbase.wait.{state.replace('-', '_')}_s"] = round(secs, 3)
        if self.include_content:
            attributes.update(self._content(run, rec))
        span = self._tracer.start_span(f"invoke_agent {rec.label}", context=self._in(self._parent(run, workflow)),
                                       start_time=ns(start), attributes=clean(attributes))
        for state, t, h in marks:
            if t is not None:
                detail = {f"swarmbase.{k}": v for k, v in h.items() if k not in ("state", "at")}
                span.add_event(f"agent.{state}", clean(detail), timestamp=ns(t))
        if rec.state in FAILED_AGENT:
            self._error(span, rec.error)
        span.end(end_time=ns(rec.ended_at))

    def _content(self, run: Run, rec: AgentRecord) -> dict[str, str]:
        redact = self.redactor_for(run.id) if self.redactor_for else None
        out: dict[str, str] = {}
        prompt = read_capped(Path(rec.dir) / "prompt.txt")
        output = agent_output(Path(rec.dir))
        for key, text, role in (("gen_ai.input.messages", prompt, "user"), ("gen_ai.output.messages", output, "assistant")):
            if text is not None:
                text = redact(text) if redact else text
                out[key] = json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}], ensure_ascii=False)
        return out

    def notice_failed(self, caller: str, event_id: str, reason: str) -> None:
        """Not traced (the run's trace has ended); counted by the metrics observer."""

    def notice_delivered(self, caller: str, event_id: str) -> None:
        """Not traced; see notice_failed."""

    # -- flushing and closing -------------------------------------------------------------
    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Blocking: call from a thread (tests, benches)."""
        return bool(self._provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        """Blocking: ends open spans' export and stops the export thread."""
        self._provider.shutdown()

    async def aclose(self, timeout_s: float = 3.0) -> None:
        """Flush and stop within `timeout_s`; a dead collector is walked away from."""
        import trio
        with trio.move_on_after(timeout_s):
            await trio.to_thread.run_sync(self._flush_and_stop, int(timeout_s * 1000), abandon_on_cancel=True)

    def _flush_and_stop(self, timeout_ms: int) -> None:
        try:
            self._provider.force_flush(timeout_ms)
            self._provider.shutdown()
        except Exception:          # noqa: BLE001 - closing must never fail the daemon's stop
            log.warning("telemetry: closing the exporter failed", exc_info=True)
