"""Notices pushed to a run's caller (swarmbase.notify): the push/event params. No I/O.

Every notice names the run's dashboard page (`url`, publicUrl-based when configured), in
its text and in its origin, and keeps one eventId per notice kind and run so a resend is
recognised by the host as the same event.

A run-end notice also carries the hash of the run's sealed end record (`origin.endHash`
and a line of its text) once that record is written: the copy of it kept outside the
daemon's disk, which `swarmbase audit RUN_ID --expect-hash HASH` checks the run against.

What the script or its subagents wrote is kept apart from the daemon's words (issue 24 #5,
swarmbase/data_frame.py): the first content block is the daemon's (status line, link, end
hash; the run's title JSON-quoted on one line, as progress notices quote labels and phases),
and a completed run's result preview or a failed run's error is a second block, a one-line note and a fence the content cannot close. A subagent
that read hostile text can put it in the result, but not outside that fence.
"""

from __future__ import annotations

import time
from typing import Any

from ..data_frame import ERROR_NOTE, framed, one_line, quoted
from ..mcpl.features import NOTIFY_SET
from ..money import usd
from ..runs.model import Run, iso

PREVIEW_CHARS = 400


def event_id(run_id: str) -> str:
    return f"{run_id}:end"


def budget_warning_id(run_id: str) -> str:
    return f"{run_id}:budget-warning"


def notice_text(run: Run, url: str | None = None) -> str:
    """The daemon's own words about the run's end (the first content block)."""
    spend = usd(run.spent_usd) + (" (estimated)" if run.spent_estimated else "")
    agents = f"{run.agents_total} agent{'s' if run.agents_total != 1 else ''}"
    head = f"Run {quoted(run.display_label, 200)} ({run.id}) {run.status}: {agents}, {spend} of {usd(run.budget_usd)}."
    if url:
        head += f"\nDashboard: {url}"
    if run.status != "completed" and run.error and run.status != "failed":
        head += f"\nError: {one_line(run.error, 400)}"     # cancelled / interrupted: the daemon's words
    return head


def data_block(run: Run, result_preview: str | None) -> str | None:
    """What the script or its subagents wrote, framed as data (the second content block):
    a completed run's return value, a failed run's error message. None: nothing to show."""
    if run.status == "completed":
        preview = (result_preview or "null").strip()
        cut = len(preview) > PREVIEW_CHARS
        text = framed(preview[:PREVIEW_CHARS] if cut else preview)
        return text + ("\n(The first 400 characters; the result tool has the rest.)" if cut else "")
    if run.status == "failed" and run.error:
        where = f" (script line {run.error_line})" if run.error_line else ""
        return f"Error{where}. " + framed(run.error, ERROR_NOTE, info="text")
    return None


def _origin(kind: str, run_id: str, url: str | None) -> dict[str, Any]:
    # Only keys the host does not reserve (source, kind, runId, url); see notes/mcpl.md §4.
    origin: dict[str, Any] = {"source": "swarmbase", "kind": kind, "runId": run_id}
    if url:
        origin["url"] = url
    return origin


def build(run: Run, result_preview: str | None, now: float | None = None, url: str | None = None,
          end_hash: str | None = None) -> dict[str, Any]:
    """The run-end push/event params. The same eventId is reused on every retry. The
    daemon's words are the first content block; the data block (data_block) is a block of
    its own, so a host can tell the two apart."""
    content = [{"type": "text", "text": notice_text(run, url)}]
    data = data_block(run, result_preview)
    if data is not None:
        content.append({"type": "text", "text": data})
    notice = {
        "featureSet": NOTIFY_SET,
        "eventId": event_id(run.id),
        "timestamp": iso(time.time() if now is None else now),
        "origin": _origin("run-end", run.id, url),
        "tags": ["surface:done", "swarmbase:run-end", f"swarmbase:{run.status}"],
        "payload": {"content": content},
    }
    return with_end_hash(notice, end_hash) if end_hash else notice


def restated(notice: dict[str, Any], event_id: str, words: str) -> dict[str, Any]:
    """A second end notice of a run (a copy): its own eventId, since a host that already
    took the first drops a repeated id, and `words` after the daemon's first line saying
    why there is a second."""
    content = [dict(block) for block in notice["payload"]["content"]]
    content[0]["text"] += "\n" + words
    return {**notice, "eventId": event_id, "payload": {**notice["payload"], "content": content}}


def end_hash_of(notice: dict[str, Any]) -> str | None:
    origin = notice.get("origin")
    value = origin.get("endHash") if isinstance(origin, dict) else None
    return value if isinstance(value, str) else None


def with_end_hash(notice: dict[str, Any], end_hash: str) -> dict[str, Any]:
    """The run-end notice carrying its run's end-record hash (a copy; once only)."""
    if end_hash_of(notice) is not None:
        return notice
    content = [dict(block) for block in notice["payload"]["content"]]
    content[0]["text"] += f"\nEnd record hash: {end_hash}"
    return {**notice, "origin": {**notice["origin"], "endHash": end_hash},
            "payload": {**notice["payload"], "content": content}}


def build_budget_warning(run: Run, spent: float, reserved: float, budget: float, url: str | None,
                         now: float | None = None) -> dict[str, Any]:
    """The once-per-run warning that spend plus reservations crossed the run's warning
    threshold, so the resident can cancel before the ceiling."""
    used = spent + reserved
    share = f" ({used / budget:.0%})" if budget > 0 else ""
    text = (f"Run {quoted(run.display_label, 200)} ({run.id}) has spent {usd(spent)} (+ {usd(reserved)} reserved for "
            f"agents in flight) of its {usd(budget)} budget{share}. It stops at the budget; cancel it now "
            f"if the rest is not worth it.")
    if url:
        text += f"\nDashboard: {url}"
    return {
        "featureSet": NOTIFY_SET,
        "eventId": budget_warning_id(run.id),
        "timestamp": iso(time.time() if now is None else now),
        "origin": _origin("budget-warning", run.id, url),
        "tags": ["swarmbase:budget-warning"],
        "payload": {"content": [{"type": "text", "text": text}]},
    }
