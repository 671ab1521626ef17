// SwarmBase spend page: one daily bar chart per caller, drawn as SVG from the report the
// page carries (data-report). No dependencies, no network.
(function () {
  "use strict";
  const box = document.getElementById("spend-charts");
  if (!box) return;
  const report = JSON.parse(box.dataset.report);
  const SVG = "http://www.w3.org/2000/svg";
  const W = 720, H = 180, PAD_L = 64, PAD_B = 22, PAD_T = 12;

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text != null) e.textContent = text;
    return e;
  }

  function days(from, to) {
    const out = [];
    const d = new Date(from + "T00:00:00Z"), end = new Date(to + "T00:00:00Z");
    while (d <= end) { out.push(d.toISOString().slice(0, 10)); d.setUTCDate(d.getUTCDate() + 1); }
    return out;
  }

  // caller -> date -> {costUsd, tokens, agents, estimated}
  function byCaller() {
    const out = new Map();
    for (const r of report.rows) {
      if (!out.has(r.caller)) out.set(r.caller, new Map());
      const m = out.get(r.caller);
      const cur = m.get(r.date) || { costUsd: 0, tokens: 0, agents: 0, estimated: false };
      cur.costUsd += r.costUsd; cur.tokens += r.tokens; cur.agents += r.agents;
      cur.estimated = cur.estimated || r.estimated;
      m.set(r.date, cur);
    }
    return out;
  }

  // Money by the dashboard's one rule (common.js SB.usd: $0.0001, half up).
  function label(metric, v) {
    return metric === "costUsd" ? SB.usd(v) : Math.round(v).toLocaleString("en-US");
  }

  function chart(caller, perDay, all, metric) {
    const max = Math.max(0, ...all.map((d) => (perDay.get(d) || {})[metric] || 0));
    // A caller's total is the exact sum of the daily amounts, rounded once.
    const total = metric === "costUsd"
      ? SB.usd(all.reduce((s, d) => s + (Number((perDay.get(d) || {}).costUsd) || 0), 0))
      : label(metric, all.reduce((s, d) => s + ((perDay.get(d) || {})[metric] || 0), 0));
    const fig = document.createElement("figure");
    fig.className = "spend-chart";
    fig.dataset.caller = caller;
    const h = document.createElement("h3");
    h.textContent = caller + " · " + total;
    fig.append(h);
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
                           "aria-label": `daily ${metric === "costUsd" ? "spend" : "tokens"} of ${caller}` });
    const plotW = W - PAD_L, plotH = H - PAD_B - PAD_T, step = plotW / all.length;
    s.append(svg("text", { x: 2, y: PAD_T + 10 }, label(metric, max)));
    s.append(svg("text", { x: 2, y: H - PAD_B }, label(metric, 0)));
    s.append(svg("text", { x: PAD_L, y: H - 3 }, all[0]));
    s.append(svg("text", { x: W - 2, y: H - 3, "text-anchor": "end" }, all[all.length - 1]));
    all.forEach((d, i) => {
      const v = perDay.get(d);
      if (!v || !v[metric] || !max) return;
      const bh = Math.max(1, (v[metric] / max) * plotH);
      const rect = svg("rect", { class: "bar" + (v.estimated ? " est" : ""), x: PAD_L + i * step + step * 0.1,
                                 y: PAD_T + plotH - bh, width: Math.max(1, step * 0.8), height: bh, "data-date": d });
      rect.append(svg("title", null, `${d}: ${SB.usd(v.costUsd)}${v.estimated ? " (est.)" : ""}, ` +
                                     `${v.tokens.toLocaleString("en-US")} tokens, ${v.agents} agents`));
      s.append(rect);
    });
    fig.append(s);
    return fig;
  }

  function draw(metric) {
    const all = days(report.from, report.to);
    const callers = byCaller();
    box.replaceChildren();
    if (!callers.size) {
      const p = document.createElement("p");
      p.textContent = "No spend in this range.";
      box.append(p);
    }
    for (const [caller, perDay] of [...callers.entries()].sort((a, b) => a[0].localeCompare(b[0]))) {
      box.append(chart(caller, perDay, all, metric));
    }
    for (const [id, m] of [["metric-cost", "costUsd"], ["metric-tokens", "tokens"]]) {
      const b = document.getElementById(id);
      if (b) b.setAttribute("aria-pressed", String(m === metric));
    }
  }

  for (const [id, m] of [["metric-cost", "costUsd"], ["metric-tokens", "tokens"]]) {
    const b = document.getElementById(id);
    if (b) b.addEventListener("click", () => draw(m));
  }
  draw("costUsd");
})();
