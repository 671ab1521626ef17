// SwarmBase dashboard: live updates over SSE, no build step, no dependencies.
(function () {
  "use strict";
  const body = document.body;
  const page = body.dataset.page;
  const admin = body.dataset.admin === "1";
  const conn = document.getElementById("conn");
  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    for (const k of kids) e.append(k);
    return e;
  };
  const money = (v, digits) => "$" + Number(v || 0).toFixed(digits);
  const dur = (s) => s == null ? "" : (s >= 60 ? Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s" : s.toFixed(1) + "s");
  const now = () => Date.now() / 1000;

  function listen(url, handlers) {
    if (!window.EventSource) return;
    const es = new EventSource(url);
    es.onopen = () => conn && conn.classList.add("live");
    es.onerror = () => conn && conn.classList.remove("live");
    for (const [name, fn] of Object.entries(handlers)) {
      es.addEventListener(name, (ev) => fn(JSON.parse(ev.data)));
    }
    es.addEventListener("reset", () => location.reload());
    es.addEventListener("shutdown", () => {
      es.close();
      conn && conn.classList.remove("live");
      document.querySelector("main").prepend(el("p", { class: "banner", text: "The daemon is shutting down; reload later." }));
    });
    return es;
  }

  async function post(url, button) {
    button.disabled = true;
    const r = await fetch(url, { method: "POST", headers: { "X-SwarmBase": "1" } });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      alert(j.error || j.note || ("HTTP " + r.status));
      button.disabled = false;
    }
  }
  document.addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (b) post(b.dataset.action, b);
  });

  // ---- run list --------------------------------------------------------------
  function renderListTimes() {
    for (const tr of document.querySelectorAll("#runs tr[data-created]")) {
      const c = Number(tr.dataset.created), e = tr.dataset.ended ? Number(tr.dataset.ended) : null;
      tr.querySelector(".when").textContent = new Date(c * 1000).toLocaleString();
      tr.querySelector(".dur").textContent = dur((e || now()) - c);
    }
  }
  function upsertRun(r) {
    const fc = body.dataset.filterCaller, fs = body.dataset.filterStatus;
    let tr = $("run-" + r.runId);
    if ((fc && r.caller !== fc) || (fs && r.status !== fs)) { if (tr) tr.remove(); return; }
    const cells = [
      el("td", {}, el("a", { href: "/runs/" + r.runId, text: r.label })),
      el("td", { text: r.caller }),
      el("td", {}, el("span", { class: "badge s-" + r.status, text: r.status })),
      el("td", { text: money(r.spentUsd, 2) + (r.spentEstimated ? "~" : "") + " / " + money(r.budgetUsd, 2) }),
      el("td", { text: r.agents.done + "/" + r.agents.total }),
      el("td", { class: "when" }), el("td", { class: "dur" }),
    ];
    const fresh = el("tr", { id: "run-" + r.runId, "data-created": r.createdAtEpoch, "data-ended": r.endedAtEpoch || "" }, ...cells);
    if (tr) tr.replaceWith(fresh); else { const empty = document.querySelector("#runs .empty"); if (empty) empty.remove(); $("runs").prepend(fresh); }
    renderListTimes();
  }

  // ---- run page --------------------------------------------------------------
  const runStart = Number(body.dataset.created || 0);
  let runEnd = body.dataset.ended ? Number(body.dataset.ended) : null;

  function phaseSection(title) {
    let sec = document.querySelector('#phases section[data-phase="' + CSS.escape(title) + '"]');
    if (!sec) {
      const none = $("no-agents"); if (none) none.remove();
      const thead = el("thead", {}, el("tr", {}, ...["#", "label", "engine", "model", "state", "cost", "tokens", "duration", ""].map((h) => el("th", { text: h }))));
      sec = el("section", { class: "phase", "data-phase": title }, el("h3", { text: title }),
        el("div", { class: "scroll" }, el("table", { class: "agents" }, thead, el("tbody"))));
      $("phases").append(sec);
    }
    return sec;
  }
  function timelineGroup(title) {
    let g = document.querySelector('#timeline .tl-phase[data-phase="' + CSS.escape(title) + '"]');
    if (!g) { g = el("div", { class: "tl-phase", "data-phase": title }, el("div", { class: "tl-title", text: title })); $("timeline").append(g); }
    return g;
  }
  function upsertAgent(a) {
    const title = a.phase || "main";
    const link = el("a", { href: "/runs/" + body.dataset.run + "/agents/" + a.n, text: a.label });
    const labelCell = el("td", {}, link);
    if (a.replayed) labelCell.append(" ", el("span", { class: "tag", text: "replayed" }));
    const act = el("td", { class: "act" });
    if (admin && a.state === "running") act.append(el("button", { class: "skip", "data-action": "/runs/" + body.dataset.run + "/agents/" + a.n + "/skip", text: "skip" }));
    const row = el("tr", { id: "agent-" + a.n, "data-n": a.n },
      el("td", { text: a.n }), labelCell, el("td", { text: a.engine }), el("td", { text: a.model || "default" }),
      el("td", { class: "state" }, el("span", { class: "badge st-" + a.state, text: a.state })),
      el("td", { class: "cost", text: money(a.costUsd, 4) + (a.estimated ? "~" : "") }),
      el("td", { class: "tokens", text: a.tokens }), el("td", { class: "adur", text: a.durationS == null ? "" : dur(a.durationS) }), act);
    const old = $("agent-" + a.n);
    if (old) old.replaceWith(row); else phaseSection(title).querySelector("tbody").append(row);
    let bar = $("bar-" + a.n);
    if (!bar) {
      bar = el("div", { id: "bar-" + a.n });
      timelineGroup(title).append(el("div", { class: "tl-row", id: "tl-" + a.n }, el("span", { class: "tl-label", text: a.label }), el("div", { class: "tl-track" }, bar)));
    }
    bar.className = "bar st-" + a.state + (a.replayed ? " replayed" : "");
    bar.dataset.queued = a.queuedAt || ""; bar.dataset.started = a.startedAt || ""; bar.dataset.ended = a.endedAt || "";
    bar.title = a.label + ": " + a.state;
    layoutTimeline();
  }
  function layoutTimeline() {
    const bars = document.querySelectorAll("#timeline .bar");
    let end = runEnd || now();
    for (const b of bars) if (b.dataset.ended) end = Math.max(end, Number(b.dataset.ended));
    const span = Math.max(end - runStart, 0.001);
    for (const b of bars) {
      const s = Number(b.dataset.started || b.dataset.queued || runStart);
      const e = b.dataset.ended ? Number(b.dataset.ended) : (runEnd || now());
      b.style.left = (100 * (s - runStart) / span).toFixed(3) + "%";
      b.style.width = Math.max(0.3, 100 * (e - s) / span).toFixed(3) + "%";
    }
  }
  function updateRun(r) {
    const st = $("run-status"); st.className = "badge s-" + r.status; st.textContent = r.status;
    $("run-spend").textContent = money(r.spentUsd, 2) + (r.spentEstimated ? " (estimated)" : "") + " of " + money(r.budgetUsd, 2);
    $("run-agents").textContent = r.agents.done + "/" + r.agents.total;
    if (r.endedAtEpoch) { runEnd = r.endedAtEpoch; const c = $("cancel-run"); if (c) c.remove(); }
    if (r.error) { const e = $("run-error"); e.hidden = false; e.textContent = r.error + (r.errorLine ? " (script line " + r.errorLine + ")" : ""); }
    renderRunDuration();
  }
  function renderRunDuration() { const d = $("run-duration"); if (d) d.textContent = dur((runEnd || now()) - runStart); }

  if (page === "list") {
    renderListTimes();
    setInterval(renderListTimes, 1000);
    listen("/events?after=" + body.dataset.after, { run: upsertRun });
  } else if (page === "run") {
    layoutTimeline(); renderRunDuration();
    setInterval(() => { if (!runEnd) { layoutTimeline(); renderRunDuration(); } }, 1000);
    listen("/runs/" + body.dataset.run + "/events?after=" + body.dataset.after, {
      agent: upsertAgent,
      phase: (p) => { phaseSection(p.title); timelineGroup(p.title); },
      log: (e) => { const log = $("log"); log.textContent += e.at + " " + e.message + "\n"; },
      run: updateRun,
      result: (r) => { $("result").textContent = r.text; },
    });
  }
})();
