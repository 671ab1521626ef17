// The run page, live: agent rows, timeline, spend totals, header, log and result.
(function () {
  "use strict";
  const { $, el } = SB;
  const data = SB.data();
  const runId = data.runId;
  const admin = document.body.dataset.admin === "1";
  const agents = new Map(data.agents.map((a) => [a.n, a]));
  let run = { status: data.status, label: data.label, done: data.done, total: data.total, endedAt: data.endedAt };
  const timeline = new SB.Timeline($("timeline"), data.createdAt, data.endedAt);
  for (const a of data.agents) timeline.upsert(a);

  // ---- agent rows ----------------------------------------------------------------
  function agentRow(a) {
    const label = el("td", { class: "label" }, el("a", { href: "/runs/" + runId + "/agents/" + a.n, text: a.label }));
    if (a.replayed) label.append(" ", el("span", { class: "tag", text: "replayed" }));
    if (a.workflow) label.append(" ", el("span", { class: "tag", text: "wf " + a.workflow }));
    if (a.error) label.append(el("div", { class: "why", text: a.error }));
    const act = el("td", { class: "act" });
    if (admin && a.state === "running") {
      act.append(el("button", { class: "skip", "data-action": "/runs/" + runId + "/agents/" + a.n + "/skip", text: "skip" }));
    }
    const dur = a.state === "running" && a.startedAt ? SB.now() - a.startedAt : a.durationS;
    return el("tr", { id: "agent-" + a.n, "data-n": a.n, class: "st-row-" + a.state },
      el("td", { class: "num", text: a.n }), label, el("td", { text: a.engine }), el("td", { text: a.model || "default" }),
      el("td", { class: "state" }, el("span", { class: "badge st-" + a.state, text: a.state })),
      el("td", { class: "cost num", text: SB.agentCost(a) }), el("td", { class: "tokens num", text: SB.int(a.tokens) }),
      el("td", { class: "adur num", text: SB.dur(dur) }), act);
  }
  function phaseBody(title, workflow) {
    const sel = '#phases [data-phase="' + CSS.escape(title) + '"][data-workflow="' + CSS.escape(workflow || "") + '"]';
    let sec = document.querySelector(sel);
    if (sec && sec.tagName === "DETAILS") { sec.remove(); sec = null; }     // an empty phase gets its first agent
    if (!sec) {
      const none = $("no-agents"); if (none) none.remove();
      const head = ["#", "label", "engine", "model", "state", "cost", "tokens", "duration", ""].map((h, i) => el("th", { text: h, class: i >= 5 && i <= 7 ? "num" : null }));
      const h3 = el("h3", { text: title });
      if (workflow) h3.append(" ", el("span", { class: "tag", text: "workflow " + workflow }));
      sec = el("section", { class: "phase", "data-phase": title, "data-workflow": workflow || "" }, h3,
        el("div", { class: "scroll" }, el("table", { class: "agents" }, el("thead", {}, el("tr", {}, ...head)), el("tbody"))));
      $("phases").append(sec);
    }
    return sec.querySelector("tbody");
  }
  function emptyPhase(p) {
    const sel = '#phases [data-phase="' + CSS.escape(p.title) + '"][data-workflow="' + CSS.escape(p.workflow || "") + '"]';
    if (document.querySelector(sel)) return;
    const none = $("no-agents"); if (none) none.remove();
    $("phases").append(el("details", { class: "phase empty-phase", "data-phase": p.title, "data-workflow": p.workflow || "" },
      el("summary", {}, p.title, el("span", { class: "muted", text: " · no agents" }))));
  }
  // What a live usage update changes in a row; anything else rebuilds the row.
  const LIVE = ["costUsd", "tokens", "estimated", "priced", "durationS", "ts"];
  function onlyLive(prev, a) {
    return prev && Object.keys(a).every((k) => LIVE.includes(k) || a[k] === prev[k] || (a[k] == null && prev[k] == null));
  }
  function upsertAgent(a) {
    const prev = agents.get(a.n);
    const merged = Object.assign({}, prev || {}, a);
    if (!merged.phase) merged.phase = "main";
    agents.set(a.n, merged);
    const old = $("agent-" + a.n);
    if (old && onlyLive(prev, a)) {
      // Usage ticks arrive ~2/s per running agent: touch two cells, not the row.
      const cost = old.querySelector(".cost"), tokens = old.querySelector(".tokens");
      const c = SB.agentCost(merged), t = SB.int(merged.tokens);
      if (cost.textContent !== c) cost.textContent = c;
      if (tokens.textContent !== t) tokens.textContent = t;
      timeline.upsert(merged, a.ts);
      scheduleTotals();
      return;
    }
    const row = agentRow(merged);
    if (old) old.replaceWith(row);
    else {
      const body = phaseBody(merged.phase, merged.workflow);
      const next = Array.from(body.rows).find((r) => Number(r.dataset.n) > a.n);   // rows stay in call order
      body.insertBefore(row, next || null);
    }
    timeline.upsert(merged, a.ts);
    scheduleTotals();
  }

  // ---- totals: the same rule as views.totals ---------------------------------------
  // Totals and the title follow the rows at most twice a second.
  let totalsPending = false;
  function scheduleTotals() {
    if (totalsPending) return;
    totalsPending = true;
    setTimeout(() => requestAnimationFrame(() => { totalsPending = false; renderTotals(); renderTitle(); }), 500);
  }
  function totals(by) {
    const groups = new Map(), total = { name: "total", agents: 0, usd: 0, tokens: 0, estimated: false, unpriced: 0 };
    for (const r of agents.values()) {
      const name = String(r[by] || (by === "phase" ? "main" : "?"));
      if (!groups.has(name)) groups.set(name, { name, agents: 0, usd: 0, tokens: 0, estimated: false, unpriced: 0 });
      for (const t of [groups.get(name), total]) {
        t.agents += 1; t.tokens += Number(r.tokens || 0);
        if (r.priced === false) t.unpriced += 1;
        else { t.usd += Number(r.costUsd) || 0; t.estimated = t.estimated || !!r.estimated; }
      }
    }
    // Exact sums, rounded once: the foot is the figure the header shows (issue 32.4).
    return [...groups.values(), total].map((t) => ({ ...t, units: SB.usdUnits(t.usd) }));
  }
  function renderTotals() {
    for (const [id, by] of [["by-phase", "phase"], ["by-engine", "engine"]]) {
      const rows = totals(by).map((t, i, all) => el("tr", { class: i === all.length - 1 ? "total" : null },
        el("td", { text: t.name }), el("td", { class: "num", text: t.agents }),
        el("td", { class: "num" }, ...(t.unpriced === t.agents ? ["no price"] : [(t.estimated ? "~" : "") + SB.fmtUnits(t.units),
          t.unpriced ? el("span", { class: "muted", text: " +" + t.unpriced + " no price" }) : ""])),
        el("td", { class: "num", text: SB.int(t.tokens) })));
      $(id).querySelector("tbody").replaceChildren(...rows);
    }
  }

  // ---- header -------------------------------------------------------------------------
  function meter(svg, spent, reserved, total) {
    spent = Math.max(0, spent || 0); reserved = Math.max(0, reserved || 0); total = Math.max(0, total || 0);
    const scale = Math.max(total, spent + reserved, 1e-9);
    const [s, r] = svg.querySelectorAll("rect");
    s.setAttribute("width", (100 * spent / scale).toFixed(2));
    r.setAttribute("x", (100 * spent / scale).toFixed(2));
    r.setAttribute("width", (100 * reserved / scale).toFixed(2));
    const over = spent > total + 1e-9;
    svg.classList.toggle("over", over);
    return over;
  }
  function updateRun(r) {
    run = { status: r.status, label: r.label, done: r.agents.done, total: r.agents.total, endedAt: r.endedAtEpoch };
    const st = $("run-status"); st.className = "badge s-" + r.status; st.textContent = r.status;
    $("run-agents").textContent = r.agents.done + "/" + r.agents.total;
    const reserved = r.reservedUsd || 0;
    const over = meter($("usd-meter"), r.spentUsd, reserved, r.budgetUsd);
    const fig = $("usd-figures");
    fig.replaceChildren("spent ", el("b", { text: (r.spentEstimated ? "~" : "") + SB.usd(r.spentUsd) }),
      " · reserved " + SB.usd(reserved) + " · budget " + SB.usd(r.budgetUsd));
    $("overspent").hidden = !over;
    if (r.budgetTokens != null && (r.spentTokens || r.reservedTokens)) {
      $("token-line").hidden = false;
      meter($("tok-meter"), r.spentTokens, r.reservedTokens, r.budgetTokens);
      $("tok-figures").replaceChildren("used ", el("b", { text: SB.int(r.spentTokens) }),
        " · reserved " + SB.int(r.reservedTokens) + " · codex token budget " + SB.int(r.budgetTokens));
    }
    if (r.endedAtEpoch) {
      timeline.setEnd(r.endedAtEpoch);
      const c = $("cancel-run"); if (c) c.remove();
    }
    if (r.error) {
      const e = $("run-error"); e.hidden = false;
      e.textContent = r.error + (r.errorLine ? " (script line " + r.errorLine + ")" : "");
      if (r.errorLine && !document.querySelector("#script .ln.err")) SB.highlight($("script"), r.errorLine);
    }
    renderTitle();
    tick();
  }
  function renderTitle() { SB.setTitle(SB.runTitle(run.status, run.label, run.done, run.total)); }

  // ---- the clock: running durations, the "now" cursor ------------------------------------
  function tick() {
    const d = $("run-duration");
    if (d) d.textContent = SB.dur((run.endedAt || SB.now()) - data.createdAt);
    for (const a of agents.values()) {
      if (a.state !== "running" || !a.startedAt) continue;
      const cell = document.querySelector("#agent-" + a.n + " .adur");
      if (cell) cell.textContent = SB.dur(SB.now() - a.startedAt);
    }
    if (!run.endedAt) timeline.schedule();
  }

  SB.highlight($("script"), data.errorLine || null);
  SB.renderWhen();
  renderTitle();
  tick();
  setInterval(() => { if (!run.endedAt || document.querySelector(".st-row-running")) tick(); }, 1000);
  SB.live("/runs/" + runId + "/events", data.after, {
    agent: upsertAgent,
    phase: emptyPhase,
    log: (e) => { $("log").append(e.at + " " + e.message + "\n"); },
    run: updateRun,
    result: (r) => { $("result").textContent = r.text; },
  });
})();
