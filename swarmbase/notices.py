"""Run-end notices: the push/event params for swarmbase.notify. No I/O."""

from __future__ import annotations

import time
from typing import Any

from .mcpl.features import NOTIFY_SET
from .runs.model import Run, iso

PREVIEW_CHARS = 400


def event_id(run_id: str) -> str:
    return f"{run_id}:end"


def notice_text(run: Run, result_preview: str | None) -> str:
    spend = f"${run.spent_usd:.2f}" + (" (estimated)" if run.spent_estimated else "")
    agents = f"{run.agents_total} agent{'s' if run.agents_total != 1 else ''}"
    head = f"Run {run.display_label} ({run.id}) {run.status}: {agents}, {spend} of ${run.budget_usd:.2f}."
    if run.status == "completed":
        preview = (result_preview or "null").strip()
        if len(preview) > PREVIEW_CHARS:
            preview = preview[:PREVIEW_CHARS] + "… (use the result tool for the rest)"
        return f"{head}\nResult: {preview}"
    if run.error:
        where = f" (script line {run.error_line})" if run.error_line else ""
        return f"{head}\nError{where}: {run.error}"
    return head


def build(run: Run, result_preview: str | None, url: str | None = None, now: float | None = None) -> dict[str, Any]:
    """The push/event params. The same eventId is reused on every retry."""
    text = notice_text(run, result_preview) + (f"\nDashboard: {url}" if url else "")
    return {
        "featureSet": NOTIFY_SET,
        "eventId": event_id(run.id),
        "timestamp": iso(time.time() if now is None else now),
        "origin": {"source": "swarmbase", "kind": "run-end", "runId": run.id},
        "tags": ["surface:done", "swarmbase:run-end", f"swarmbase:{run.status}"],
        "payload": {"content": [{"type": "text", "text": text}]},
    }
