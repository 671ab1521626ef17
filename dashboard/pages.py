"""Gathering what a page shows from the supervisor (its registry and queries) and the run
store (what ended runs left on disk). Records read from disk may be damaged or older
than this daemon: those are read with defaults; the live objects are read as typed."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

from swarmbase import fsutil
from swarmbase.runs import naming
from swarmbase.runs.store import RunStore
from swarmbase.runs.supervisor import Supervisor

from . import views
from .transcript import render_transcript

HISTORY_READS = 1_000        # agents whose records are read for the timeline's waits
SCRIPT_SHOWN = 200_000       # bytes of a script shown on its run page
TRANSCRIPT_TAIL = 4 << 20    # bytes of a transcript read for its agent page
COMMENTS_KEPT = 4_096


def tail_lines(path: Path, limit: int) -> tuple[list[Any], bool]:
    """Parsed JSON lines of the last `limit` bytes of a file; True if earlier ones were cut."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            raw = f.read()
    except FileNotFoundError:
        return [], False
    cut = size > limit
    if cut:
        raw = raw[raw.find(b"\n") + 1:]
    out = []
    for line in raw.split(b"\n"):
        if line.strip():
            try:
                out.append(json.loads(line))
            except (ValueError, RecursionError):     # the daemon writes neither; a hand edit might
                continue
    return out, cut


