"""Rebuilding a run's derived records from what is intact beside them (issue 25 #4, #5).

A damaged `run.json` made the whole run vanish (boot quarantined the run dir) although
its journal, agents and result were intact; a damaged `phases.json` made `status` fail.
Both are records the other files can stand in for:

- phases: every agent's final record names its phase and workflow, so the phases are the
  agents grouped by (workflow, phase) in agent order (a phase with no agent is lost).
- the run: its id and start time are in the dir name, its owner in the journal header
  (written at start since issue 25), and whatever fields of the damaged file are still
  whole are salvaged one by one; counts and spend are summed from the agents; how it
  ended comes from a salvaged terminal status, else result.json (completed), else the
  log's last `run <status>: <error>` line, else it was in flight (boot interrupts it).
  What could not be recovered is listed in the record's `rebuilt.lost`, and resume asks
  for args when they were lost rather than guess them.

Pure functions over parsed parts; the store does the reading and writing.
"""

from __future__ import annotations

import calendar
import json
import re
import time

from ..jsonvalue import Json, JsonObject
from .journal import args_hash
from .model import RUN_ID, STATUSES, TERMINAL, Run, iso
from .naming import leading_comment
from .records import AgentRecord, finished

# run.json keys a rebuilt run can only take from the damaged file (listed as lost if absent).
ONLY_IN_RUN_JSON = ("args", "label", "meta", "model", "effort", "profile", "budgetUsd", "budgetTokens", "keepWork",
                    "timeoutMs", "budgetWarnAt", "resumedFrom", "link", "end", "notice")
_TYPES: dict[str, tuple[type, ...]] = {
    **{k: (str,) for k in ("caller", "label", "model", "effort", "profile", "error", "resumedFrom", "resumedAs",
                           "scriptComment", "status")},
    **{k: (int, float) for k in ("createdAt", "endedAt", "budgetUsd", "budgetTokens", "spentUsd", "spentTokens",
                                 "timeoutMs", "budgetWarnAt", "errorLine")},
    **{k: (bool,) for k in ("keepWork", "spentEstimated")},
    **{k: (dict,) for k in ("meta", "link", "end", "notice")},
    "history": (list,),
}
END_LINE = re.compile(r"^run (failed|cancelled|interrupted): (.*)$", re.DOTALL)


def salvage_object(raw: bytes) -> JsonObject:
    """The top-level fields of a JSON object that are still whole, in order, up to the
    first one that is not (a torn file keeps its head; garbage yields nothing)."""
    text = raw.decode("utf-8", errors="replace")
    dec = json.JSONDecoder()
    out: JsonObject = {}
    i = text.find("{")
    if i < 0:
        return out
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            key, i = dec.raw_decode(text, i)
            i = _skip_space(text, i)
            if not isinstance(key, str) or text[i:i + 1] != ":":
                return out
            value, i = dec.raw_decode(text, _skip_space(text, i + 1))
        except (ValueError, RecursionError, IndexError):
            return out
        out[key] = value


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def phases_from_agents(agents: list[AgentRecord]) -> list[JsonObject]:
    """status/phases.json rows, grouped by (workflow, phase) in agent order."""
    phases: dict[tuple[str, str], JsonObject] = {}
    for rec in sorted(agents, key=lambda r: r.n):
        title = rec.phase or ("main" if not rec.workflow else f"workflow {rec.workflow}")
        phase = phases.setdefault((rec.workflow, title), {"title": title, "workflow": rec.workflow, "agents": []})
        phase["agents"].append(rec.row())
    return list(phases.values())


def _stamp_time(dir_name: str) -> float:
    return float(calendar.timegm(time.strptime(dir_name.split("-", 1)[0], "%Y%m%dT%H%M%SZ")))


def run_from_parts(dir_name: str, salvaged: JsonObject, *, journal_head: JsonObject | None,
                   agents: list[AgentRecord], script: str | None, result: tuple[bool, float | None] | None,
                   last_log: JsonObject | None, log_at: float | None, fault: str,
                   damaged_copy: str | None, now: float) -> Run | None:
    """A run record rebuilt from its dir's other files, or None when nothing says whose
    run it is (then it cannot be served to anyone). `result`: (has a value, mtime)."""
    run_id = dir_name.split("-", 1)[1] if "-" in dir_name else ""
    if not RUN_ID.match(run_id):
        return None
    kept: JsonObject = {k: v for k, v in salvaged.items() if k in _TYPES and isinstance(v, _TYPES[k])
            and not (isinstance(v, bool) and bool not in _TYPES[k])}
    if kept.get("status") not in STATUSES:
        kept.pop("status", None)
    head = journal_head or {}
    caller = kept.get("caller") or (head.get("caller") if isinstance(head.get("caller"), str) else None)
    if not caller:
        return None
    lost = [k for k in ONLY_IN_RUN_JSON if k not in salvaged]
    if "args" not in salvaged and head.get("args") == args_hash(None):
        lost.remove("args")              # the journal says the run had no args
    created = kept.get("createdAt", _stamp_time(dir_name))
    d: JsonObject = {**kept, "id": run_id, "dirName": dir_name, "caller": caller, "createdAt": created,
                         "agentsTotal": len(agents), "agentsDone": sum(1 for a in agents if finished(a)),
                         "spentUsd": kept.get("spentUsd", sum(a.cost_usd for a in agents)),
                         "spentEstimated": kept.get("spentEstimated", any(a.cost_estimated for a in agents)),
                         "spentTokens": kept.get("spentTokens", sum(a.tokens.total for a in agents
                                                                    if a.engine == "codex"))}
    if "args" in salvaged:
        d["args"] = salvaged["args"]
    if script is not None and "scriptComment" not in kept:
        d["scriptComment"] = leading_comment(script)
    if kept.get("status") not in TERMINAL:
        ended = _how_it_ended(result, last_log, log_at)
        if ended is None:
            d["status"] = "running"          # in flight, as far as the files say: boot interrupts it
        else:
            d["status"], d["endedAt"], d["error"] = ended
    history: list[Json] = kept.get("history") or [{"status": "queued", "at": iso(created)}]
    if d["status"] != (history[-1].get("status") if isinstance(history[-1], dict) else None):
        history = [*history, {"status": d["status"], "at": iso(d.get("endedAt") or now),
                              "reason": "rebuilt at boot from the run's files"}]
    d["history"] = history
    d["rebuilt"] = {"at": iso(now), "fault": fault, "damagedCopy": damaged_copy, "lost": lost}
    try:
        return Run.from_json(d)
    except (ValueError, KeyError, TypeError):
        return None


def _how_it_ended(result: tuple[bool, float | None] | None, last_log: JsonObject | None,
                  log_at: float | None) -> tuple[str, float, str | None] | None:
    if result is not None and result[0]:
        return "completed", result[1] or time.time(), None
    message = last_log.get("message") if isinstance(last_log, dict) else None
    m = END_LINE.match(message) if isinstance(message, str) else None
    if m is not None:
        return m.group(1), log_at or time.time(), m.group(2)
    return None
