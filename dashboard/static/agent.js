// The agent page, live: transcript lines as the agent streams them, its state, cost and
// tokens while it runs, and its final usage as a table once it ends.
(function () {
  "use strict";
  const { $, el } = SB;
  const data = SB.data();
  let a = data.agent;
  let items = document.querySelectorAll("#transcript .ti").length;

  function item(it) {
    const node = el("div", { class: "ti ti-" + it.kind }, el("div", { class: "ti-title", text: it.title }));
    if (it.rows && it.rows.length) {
      node.append(el("table", { class: "kv" }, ...it.rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { class: "num", text: v })))));
    } else if (it.body) node.append(el("pre", { text: it.body }));
    return node;
  }
  function addLine(ev) {
    const box = $("transcript");
    const none = $("no-transcript"); if (none) none.remove();
    const atBottom = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
    for (const it of ev.items || []) { box.append(item(it)); items++; }
    $("transcript-count").textContent = items + " items";
    if (atBottom) window.scrollTo(0, document.body.scrollHeight);
  }
  function facts() {
    const st = $("agent-state"); st.className = "badge st-" + a.state; st.textContent = a.state;
    $("agent-cost").textContent = SB.agentCost(a);
    $("agent-tokens").textContent = SB.int(a.tokens);
    const d = a.state === "running" && a.startedAt ? SB.now() - a.startedAt : a.durationS;
    $("agent-duration").textContent = SB.dur(d);
    const usage = $("usage");
    usage.querySelector('[data-k="cost"]').textContent = SB.agentCost(a);
    usage.querySelector('[data-k="duration"]').textContent = SB.dur(d);
    if (a.state === "running") usage.querySelector('[data-k="total"]').textContent = SB.int(a.tokens);
    if (a.error) { const e = $("agent-error"); e.hidden = false; e.textContent = a.error; }
    SB.setTitle((a.state === "running" ? "● " : "") + (a.label || "agent " + a.n) + " — " + a.state);
  }
  async function final() {
    // The record on disk has the token breakdown and the state history.
    const r = await fetch(location.pathname + "?raw=1", { credentials: "same-origin" });
    if (!r.ok) return;
    const rec = (await r.json()).agent || {};
    const t = rec.tokens || {};
    for (const k of ["input", "output", "cacheRead", "cacheWrite", "total"]) {
      $("usage").querySelector('[data-k="' + k + '"]').textContent = SB.int(t[k]);
    }
    $("history").replaceChildren(...(rec.history || []).map((h) => el("li", { text: h.at + " " + h.state + (h.error ? ": " + h.error : "") })));
    if (rec.error) { a.error = rec.error; facts(); }
  }
  function onAgent(row) {
    const was = a.state;
    a = Object.assign({}, a, row);
    facts();
    if (was !== a.state && SB.ENDED.includes(a.state)) final();
  }

  facts();
  setInterval(() => { if (a.state === "running") facts(); }, 1000);
  SB.live("/runs/" + data.runId + "/agents/" + data.n + "/events", data.after, { line: addLine, agent: onAgent });
})();
