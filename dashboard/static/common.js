// SwarmBase dashboard: helpers shared by the pages, and the page's one live stream.
// No build step, no dependencies. Formatting rules mirror dashboard/views.py.
(function () {
  "use strict";
  const SB = (window.SB = {});
  SB.$ = (id) => document.getElementById(id);
  SB.el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  };
  SB.data = () => {
    const node = document.getElementById("sb-data");
    return node ? JSON.parse(node.textContent) : {};
  };
  SB.now = () => Date.now() / 1000;

  // Money: one rule everywhere. Amounts are whole 1/10,000 dollars, rounded half up;
  // a total is the exact sum rounded once (SB.usd of the sum), as the run's header shows it.
  SB.usdUnits = (v) => { const x = Number(v || 0); return Number.isFinite(x) ? Math.floor(x * 10000 + 0.5) : 0; };
  SB.fmtUnits = (u) => (u < 0 ? "-" : "") + "$" + Math.floor(Math.abs(u) / 10000) + "." + String(Math.abs(u) % 10000).padStart(4, "0");
  SB.usd = (v) => SB.fmtUnits(SB.usdUnits(v));
  SB.agentCost = (a) => (a.priced === false ? "no price" : (a.estimated ? "~" : "") + SB.usd(a.costUsd));
  SB.int = (n) => Math.round(Number(n || 0)).toLocaleString("en-US");
  SB.dur = (s) => {
    if (s == null || !Number.isFinite(Number(s))) return "";
    s = Math.max(0, Number(s));
    if (s < 60) return s.toFixed(1) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
    return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  };
  SB.ago = (epoch) => {
    const d = SB.now() - Number(epoch);
    if (d < 10) return "just now";
    if (d < 60) return Math.floor(d) + " s ago";
    if (d < 3600) return Math.floor(d / 60) + " min ago";
    if (d < 86400) return Math.floor(d / 3600) + " h ago";
    if (d < 30 * 86400) return Math.floor(d / 86400) + " d ago";
    return WALL.format(new Date(epoch * 1000)).split(",")[0];
  };
  // One formatter for every wall time: making one per call (toLocaleString) costs ~0.5 ms.
  const WALL = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
  SB.wall = (epoch) => WALL.format(new Date(epoch * 1000));
  SB.renderWhen = (root) => {
    for (const e of (root || document).querySelectorAll("[data-epoch]")) {
      const text = SB.ago(e.dataset.epoch);
      if (e.textContent !== text) e.textContent = text;
      if (!e.title) e.title = SB.wall(Number(e.dataset.epoch));
    }
  };
  const MARK = { running: "●", queued: "●", completed: "✓", failed: "✗", cancelled: "⊘", interrupted: "⊘" };
  SB.runTitle = (status, label, done, total) =>
    status === "queued" || status === "running"
      ? `${MARK[status]} ${done}/${total} ${status} — ${label}`
      : `${MARK[status] || "·"} ${label} — ${status}`;
  SB.setTitle = (t) => { document.title = t + " · SwarmBase"; };
  SB.ACTIVE = ["queued", "running"];
  SB.ENDED = ["done", "failed", "skipped", "cancelled", "interrupted"];

  // The page's live stream. One per tab: closed on pagehide (a page kept in the
  // back/forward cache must not hold one of the browser's six connections to this
  // origin), reopened on pageshow from the last event seen. A refused stream (the
  // daemon's caps) is retried with backoff.
  SB.live = function (path, after, handlers) {
    if (!window.EventSource) return;
    const conn = SB.$("conn");
    let es = null, last = after, retry = 0, timer = null;
    function close() {
      clearTimeout(timer); timer = null;
      if (es) { es.close(); es = null; }
      if (conn) conn.classList.remove("live");
    }
    function open() {
      close();
      es = new EventSource(path + "?after=" + encodeURIComponent(last));
      const mine = es;
      es.onopen = () => { retry = 0; if (conn) conn.classList.add("live"); };
      es.onerror = () => {
        if (conn) conn.classList.remove("live");
        if (mine.readyState === EventSource.CLOSED && es === mine) {
          es = null;
          timer = setTimeout(open, Math.min(30000, 2000 * 2 ** retry++));
        }
      };
      for (const [name, fn] of Object.entries(handlers)) {
        es.addEventListener(name, (ev) => { if (ev.lastEventId) last = ev.lastEventId; fn(JSON.parse(ev.data)); });
      }
      es.addEventListener("reload", () => { close(); location.reload(); });
      es.addEventListener("shutdown", () => {
        close();
        document.querySelector("main").prepend(SB.el("p", { class: "banner", text: "The daemon is shutting down; reload later." }));
      });
    }
    window.addEventListener("pagehide", close);
    window.addEventListener("pageshow", (ev) => { if (ev.persisted && !es) open(); });
    SB.stream = { close, open, isOpen: () => es !== null };
    open();
  };

  // Admin buttons: a POST with the header a cross-site form cannot send.
  async function post(url, button) {
    button.disabled = true;
    const r = await fetch(url, { method: "POST", headers: { "X-SwarmBase": "1" }, credentials: "same-origin" });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      alert(j.error || j.note || "HTTP " + r.status);
      button.disabled = false;
    }
  }
  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (b) post(b.dataset.action, b);
  });
})();