def safe_json(value: Any) -> str:
    """JSON for a <script type="application/json"> block: nothing in it can close the tag."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class Pages:
    def __init__(self, sup: Supervisor, store: RunStore) -> None:
        self.sup = sup
        self.store = store
        self._comments: OrderedDict[str, str] = OrderedDict()

    # -- labels ---------------------------------------------------------------------
    def label(self, run: Any, disk: bool = True) -> str:
        """What the run is called (swarmbase.runs.naming, the rule notices and tools use).
        A run recorded before the leading comment was kept has its script.js read for it;
        disk=False (search) never reads: a search must not depend on which runs happened
        to be shown before."""
        comment = run.script_comment
        if comment is None and disk and not run.label and naming.meta_name(run.meta) is None:
            comment = self._comments.get(run.id)
            if comment is None:
                try:
                    with open(self.store.dir(run) / "script.js", "rb") as f:
                        comment = naming.leading_comment(f.read(4096).decode("utf-8", "replace")) or ""
                except OSError:
                    comment = ""
                self._comments[run.id] = comment
                while len(self._comments) > COMMENTS_KEPT:
                    self._comments.popitem(last=False)
        return naming.run_name(run.label, run.meta, comment or None)

    # -- the run list -----------------------------------------------------------------
    def list_row(self, run: Any) -> dict[str, Any]:
        return {"id": run.id, "label": self.label(run), "caller": run.caller, "status": run.status,
                "spent": views.usd(run.spent_usd), "estimated": bool(run.spent_estimated),
                "budget": views.usd(run.budget_usd), "done": run.agents_done, "total": run.agents_total,
                "created": run.created_at, "ended": run.ended_at, "error": run.error or "",
                "archived": run.archived_at is not None}

    def damaged(self) -> list[dict[str, Any]]:
        return [d for d in self.store.damaged if isinstance(d, dict)]

    # -- the run page -------------------------------------------------------------------
    def run_view(self, run: Any) -> dict[str, Any]:
        sup = self.sup
        live = sup.live.get(run.id)
        phases: list[dict[str, Any]] = [{"title": p.get("title"), "workflow": str(p.get("workflow") or ""),
                   "rows": sorted((views.normalize(a, p.get("title")) for a in p.get("agents", [])),
                                  key=lambda r: r.get("n", 0))} for p in sup.phases(run)]
        rows: list[dict[str, Any]] = [r for p in phases for r in p["rows"]]
        adir = self.store.dir(run) / "agents"
        for i, r in enumerate(rows):
            rec = live.agents.get(r["n"]) if live is not None else None
            if rec is not None:
                history, error = rec.history, rec.error
            elif i < HISTORY_READS:
                saved = read_json(adir / str(r["n"]) / "agent.json")
                history, error = (saved or {}).get("history") or [], (saved or {}).get("error")
            else:
                history, error = [], None
            r["segs"] = views.segments(history)
            if r.get("error") is None and r["state"] in views.WHY_STATES:
                r["error"] = error
        reserved = live.usd.ledger.reserved if live is not None else 0.0
        codex_tokens = sum(r["tokens"] for r in rows if r["engine"] == "codex")
        spent_tokens = _num(run.spent_tokens)
        reserved_tokens = live.tokens.ledger.reserved if live is not None else 0.0
        script = self._script(run)
        return {
            "run": run, "label": self.label(run), "phases": phases,
            "rows": rows, "byPhase": views.totals(rows, "phase"), "byEngine": views.totals(rows, "engine"),
            "budget": {"spent": run.spent_usd, "reserved": reserved, "total": run.budget_usd,
                       "estimated": bool(run.spent_estimated), **views.budget_bar(run.spent_usd, reserved,
                                                                                  run.budget_usd)},
            "tokens": {"spent": int(spent_tokens), "reserved": int(reserved_tokens), "total": run.budget_tokens,
                       "shown": bool(codex_tokens or spent_tokens or reserved_tokens),
                       **views.budget_bar(spent_tokens, reserved_tokens, run.budget_tokens)},
            "script": script, "args": json.dumps(run.args, indent=2, ensure_ascii=False),
            "resumedAs": run.resumed_as or self._resumed_as(run),
            "title": views.run_title(run.status, self.label(run), run.agents_done, run.agents_total,
                                     sum(1 for r in rows if r["state"] == "running")),
        }

    def _script(self, run: Any) -> str:
        try:
            with open(self.store.dir(run) / "script.js", "rb") as f:
                return f.read(SCRIPT_SHOWN).decode("utf-8", "replace")
        except OSError:
            return ""

    def _resumed_as(self, run: Any) -> str | None:
        later = [r for r in self.sup.runs.values() if r.resumed_from == run.id]
        return max(later, key=lambda r: r.created_at).id if later else None

    def client_data(self, view: dict[str, Any], after: int) -> str:
        run = view["run"]
        return safe_json({"runId": run.id, "status": run.status, "label": view["label"], "caller": run.caller,
                          "createdAt": run.created_at, "endedAt": run.ended_at, "after": after,
                          "agents": view["rows"], "budget": view["budget"], "tokens": view["tokens"],
                          "done": run.agents_done, "total": run.agents_total, "errorLine": run.error_line})

    # -- the agent page -----------------------------------------------------------------
    def agent_view(self, run: Any, n: int) -> dict[str, Any] | None:
        d = self.store.dir(run) / "agents" / str(n)
        record = read_json(d / "agent.json")
        if not isinstance(record, dict):
            return None
        live = self.sup.live.get(run.id)
        if live is not None and n in live.agents:
            record = live.agents[n].to_json()
        entries, cut = tail_lines(d / "transcript.jsonl", TRANSCRIPT_TAIL)
        tokens = record.get("tokens") if isinstance(record.get("tokens"), dict) else {"total": record.get("tokens")}
        row = views.normalize({**record, "tokens": tokens.get("total") or 0})
        try:
            prompt = (d / "prompt.txt").read_text(errors="replace")
        except OSError:
            prompt = ""
        return {"record": record, "row": row, "tokens": tokens, "prompt": prompt,
                "options": json.dumps(read_json(d / "opts.json"), indent=2, ensure_ascii=False),
                "transcript": render_transcript(entries), "cut": cut, "entries": entries}


def read_json(path: Path) -> Any:
    """A record, or None if it is missing or damaged (a page shows what it can)."""
    try:
        return fsutil.read_json(path)
    except (OSError, ValueError):
        return None


def _num(*candidates: Any) -> float:
    for c in candidates:
        if isinstance(c, (int, float)) and not isinstance(c, bool):
            return float(c)
    return 0.0
