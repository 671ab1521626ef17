"""The dashboard's spend page: a daily chart per caller (drawn by spend.js, no CDN) and the
rows behind it, all computed from the agent records (swarmbase.usage), and each caller's
spend quota windows (spent, reserved, left, resets at; swarmbase.runs.quota).

    register_spend(app, services)   GET /spend, GET /spend.json, GET /spend/static/spend.js

Kept apart from dashboard/app.py: its own blueprint and script; its template extends the
shared layout (base.html) and its styles are in app.css, since the dashboard's CSP allows
no inline <style> (an inline block left the page unstyled: black bars). Viewing is open
like the rest of the dashboard (the app's Host allowlist still applies). The agent records
are read in a worker thread; the run list they come from is taken on the event loop.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import trio
from quart import Blueprint, Quart, jsonify, render_template, request, send_from_directory

from swarmbase import money, usage

from .served import Served

HERE = Path(__file__).resolve().parent
ASSETS = {"spend.js"}


async def spend_report(services: Served, start: str | None, end: str | None, caller: str | None) -> dict[str, Any]:
    first, last = usage.date_range(start or None, end or None)
    runs = usage.supervisor_runs(services.supervisor, caller or None, first, last)
    rep = await trio.to_thread.run_sync(usage.report, runs, first, last, usage.CACHE)
    # The spend quotas as they stand now (runs/quota.py: cheap, from its cache).
    book = services.supervisor.quota
    rep["quota"] = {c.name: book.view(c) for c in services.cfg.callers
                    if (not caller or c.name == caller) and (c.usdPerDay is not None or c.usdPerMonth is not None)}
    return rep


def register_spend(app: Quart, services: Served) -> None:
    if "spend" in app.blueprints:       # already mounted (idempotent: the daemon may do it too)
        return
    sup = services.supervisor
    bp = Blueprint("spend", __name__, template_folder=str(HERE / "templates"))

    @bp.get("/spend/static/<name>")
    async def spend_asset(name: str) -> Any:
        if name not in ASSETS:
            return jsonify({"error": "no such asset"}), 404
        return await send_from_directory(HERE / "static", name)

    def args() -> tuple[str | None, str | None, str | None]:
        return request.args.get("from"), request.args.get("to"), request.args.get("caller")

    @bp.get("/spend.json")
    async def spend_json() -> Any:
        try:
            return jsonify(await spend_report(services, *args()))
        except usage.UsageError as e:
            return jsonify({"error": str(e)}), 400

    @bp.get("/spend")
    async def spend_page() -> Any:
        start, end, caller = args()
        callers = sorted({r.caller for r in list(sup.runs.values())})
        try:
            report = await spend_report(services, start, end, caller)
            error = None
        except usage.UsageError as e:
            report, error = None, str(e)
        today = dt.datetime.now(dt.timezone.utc).date().isoformat()
        return await render_template("spend.html", report=report, error=error, callers=callers,
                                     caller=caller or "", start=start or "", end=end or "", today=today,
                                     admin=False, usd=money.usd,
                                     total=money.total(r["costUsd"] for r in report["rows"]) if report else ""), \
            (200 if error is None else 400)

    app.register_blueprint(bp)
