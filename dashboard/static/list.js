// The run list: live rows, relative times, keyboard navigation.
(function () {
  "use strict";
  const { $, el } = SB;
  const data = SB.data();
  const f = data.filter || {};
  const tbody = $("runs");
  const active = new Set(data.active || []);     // runs in flight, for the count and the title

  function renderTimes() {
    SB.renderWhen(tbody);
    for (const tr of tbody.querySelectorAll("tr[data-created]")) {
      const c = Number(tr.dataset.created), e = tr.dataset.ended ? Number(tr.dataset.ended) : null;
      const d = tr.querySelector(".dur");
      const text = SB.dur((e || SB.now()) - c);
      if (d && d.textContent !== text) d.textContent = text;
    }
  }
  function matches(r) {
    if (f.status === "archived" ? !r.archivedAt : f.status && r.status !== f.status) return false;
    if (f.caller && r.caller !== f.caller) return false;
    if (f.from != null && r.createdAtEpoch < f.from) return false;
    if (f.to != null && r.createdAtEpoch >= f.to) return false;
    const q = (f.q || "").toLowerCase();
    return !q || [r.runId, r.caller, r.label].some((v) => String(v || "").toLowerCase().includes(q));
  }
  function rowFor(r) {
    const label = el("td", { class: "label" }, el("a", { href: "/runs/" + r.runId, text: r.label }));
    if (r.label !== r.runId) label.append(" ", el("span", { class: "muted small mono", text: r.runId }));
    if (r.error && r.status !== "completed") label.append(el("div", { class: "why small", text: String(r.error).slice(0, 160) }));
    const tr = el("tr", { id: "run-" + r.runId, "data-created": r.createdAtEpoch, "data-ended": r.endedAtEpoch || "", "data-status": r.status },
      label, el("td", { text: r.caller }),
      el("td", { class: "status" }, el("span", { class: "badge s-" + r.status, text: r.status }),
        ...(r.archivedAt ? [" ", el("span", { class: "badge s-archived", title: "archived by retention: " + r.archivedAt, text: "archived" })] : [])),
      el("td", { class: "num", text: (r.spentEstimated ? "~" : "") + SB.usd(r.spentUsd) + " / " + SB.usd(r.budgetUsd) }),
      el("td", { class: "num", text: r.agents.done + "/" + r.agents.total }),
      el("td", { class: "when", "data-epoch": r.createdAtEpoch }), el("td", { class: "dur num" }));
    return tr;
  }
  function count(r) {
    if (SB.ACTIVE.includes(r.status)) active.add(r.runId); else active.delete(r.runId);
    $("running-count").textContent = active.size;
    SB.setTitle((active.size ? "● " + active.size + " running — " : "") + "runs");
  }
  function upsert(r) {
    count(r);
    const old = $("run-" + r.runId);
    if (!matches(r)) { if (old) old.remove(); return; }
    const tr = rowFor(r);
    if (old) { if (old.classList.contains("selected")) tr.classList.add("selected"); old.replaceWith(tr); }
    else if (data.firstPage) {
      const empty = tbody.querySelector(".empty");
      if (empty) empty.remove();
      tbody.prepend(tr);
      const rows = tbody.querySelectorAll("tr[data-created]");
      if (rows.length > data.limit) rows[rows.length - 1].remove();
    } else return;
    renderTimes();
  }

  // Keyboard: j/k or arrows move, Enter opens, / searches.
  function rows() { return Array.from(tbody.querySelectorAll("tr[data-created]")); }
  function select(i) {
    const all = rows();
    if (!all.length) return;
    i = Math.max(0, Math.min(all.length - 1, i));
    for (const r of all) r.classList.remove("selected");
    all[i].classList.add("selected");
    all[i].scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("keydown", (ev) => {
    if (ev.target.closest("input, select, textarea") || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const all = rows(), i = all.findIndex((r) => r.classList.contains("selected"));
    if (ev.key === "j" || ev.key === "ArrowDown") { select(i + 1); ev.preventDefault(); }
    else if (ev.key === "k" || ev.key === "ArrowUp") { select(i < 0 ? 0 : i - 1); ev.preventDefault(); }
    else if (ev.key === "Enter" && i >= 0) { all[i].querySelector("a").click(); ev.preventDefault(); }
    else if (ev.key === "/") { $("q").focus(); ev.preventDefault(); }
  });

  renderTimes();
  setInterval(renderTimes, 1000);
  SB.live("/events", data.after, { run: upsert });
})();
