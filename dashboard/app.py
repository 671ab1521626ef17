"""The dashboard: run list, run page, agent page, live over SSE, admin cancel/skip.

Server-rendered with Jinja (autoescaped) plus page scripts served from /static; nothing
from a CDN, no inline script or style (a strict Content-Security-Policy says so). Viewing
is open to whoever reaches the port (loopback, or the tailnet through `tailscale serve`);
every request must name an allowed Host (blocks DNS rebinding). Admin POSTs need an
admin's Tailscale-User-Login, `X-SwarmBase: 1` and that admin's session cookie
(swarmbase/admin.py). SSE streams are served beside Quart, in dashboard/sse.py.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jinja2
import trio
from quart import (Blueprint, Quart, Response, abort, jsonify, make_response, redirect, request,
                   send_from_directory, websocket)
from werkzeug.exceptions import HTTPException

from swarmbase.admin import COOKIE, SESSION_TTL_S, AdminStore
from swarmbase.events import LIST, agent_key

from . import listing, sse, views
from .pages import Pages, safe_json
from .served import Served
from . import nodes
from .transcript import render_transcript

log = logging.getLogger("swarmbase.dashboard")
HERE = Path(__file__).resolve().parent
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "same-origin"}
SSE_PATH = re.compile(r"^/(?:runs/([^/]+)/(?:agents/(\d{1,9})/)?)?events$")


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


def register(app: Quart, services: Served) -> None:
    sup = services.supervisor
    runs_store = services.env.store
    hub = services.env.events
    hub.render_line = lambda entry: render_transcript([entry])
    hosts = allowed_hosts(services.cfg.publicUrl)
    public_host = urlsplit(services.cfg.publicUrl or "").hostname      # what `tailscale serve` requests name
    proxy_host = public_host.lower() if public_host else None
    admins = set(services.cfg.dashboard.adminLogins)
    store = AdminStore(services.cfg.state_dir)
    secure_cookie = (services.cfg.publicUrl or "").startswith("https://")
    pages = Pages(sup, runs_store)
    index = listing.RunIndex()
    viewers = sse.Viewers()
    viewers.on_ebb = sse.hand_back_memory_later
    bp = Blueprint("dashboard", __name__)
    # Plain (not async) Jinja: Quart's async rendering costs a scheduler trip per output
    # fragment, ~30 ms for a 150-row list; this renders it in a few.
    jinja = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                               auto_reload=False)
    jinja.globals.update(usd=views.usd, agent_cost=views.agent_cost, fmt_units=views.fmt_units, dur=views.dur,
                         utc=views.utc)

    async def render_template(template: str, **context: Any) -> Response:
        return Response(jinja.get_template(template).render(**context), content_type="text/html; charset=utf-8")

    # -- every request ----------------------------------------------------------------
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

    @app.after_request
    async def security_headers(resp: Response) -> Response:
        for k, v in SECURITY_HEADERS.items():
            resp.headers.setdefault(k, v)
        return resp

    @app.errorhandler(HTTPException)
    async def http_error(e: HTTPException) -> Any:
        return await error_page(e.code or 500, e.name, e.description or "")

    @app.errorhandler(Exception)
    async def internal_error(e: Exception) -> Any:
        # The details go to the daemon's log, never to the page (no traces, no paths).
        log.exception("dashboard error on %s %s", request.method, request.path)
        return await error_page(500, "Internal error", "The dashboard failed to show this page; the daemon's log says why.")

    async def error_page(code: int, name: str, detail: str) -> Any:
        if request.method != "GET":
            return jsonify({"error": f"{name}: {detail}" if detail else name}), code
        return await render_template("error.html", code=code, name=name, detail=detail, admin=False), code

    # -- SSE, beside Quart: each stream's writes are bounded and its socket reachable ----
    quart_asgi = app.asgi_app

    async def asgi(scope: Any, receive: Any, send: Any) -> None:  # ASGI: untyped dicts
        m = SSE_PATH.fullmatch(scope.get("path", "")) if scope.get("type") == "http" else None
        if m is None or scope.get("method") != "GET":
            return await quart_asgi(scope, receive, send)
        headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
        if host_name(sse.header(scope, b"host") or "") not in hosts:
            return await sse.respond_json(send, 403, {"error": "host not allowed"}, headers)
        run_id, n = m.group(1), m.group(2)
        if run_id is None:
            stream = hub.watch(LIST)
        else:
            run = sup.runs.get(run_id)
            if run is None:
                return await sse.respond_json(send, 404, {"error": f"no run {run_id[:40]!r}"}, headers)
            if n is None:
                stream = hub.watch(run.id, ended=not run.active)
            else:
                stream = hub.watch(agent_key(run.id, int(n)), ended=agent_ended(run, int(n)))
        await sse.serve_stream(scope, receive, send, hub=hub, stream=stream, after=after_param(scope),
                               viewers=viewers, drain=services.drain, headers=headers, proxy_host=proxy_host)

    app.asgi_app = asgi  # type: ignore[method-assign]

    def after_param(scope: dict[str, Any]) -> int | None:
        raw = sse.header(scope, b"last-event-id")
        if not raw:
            raw = (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("after") or [None])[0]
        try:
            return max(0, int(raw)) if raw else None
        except ValueError:
            return None

    def agent_ended(run: Any, n: int) -> bool:
        live = sup.live.get(run.id)
        rec = live.agents.get(n) if live is not None else None
        return rec is None or rec.state in views.ENDED_STATES

    # -- admin identity -------------------------------------------------------------------
    def login() -> str | None:
        return request.headers.get("Tailscale-User-Login")

    def session_refusal() -> str | None:
        """Why this request is not an admin's (None: it is)."""
        who = login()
        if not who:
            return "admin actions need a Tailscale-User-Login (open the dashboard through tailscale serve)"
        if who not in admins:
            return f"{who} is not listed in dashboard.adminLogins"
        owner = store.session_login(request.cookies.get(COOKIE))
        if owner is None:
            return (f"no admin session in this browser, or it expired: run `swarmbase admin-link {who}` "
                    f"on the daemon's machine and open the link")
        if owner != who:
            return "this browser's admin session belongs to another login"
        return None

    def is_admin() -> bool:
        return session_refusal() is None

    def admin_refusal() -> Any:
        if request.headers.get("X-SwarmBase") != "1":
            return jsonify({"error": "missing header X-SwarmBase: 1"}), 403
        why = session_refusal()
        return (jsonify({"error": why}), 403) if why else None

    # -- assets ---------------------------------------------------------------------------
    @bp.get("/static/<path:name>")
    async def asset(name: str) -> Any:
        return await send_from_directory(HERE / "static", name)

    @bp.get("/favicon.ico")
    async def favicon() -> Any:
        return await send_from_directory(HERE / "static", "favicon.svg", mimetype="image/svg+xml")

    @bp.get("/streams")
    async def stream_stats() -> Any:
        """How many live streams the dashboard serves, what its caps have done, and the
        event loop's recent lag (swarmbase/lag.py)."""
        return jsonify({"streams": viewers.count, "max": viewers.max_total, "perClient": viewers.max_per_client,
                        "refused": viewers.refused, "dropped": viewers.dropped, "bufferedBytes": hub.retained_bytes(),
                        "loopLag": services.lag.figures()})

    # -- pages ----------------------------------------------------------------------------
    async def opened(run: Any) -> Any:
        """An archived run's files opened from its zip (in a worker thread), its whole record
        returned; any other run as it is."""
        if run.archived_at is None:
            return run
        return await trio.to_thread.run_sync(sup.env.store.open_archived, run)

    @bp.get("/")
    async def run_list() -> Any:
        try:
            query = listing.parse(request.args)
        except listing.QueryError as e:
            return await error_page(400, "Bad query", str(e))
        index.refresh(sup.runs)
        after = hub.seq
        found, next_cursor = index.page(query, lambda r: pages.label(r, disk=False))
        rows = [pages.list_row(r) for r in found]
        first_page = query.before is None
        return await render_template(
            "list.html", rows=rows, query=query, callers=index.callers, statuses=listing.FILTERS,
            after=after, first_page=first_page, damaged=pages.damaged(), admin=False,
            from_=request.args.get("from", ""), to=request.args.get("to", ""),
            next_url=("/?" + urlencode(query.params(before=next_cursor, **{"from": request.args.get("from", ""),
                                                                            "to": request.args.get("to", "")})))
            if next_cursor else None,
            total=len(sup.runs), running=len(sup.live),
            data=safe_json({"after": after, "firstPage": first_page, "limit": query.limit, "active": list(sup.live),
                            "filter": {"q": query.q, "status": query.status, "caller": query.caller,
                                       "from": query.start, "to": query.end}}))

    @bp.get("/runs/<run_id>")
    async def run_page(run_id: str) -> Any:
        run = sup.runs.get(run_id) or abort(404)
        hub.watch(run.id, ended=not run.active)     # fixes the stream's floor before `after`
        after = hub.seq
        run = await opened(run)
        view = pages.run_view(run)
        result = runs_store.result_text(run) if run.status == "completed" else None
        return await render_template(
            "run.html", v=view, run=run, log=runs_store.recent_log(run, 500), admin=is_admin(),
            result=(result or "")[:100_000] if result is not None else None, data=pages.client_data(view, after))

    @bp.get("/runs/<run_id>/agents/<int:n>")
    async def agent_page(run_id: str, n: int) -> Any:
        run = sup.runs.get(run_id) or abort(404)
        hub.watch(agent_key(run.id, n), ended=agent_ended(run, n))
        after = hub.seq
        run = await opened(run)
        view = pages.agent_view(run, n) or abort(404)
        if request.args.get("raw"):
            return jsonify({"agent": view["record"], "options": view["options"], "transcript": view["entries"]})
        return await render_template(
            "agent.html", run=run, v=view, a=view["row"], rec=view["record"], label=pages.label(run),
            admin=is_admin(), data=safe_json({"runId": run.id, "n": n, "after": after, "agent": view["row"],
                                               "tokens": view["tokens"]}))

    # -- admin sign-in and actions ----------------------------------------------------------
    @bp.get("/admin/login/<token>")
    async def admin_link(token: str) -> Any:
        who = store.peek_link(token)
        resp = await make_response(await render_template("admin_login.html", who=who, token=token, admin=False,
                                                         done=False), 200 if who else 410)
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["Referrer-Policy"] = "no-referrer"
        return resp

    @bp.post("/admin/login/<token>")
    async def admin_login(token: str) -> Any:
        who = store.peek_link(token)
        if who is not None and login() not in (None, who):
            return await error_page(403, "Wrong login", f"this link is for {who}, but this browser is signed in "
                                                         f"to the tailnet as {login()}")
        if who is None or store.redeem_link(token) != who:
            resp = await make_response(await render_template("admin_login.html", who=None, token="", admin=False,
                                                             done=False), 410)
            resp.headers["Cache-Control"] = "no-store"
            return resp
        resp = redirect("/", 303)
        resp.set_cookie(COOKIE, store.create_session(who), max_age=SESSION_TTL_S, path="/", httponly=True,
                        samesite="Strict", secure=secure_cookie or request.scheme == "https")
        resp.headers["Cache-Control"] = "no-store"
        log.info("admin session started for %s", who)
        return resp

    @bp.post("/runs/<run_id>/cancel")
    async def admin_cancel(run_id: str) -> Any:
        refusal = admin_refusal()
        if refusal:
            return refusal
        run = sup.runs.get(run_id) or abort(404)
        if not sup.cancel(run, by=f"admin {login()}"):
            return jsonify({"runId": run.id, "status": run.status, "note": "the run had already ended"}), 409
        return jsonify({"runId": run.id, "status": "cancelling"})

    @bp.post("/runs/<run_id>/agents/<int:n>/skip")
    async def admin_skip(run_id: str, n: int) -> Any:
        refusal = admin_refusal()
        if refusal:
            return refusal
        run = sup.runs.get(run_id) or abort(404)
        if not sup.skip_agent(run, n):
            return jsonify({"runId": run.id, "agent": n, "note": "the agent is not running"}), 409
        return jsonify({"runId": run.id, "agent": n, "status": "skipping"})

    app.register_blueprint(bp)
    nodes.register(app, services)      # the Ray nodes page (nodes.py)
