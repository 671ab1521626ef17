"""Dashboard routes on the daemon's port: a run list and a page per run.

Server-rendered HTML, no build step, no external assets. Viewing is open (the daemon
binds to loopback; publish it tailnet-only with `tailscale serve`).
"""

from __future__ import annotations

import html
import time
from typing import Any

from quart import Quart, abort, request

PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title><style>
body{{font:14px/1.4 system-ui,sans-serif;margin:1rem;color:#222}}
table{{border-collapse:collapse;width:100%}}th,td{{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #ddd}}
.s-completed{{color:#1a7f37}}.s-failed{{color:#cf222e}}.s-running{{color:#0969da}}.s-cancelled,.s-interrupted{{color:#9a6700}}
pre{{background:#f6f8fa;padding:.5rem;overflow:auto}}a{{color:#0969da}}
</style></head><body>{body}</body></html>"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _duration(run: Any) -> str:
    end = run.ended_at or time.time()
    s = max(0, int(end - run.created_at))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def register(app: Quart, services: Any) -> None:
    sup = services.supervisor

    @app.get("/")
    async def run_list() -> str:
        caller = request.args.get("caller")
        status = request.args.get("status")
        runs = sorted(sup.runs.values(), key=lambda r: r.created_at, reverse=True)
        if caller:
            runs = [r for r in runs if r.caller == caller]
        if status:
            runs = [r for r in runs if r.status == status]
        rows = "".join(
            f"<tr><td><a href='/runs/{_e(r.id)}'>{_e(r.display_label)}</a></td><td>{_e(r.caller)}</td>"
            f"<td class='s-{_e(r.status)}'>{_e(r.status)}</td>"
            f"<td>${r.spent_usd:.2f} / ${r.budget_usd:.2f}</td><td>{r.agents_done}/{r.agents_total}</td>"
            f"<td>{_e(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.created_at)))}</td>"
            f"<td>{_duration(r)}</td></tr>" for r in runs[:500])
        body = ("<h1>SwarmBase runs</h1><table><thead><tr><th>run</th><th>caller</th><th>status</th>"
                "<th>spend</th><th>agents</th><th>started</th><th>duration</th></tr></thead>"
                f"<tbody>{rows or '<tr><td colspan=7>no runs yet</td></tr>'}</tbody></table>")
        return PAGE.format(title="SwarmBase runs", body=body)

    @app.get("/runs/<run_id>")
    async def run_page(run_id: str) -> str:
        run = sup.runs.get(run_id)
        if run is None:
            abort(404)
        phases = "".join(f"<li>{_e(p.get('title'))}</li>" for p in sup.phases(run))
        logs = "\n".join(f"{_e(e.get('at'))} {_e(e.get('message'))}" for e in sup.store.recent_log(run, 200))
        result = sup.store.result_text(run) if run.status == "completed" else None
        body = (f"<p><a href='/'>all runs</a></p><h1>{_e(run.display_label)}</h1>"
                f"<p>{_e(run.id)} · caller {_e(run.caller)} · <span class='s-{_e(run.status)}'>{_e(run.status)}</span>"
                f" · ${run.spent_usd:.2f} of ${run.budget_usd:.2f} · {_duration(run)}</p>"
                + (f"<p>Error: {_e(run.error)}</p>" if run.error else "")
                + f"<h2>Phases</h2><ul>{phases or '<li>none</li>'}</ul>"
                + f"<h2>Log</h2><pre>{logs or '(empty)'}</pre>"
                + (f"<h2>Result</h2><pre>{_e(result[:100_000])}</pre>" if result is not None else ""))
        return PAGE.format(title=_e(run.display_label), body=body)
