"""The run page's audit verdict: "verified" or the first break.

    register_audit(app, services)   GET /runs/<run_id>/audit.json, GET /audit/static/audit-badge.js

The run page shows it by carrying an element `<span id="audit-badge" data-run="<id>"></span>`
and loading /audit/static/audit-badge.js (the dashboard owns run.html; see
docs/audit-integration.md). Verifying reads the run's files in a worker thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from quart import Blueprint, Quart, jsonify, send_from_directory

from swarmbase.audit import archived
from swarmbase.audit.rundirs import RunIndex
from swarmbase.audit.verify import verify_run

from .served import Served

HERE = Path(__file__).resolve().parent


def verdict(state_dir: Path, run_id: str) -> dict[str, Any] | None:
    with archived.opened(RunIndex.around(state_dir, run_id), run_id) as idx:
        if run_id not in idx.dirs:
            return None
        return verify_run(idx, run_id).to_json()


def register_audit(app: Quart, services: Served) -> None:
    if "audit_view" in app.blueprints:  # already mounted (idempotent: the daemon may do it too)
        return
    sup = services.supervisor
    bp = Blueprint("audit_view", __name__)

    @bp.get("/audit/static/audit-badge.js")
    async def badge_js() -> Any:
        return await send_from_directory(HERE / "static", "audit-badge.js")

    @bp.get("/runs/<run_id>/audit.json")
    async def run_audit(run_id: str) -> Any:
        if run_id not in sup.runs:
            return jsonify({"error": f"no run {run_id}"}), 404
        if sup.runs[run_id].active:
            return jsonify({"runId": run_id, "status": "open", "break": None,
                            "notes": ["the run is in flight; it is verified once it has ended"], "chains": []})
        out = await trio.to_thread.run_sync(verdict, services.cfg.state_dir, run_id)
        if out is None:
            return jsonify({"error": f"the records of {run_id} cannot be read"}), 404
        return jsonify(out)

    app.register_blueprint(bp)
