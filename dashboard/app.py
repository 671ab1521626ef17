"""The dashboard: run list, run page (phases, agent rows, timeline, log, result), agent
page (prompt, options, readable transcript), live over SSE, admin cancel/skip.

Server-rendered with Jinja (autoescaped) plus one small script; every asset is served
here, nothing from a CDN. Viewing is open to whoever reaches the port (loopback, or the
tailnet through `tailscale serve`); cancel and skip need an admin login and the
X-SwarmBase header. Every request must name an allowed Host (blocks DNS rebinding).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import urlsplit

import trio
from quart import (Blueprint, Quart, abort, jsonify, make_response, render_template, request,
                   send_from_directory, websocket)

from swarmbase import fsutil
from swarmbase.events import LIST

from . import nodes
from .transcript import render_transcript

HERE = Path(__file__).resolve().parent
KEEPALIVE_S = 15.0
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def allowed_hosts(public_url: str | None) -> set[str]:
    hosts = set(LOOPBACK)
    if public_url:
        host = urlsplit(public_url).hostname
        if host:
            hosts.add(host.lower())
    return hosts


def host_name(host_header: str) -> str:
    h = host_header.strip().lower()
    if h.startswith("["):                    # [::1]:7360
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def sse_frame(seq: int | None, name: str, data: Any) -> bytes:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def register(app: Quart, services: Any) -> None:
    sup = services.supervisor
    hub = sup.events
    hosts = allowed_hosts(services.cfg.publicUrl)
    admins = set(services.cfg.dashboard.adminLogins)
    bp = Blueprint("dashboard", __name__, template_folder=str(HERE / "templates"))

    @bp.get("/static/<path:name>")
    async def asset(name: str) -> Any:
        return await send_from_directory(HERE / "static", name)

    def login() -> str | None:
        return request.headers.get("Tailscale-User-Login")

    def is_admin() -> bool:
        return login() in admins

    @app.before_request
    async def check_host() -> Any:
        if host_name(request.headers.get("Host", "")) not in hosts:
            return jsonify({"error": "host not allowed"}), 403
        return None

    @app.before_websocket
    async def check_ws_host() -> Any:
        if host_name(websocket.headers.get("Host", "")) not in hosts:
            return "host not allowed", 403
        return None

    def run_or_404(run_id: str) -> Any:
        run = sup.runs.get(run_id)
        if run is None:
            abort(404)
        return run

    def agent_rows(run: Any) -> list[dict[str, Any]]:
        phases = sup.phases(run)
        rows = []
        for p in phases:
            for a in p.get("agents", []):
                rows.append({**a, "phase": p.get("title")})
        return rows

    @bp.get("/")
    async def run_list() -> str:
        caller = request.args.get("caller") or None
        status = request.args.get("status") or None
        runs = sorted(sup.runs.values(), key=lambda r: r.created_at, reverse=True)
        callers = sorted({r.caller for r in runs})
        if caller:
            runs = [r for r in runs if r.caller == caller]
        if status:
            runs = [r for r in runs if r.status == status]
        return await render_template("list.html", runs=runs[:500], callers=callers, caller=caller, status=status,
                                     statuses=["queued", "running", "completed", "failed", "cancelled", "interrupted"],
                                     after=hub.stream(LIST).seq, now=time.time())

    @bp.get("/runs/<run_id>")
    async def run_page(run_id: str) -> str:
        run = run_or_404(run_id)
        result = sup.store.result_text(run) if run.status == "completed" else None
        stream = hub.stream(run.id)
        return await render_template(
            "run.html", run=run, phases=sup.phases(run), rows=agent_rows(run),
            log=sup.store.recent_log(run, 500), result=(result or "")[:100_000] if result is not None else None,
            admin=is_admin(), after=stream.seq, now=time.time())

    @bp.get("/runs/<run_id>/agents/<int:n>")
    async def agent_page(run_id: str, n: int) -> Any:
        run = run_or_404(run_id)
        d = sup.store.dir(run) / "agents" / str(n)
        record = fsutil.read_json(d / "agent.json")
        if record is None:
            abort(404)
        live = sup.live.get(run.id)
        if live is not None and n in live.agents:
            record = live.agents[n].to_json()
        entries, _ = fsutil.read_lines(d / "transcript.jsonl")
        if request.args.get("raw"):
            return jsonify({"agent": record, "options": fsutil.read_json(d / "opts.json"), "transcript": entries})
        prompt = (d / "prompt.txt").read_text(errors="replace") if (d / "prompt.txt").exists() else ""
        return await render_template("agent.html", run=run, agent=record, prompt=prompt,
                                     options=json.dumps(fsutil.read_json(d / "opts.json"), indent=2),
                                     transcript=render_transcript(entries), admin=is_admin())

    async def sse(key: str, after: int) -> Any:
        stream = hub.stream(key)

        async def gen() -> AsyncIterator[bytes]:
            last = after
            yield b"retry: 2000\n\n"
            while True:
                changed = stream.changed_event()
                events = stream.since(last)
                if events is None:
                    last = stream.seq
                    yield sse_frame(last, "reset", {"reason": "events were missed; reload"})
                    continue
                if events:
                    # One write per wake-up: a burst of N events as N separate sends would
                    # cost N trips through the scheduler while the daemon is busy.
                    yield b"".join(sse_frame(seq, name, data) for seq, name, data in events)
                    last = events[-1][0]
                if services.drain.is_set():
                    yield sse_frame(None, "shutdown", {})
                    return
                with trio.move_on_after(KEEPALIVE_S) as idle:
                    await changed.wait()       # set by a publish, or by wake_all() at shutdown
                if idle.cancelled_caught:
                    yield b": keep-alive\n\n"

        resp = await make_response(gen(), 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                "X-Accel-Buffering": "no"})
        resp.timeout = None
        return resp

    def after_param() -> int:
        raw = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
        try:
            return max(0, int(raw))
        except ValueError:
            return 0

    @bp.get("/events")
    async def list_events() -> Any:
        return await sse(LIST, after_param())

    @bp.get("/runs/<run_id>/events")
    async def run_events(run_id: str) -> Any:
        run_or_404(run_id)
        return await sse(run_id, after_param())

    def admin_refusal() -> Any:
        if request.headers.get("X-SwarmBase") != "1":
            return jsonify({"error": "missing header X-SwarmBase: 1"}), 403
        if not login():
            return jsonify({"error": "admin actions need a Tailscale-User-Login"}), 403
        if not is_admin():
            return jsonify({"error": f"{login()} is not listed in dashboard.adminLogins"}), 403
        return None

    @bp.post("/runs/<run_id>/cancel")
    async def admin_cancel(run_id: str) -> Any:
        refusal = admin_refusal()
        if refusal:
            return refusal
        run = run_or_404(run_id)
        if not sup.cancel(run, by=f"admin {login()}"):
            return jsonify({"runId": run.id, "status": run.status, "note": "the run had already ended"}), 409
        return jsonify({"runId": run.id, "status": "cancelling"})

    @bp.post("/runs/<run_id>/agents/<int:n>/skip")
    async def admin_skip(run_id: str, n: int) -> Any:
        refusal = admin_refusal()
        if refusal:
            return refusal
        run = run_or_404(run_id)
        if not sup.skip_agent(run, n):
            return jsonify({"runId": run.id, "agent": n, "note": "the agent is not running"}), 409
        return jsonify({"runId": run.id, "agent": n, "status": "skipping"})

    app.register_blueprint(bp)
    nodes.register(app, services)      # the Ray nodes page (nodes.py)
