"""The dashboard's nodes page: the Ray cluster agents are placed on — each node, whether it
can take agents, its free slots, what the boot check found (CLI binary, shared roots,
sandbox, leftovers reaped) and the agents running there. Server-rendered and refreshed
every few seconds; the same data as JSON at /nodes.json. Without Ray placement the page
says so."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quart import Blueprint, Quart, jsonify, render_template

from .served import Served

HERE = Path(__file__).resolve().parent
REFRESH_S = 5


def _view(services: Served) -> dict[str, Any] | None:
    ray = services.ray
    if ray is None:
        return None
    view = ray.view()
    runs = services.supervisor.runs
    for node in view["nodes"]:
        for agent in node["running"]:
            run_id, _, n = agent["key"].rpartition("-")
            run = runs.get(run_id)
            agent.update(runId=run_id, n=n, run=run.display_label if run is not None else run_id)
    return view


def register(app: Quart, services: Served) -> None:
    bp = Blueprint("nodes", __name__, template_folder=str(HERE / "templates"))

    @bp.get("/nodes")
    async def nodes_page() -> str:
        return await render_template("nodes.html", view=_view(services), admin=False, now=time.time(),
                                     refresh=REFRESH_S)

    @bp.get("/nodes.json")
    async def nodes_json() -> Any:
        return jsonify(_view(services) or {"configured": False})

    app.register_blueprint(bp)
