// SwarmBase run page: shows "verified" or the first break of the run's hash chains,
// from /runs/<id>/audit.json. Fills <span id="audit-badge" data-run="<id>">.
(function () {
  "use strict";
  const badge = document.getElementById("audit-badge");
  if (!badge || !badge.dataset.run) return;
  const show = (text, cls, title) => {
    badge.textContent = text;
    badge.className = "audit " + cls;
    if (title) badge.title = title;
  };
  fetch("/runs/" + encodeURIComponent(badge.dataset.run) + "/audit.json")
    .then((r) => r.json())
    .then((v) => {
      if (v.error) return show("audit: " + v.error, "audit-unknown");
      if (v.break) return show(`record broken: ${v.break.file} line ${v.break.line}`, "audit-broken", v.break.reason);
      if (v.status === "intact") return show("verified", "audit-ok", "every hash chain of this run is intact");
      if (v.status === "unchained") return show("unchained", "audit-unknown", "written before hash chains");
      show("not sealed yet", "audit-unknown", (v.notes || []).join("; "));
    })
    .catch(() => show("audit unavailable", "audit-unknown"));
})();
