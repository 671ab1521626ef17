// The run timeline: one row per agent in start order (top = first) under a time axis
// relative to the run's start (wall time on hover), waits drawn apart from running (queued
// for a slot, waiting for budget, waiting for a node), replayed agents as hatched markers at
// their original duration, nested workflows as collapsible lanes, a "now" cursor while
// the run is live, and zoom by dragging across the axis or the tracks.
(function () {
  "use strict";
  const { el } = SB;
  const NICE = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const VISUAL = ["state", "startedAt", "endedAt", "queuedAt", "workflow", "replayed", "originalDurationS", "label"];
  const ENDED = SB.ENDED;

  function rel(s) {
    const sign = s < -1e-9 ? "-" : "+";
    s = Math.abs(s);
    if (s < 60) return sign + (s % 1 > 1e-6 ? s.toFixed(1) : s.toFixed(0)) + "s";
    if (s < 3600) { const m = Math.floor(s / 60), r = Math.round(s % 60); return sign + m + "m" + (r ? String(r).padStart(2, "0") + "s" : ""); }
    const h = Math.floor(s / 3600), m = Math.round((s % 3600) / 60);
    return sign + h + "h" + (m ? String(m).padStart(2, "0") + "m" : "");
  }
  function laneOrder(a, b) {
    const pa = a ? a.split("/").map(Number) : [], pb = b ? b.split("/").map(Number) : [];
    for (let i = 0; i < Math.min(pa.length, pb.length); i++) if (pa[i] !== pb[i]) return pa[i] - pb[i];
    return pa.length - pb.length;
  }

  class Timeline {
    constructor(root, start, end) {
      this.root = root; this.start = start; this.end = end || null;
      this.entries = new Map();          // n -> {row, segs: [[state, epoch], ...], node}
      this.zoom = null; this.order = null; this.pending = false;
      this.head = el("div", { class: "tl-head" });
      this.zoomLabel = el("span", { class: "tl-zoom" });
      this.reset = el("button", { type: "button", text: "reset zoom", hidden: true });
      this.reset.addEventListener("click", () => this.setZoom(null));
      this.head.append(this.zoomLabel, this.reset);
      this.axis = el("div", { class: "tl-axis", title: "drag to zoom" });
      this.body = el("div", { class: "tl-body" });
      this.now = el("div", { class: "tl-now" });
      this.sel = el("div", { class: "tl-sel", hidden: true });
      this.overlay = el("div", { class: "tl-overlay" }, this.now, this.sel);
      this.grid = el("div", { class: "tl-grid" }, this.axis, this.body, this.overlay);
      this.tip = el("div", { class: "tl-tip", hidden: true });
      root.replaceChildren(this.head, this.grid, this.tip);
      this.bindMouse();
    }

    upsert(row, ts) {
      let e = this.entries.get(row.n);
      if (!e) {
        e = { row, segs: (row.segs || []).slice(), node: null };
        this.entries.set(row.n, e);
        this.order = null;
      } else {
        const was = e.row;
        if (was.startedAt !== row.startedAt || was.workflow !== row.workflow) this.order = null;
        e.row = Object.assign({}, was, row);
        // Usage updates change the tooltip only; the picture moves with the clock (tick).
        if (VISUAL.every((k) => e.row[k] === was[k])) return;
      }
      // Rows supersede each other in the stream, so states can be missed: what the row's
      // own times say comes first (it waited from queuedAt, ran from startedAt).
      if (!e.segs.length && !e.row.replayed) {
        if (e.row.queuedAt) e.segs.push(["queued", e.row.queuedAt]);
        if (e.row.startedAt) e.segs.push(["running", e.row.startedAt]);
      }
      const last = e.segs.length ? e.segs[e.segs.length - 1][0] : null;
      if (row.state && row.state !== last) {
        const at = row.state === "running" && row.startedAt ? row.startedAt : ENDED.includes(row.state) && row.endedAt ? row.endedAt : ts || SB.now();
        e.segs.push([row.state, at]);
      }
      this.schedule();
    }
    setEnd(t) { this.end = t || null; this.schedule(); }
    setZoom(z) { this.zoom = z; this.schedule(); }
    schedule() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this.render(); });
    }

    range(now) {
      if (this.zoom) return this.zoom;
      let hi = this.end || now || SB.now();
      for (const { row } of this.entries.values()) {
        if (row.endedAt && row.endedAt > hi) hi = row.endedAt;
        if (row.replayed && row.startedAt) hi = Math.max(hi, row.startedAt + (row.originalDurationS || 0));
      }
      let span = Math.max(hi - this.start, 1);
      if (!this.end) {
        // While live, the axis runs ahead of "now" and grows in steps, so a second passing
        // moves only the running bars and the cursor, not every bar on the page.
        if (!this.liveSpan || span > this.liveSpan * 0.92) this.liveSpan = Math.max(span * 1.5, 10);
        span = this.liveSpan;
      }
      return [this.start, this.start + span];
    }

    // The spans drawn for one agent: waits, then running coloured by how it ended.
    spans(e) {
      const r = e.row, now = this.end || SB.now();
      if (r.replayed) {
        const t = r.startedAt || r.queuedAt || this.start;
        return [["replayed", t, t + Number(r.originalDurationS != null ? r.originalDurationS : r.durationS || 0)]];
      }
      let segs = e.segs;
      if (!segs.length) {
        segs = [];
        if (r.queuedAt) segs.push(["queued", r.queuedAt]);
        if (r.startedAt) segs.push(["running", r.startedAt]);
        if (r.endedAt) segs.push([r.state, r.endedAt]);
        else if (r.state !== "running" && r.state !== "queued" && !segs.length) segs.push([r.state, this.start]);
      }
      const final = ENDED.includes(r.state) ? r.state : null;
      const out = [];
      for (let i = 0; i < segs.length; i++) {
        const [state, t0] = segs[i];
        if (ENDED.includes(state)) {
          if (!out.length || out[out.length - 1][0] !== state) out.push([state, t0, t0]);   // ended without running: a mark
          continue;
        }
        const t1 = i + 1 < segs.length ? segs[i + 1][1] : (final ? r.endedAt || t0 : now);
        out.push([state === "running" && final ? final : state, t0, Math.max(t0, t1)]);
      }
      return out;
    }

    tooltip(r) {
      const lines = [r.label || "agent " + r.n, "state: " + r.state];
      if (r.replayed) lines.push("replayed (ran " + SB.dur(r.originalDurationS != null ? r.originalDurationS : r.durationS || 0) + " originally)");
      else if (r.startedAt) lines.push("duration: " + SB.dur((r.endedAt || this.end || SB.now()) - r.startedAt));
      if (r.queuedAt && r.startedAt && !r.replayed) lines.push("waited: " + SB.dur(r.startedAt - r.queuedAt));
      lines.push("cost: " + SB.agentCost(r) + " · " + SB.int(r.tokens) + " tokens");
      if (r.phase) lines.push("phase: " + r.phase);
      if (r.workflow) lines.push("workflow: " + r.workflow);
      if (r.error) lines.push("why: " + r.error);
      return lines.join("\n");
    }

    layoutRows() {
      const lanes = new Map();
      const sorted = Array.from(this.entries.values()).sort((a, b) => {
        const sa = a.row.startedAt || Infinity, sb = b.row.startedAt || Infinity;
        if (sa !== sb) return sa - sb;
        return (a.row.queuedAt || 0) - (b.row.queuedAt || 0) || a.row.n - b.row.n;
      });
      for (const e of sorted) {
        const w = e.row.workflow || "";
        if (!lanes.has(w)) lanes.set(w, []);
        lanes.get(w).push(e);
      }
      const names = Array.from(lanes.keys()).sort(laneOrder);
      const frag = document.createDocumentFragment();
      for (const w of names) {
        const rows = el("div", { class: "tl-rows" });
        const lane = el("div", { class: "tl-lane" + (this.collapsedLanes().has(w) ? " collapsed" : ""), "data-workflow": w });
        if (names.length > 1) {
          const btn = el("button", { type: "button", text: this.collapsedLanes().has(w) ? "▸" : "▾", "aria-label": "collapse" });
          btn.addEventListener("click", () => {
            const c = this.collapsedLanes();
            if (c.has(w)) c.delete(w); else c.add(w);
            lane.classList.toggle("collapsed", c.has(w));
            btn.textContent = c.has(w) ? "▸" : "▾";
          });
          const depth = w ? w.split("/").length : 0;
          const head = el("div", { class: "tl-lane-head" }, btn, w ? "workflow " + w : "script", el("span", { class: "muted small", text: " · " + lanes.get(w).length + " agents" }));
          head.style.paddingLeft = depth * 0.8 + "rem";
          lane.append(head);
        }
        for (const e of lanes.get(w)) rows.append(this.rowNode(e));
        lane.append(rows);
        frag.append(lane);
      }
      this.body.replaceChildren(frag);
      this.order = sorted;
    }
    collapsedLanes() { return (this._collapsed = this._collapsed || new Set()); }

    rowNode(e) {
      if (!e.node) {
        e.track = el("div", { class: "tl-track", id: "bar-" + e.row.n });
        e.label = el("span", { class: "tl-label" });
        e.node = el("div", { class: "tl-row", id: "tl-" + e.row.n, "data-n": e.row.n }, e.label, e.track);
      }
      return e.node;
    }

    render() {
      if (!this.order) this.layoutRows();
      const now = SB.now();
      const [t0, t1] = this.range(now);
      const span = Math.max(t1 - t0, 1e-3);
      const x = (t) => (100 * (t - t0)) / span;
      this.renderAxis(t0, t1, span, x);
      this.now.hidden = !!this.end || now < t0 || now > t1;
      if (!this.now.hidden) this.now.style.left = x(now).toFixed(3) + "%";
      // Write only what changed: each write invalidates style, and this runs every second.
      const set = (node, key, value) => { if (node["_" + key] !== value) { node["_" + key] = value; node.style[key] = value; } };
      for (const e of this.entries.values()) {
        const r = e.row;
        const label = r.label || "agent " + r.n, cls = "tl-track st-" + r.state + (r.replayed ? " replayed" : "");
        if (e.label.textContent !== label) e.label.textContent = label;
        if (e.node.dataset.state !== r.state) e.node.dataset.state = r.state;
        if (e.node.dataset.start !== String(r.startedAt || "")) e.node.dataset.start = r.startedAt || "";
        if (e.track.className !== cls) e.track.className = cls;
        const spans = this.spans(e);
        while (e.track.childElementCount > spans.length) e.track.lastElementChild.remove();
        while (e.track.childElementCount < spans.length) e.track.append(el("div"));
        spans.forEach(([kind, a, b], i) => {
          const seg = e.track.children[i];
          const segCls = "seg s-" + kind + (kind === "replayed" ? " replayed" : "");
          if (seg.className !== segCls) seg.className = segCls;
          set(seg, "left", x(a).toFixed(2) + "%");
          set(seg, "width", Math.max(0, x(b) - x(a)).toFixed(2) + "%");
        });
      }
      this.zoomLabel.textContent = this.zoom ? "zoomed to " + rel(t0 - this.start) + " … " + rel(t1 - this.start) : "";
      this.reset.hidden = !this.zoom;
      if (!this.drawn) { this.drawn = true; performance.mark("sb-rendered"); }   // for bench/dashboard_pages.py
    }

    renderAxis(t0, t1, span, x) {
      const key = t0 + ":" + t1;
      if (this.axisKey === key) return;
      this.axisKey = key;
      const step = NICE.find((s) => span / s <= 8) || NICE[NICE.length - 1];
      const first = this.start + Math.ceil((t0 - this.start) / step - 1e-9) * step;
      const ticks = [], lines = [];
      for (let t = first, i = 0; t <= t1 + 1e-9 && i < 50; t += step, i++) {
        const left = x(t).toFixed(3) + "%";
        // A label at the far right edge would be cut off; its gridline still shows.
        const tick = el("div", { class: "tl-tick", title: SB.wall(t), text: x(t) < 96 ? rel(t - this.start) : "" });
        tick.style.left = left;
        const line = el("div", { class: "tl-gridline" });
        line.style.left = left;
        ticks.push(tick); lines.push(line);
      }
      this.axis.replaceChildren(...ticks);
      for (const old of this.overlay.querySelectorAll(".tl-gridline")) old.remove();
      this.overlay.prepend(...lines);
    }

    bindMouse() {
      const at = (ev) => {
        const box = this.axis.getBoundingClientRect();
        const [t0, t1] = this.range();
        const f = Math.max(0, Math.min(1, (ev.clientX - box.left) / box.width));
        return { f, t: t0 + f * (t1 - t0) };
      };
      let drag = null;
      this.grid.addEventListener("mousedown", (ev) => {
        if (ev.button !== 0 || ev.target.closest(".tl-label, button")) return;
        drag = at(ev);
        ev.preventDefault();
      });
      window.addEventListener("mousemove", (ev) => {
        if (!drag) return;
        const now = at(ev);
        this.sel.hidden = false;
        this.sel.style.left = Math.min(drag.f, now.f) * 100 + "%";
        this.sel.style.width = Math.abs(now.f - drag.f) * 100 + "%";
      });
      window.addEventListener("mouseup", (ev) => {
        if (!drag) return;
        const end = at(ev), box = this.axis.getBoundingClientRect();
        if (Math.abs(end.f - drag.f) * box.width > 4) this.setZoom([Math.min(drag.t, end.t), Math.max(drag.t, end.t)]);
        drag = null;
        this.sel.hidden = true;
      });
      this.grid.addEventListener("dblclick", () => this.setZoom(null));
      this.body.addEventListener("mousemove", (ev) => {
        const row = ev.target.closest(".tl-row");
        const e = row && this.entries.get(Number(row.dataset.n));
        if (!e) { this.tip.hidden = true; return; }
        this.tip.textContent = this.tooltip(e.row);
        this.tip.hidden = false;
        const box = this.root.getBoundingClientRect();
        this.tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 200) + "px";
        this.tip.style.top = ev.clientY - box.top + 14 + "px";
      });
      this.body.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    }
  }
  SB.Timeline = Timeline;
  SB.relTime = rel;
})();
