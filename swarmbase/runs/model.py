"""What a run is: its record, statuses and transitions. Pure data, no I/O."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import sys
import time
from typing import Optional

import attrs

from ..jsonvalue import Json, JsonObject
from .naming import run_name

RUN_ID = re.compile(r"^run_[0-9a-f]{12}$")
ACTIVE = ("queued", "running")
TERMINAL = ("completed", "failed", "cancelled", "interrupted")
STATUSES = ACTIVE + TERMINAL


def new_run_id() -> str:
    return "run_" + secrets.token_hex(6)


def stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


class Stowed:
    """Where an ended run's chain link or sealed end record is: a key of its run.json. The
    end record (a copy of the whole run record, hashed) and the link are read back only
    when run.json is rewritten or a resume links to it, so a finished run costs memory for
    its summary only."""
    __slots__ = ("path", "key")

    def __init__(self, path: str | os.PathLike[str], key: str) -> None:
        self.path = str(path)
        self.key = key

    def read(self) -> Optional[JsonObject]:
        try:
            with open(self.path, "rb") as f:
                value = json.loads(f.read()).get(self.key)
        except ValueError as e:      # never write a record without its seal: fail as a disk fault
            raise OSError(errno.EIO, f"{self.path} cannot be read back ({e})") from e
        return value if isinstance(value, dict) else None


def _packed(value: Json) -> Json:
    """A JSON object as compact text (None stays None; text or a Stowed is kept as is)."""
    if value is None or isinstance(value, (str, Stowed)):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _unpacked(value: Json) -> Json:
    """What _packed kept, as a JSON object again (read back from run.json if stowed)."""
    if isinstance(value, Stowed):
        return value.read()
    return json.loads(value) if value is not None else None


def _ref(v: Json) -> Optional[tuple[str, int]]:
    """A notice's place in the outbox log, from add()'s dict, a tuple, or run.json."""
    if isinstance(v, dict):
        v = (v.get("log"), v.get("seq"))
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], int) \
            and not isinstance(v[1], bool):
        return (sys.intern(v[0]), v[1])      # one log id string shared by every run
    return None


def _notice_id(v: Json) -> Optional[str]:
    eid = v.get("eventId") if isinstance(v, dict) else None
    return eid if isinstance(eid, str) else None


@attrs.define
class Run:
    id: str
    caller: str
    dir_name: str
    created_at: float
    label: Optional[str] = None
    meta: Optional[JsonObject] = None
    status: str = "queued"
    _history: Json = attrs.Factory(list)      # a list; packed JSON text once the run has ended (stow_end)
    args: Json = None
    model: Optional[str] = None
    effort: Optional[str] = None
    profile: str = "think"
    budget_usd: float = 0.0
    budget_tokens: int = 0
    keep_work: bool = False
    spent_usd: float = 0.0
    spent_estimated: bool = False
    agents_total: int = 0
    agents_done: int = 0
    error: Optional[str] = None
    error_line: Optional[int] = None
    ended_at: Optional[float] = None
    resumed_from: Optional[str] = None
    resumed_as: Optional[str] = None
    spent_tokens: int = 0
    timeout_ms: Optional[int] = None
    budget_warn_at: Optional[float] = None
    script_comment: Optional[str] = None  # the script's leading // comment line (naming.leading_comment)
    # Claude Code's Workflow call shape and language (issue 21): the run's token target
    # (budget.total; None: no target), the caller's description, and the repository its
    # agents work in (the default cwd, and where isolation: 'worktree' worktrees come from).
    token_target: Optional[int] = None
    description: Optional[str] = None
    repository: Optional[str] = None      # the run's project (its path)
    project_name: Optional[str] = None    # its name in the caller's `projects`, if it has one
    # Where its end notice went in the outbox log, (log id, seq) from Outbox.add: lets boot
    # queue again a notice that a torn outbox line lost (Outbox.lost_at_load).
    notice_ref: Optional[tuple[str, int]] = attrs.field(default=None, converter=_ref)
    # The end notice's eventId when it is not the usual one (a second notice, boot.py).
    notice_id: Optional[str] = None
    # Set when run.json was damaged and this record rebuilt from the run's other files
    # (runs/rebuild.py): {at, fault, damagedCopy, lost: [run.json keys not recovered]}.
    rebuilt: Optional[JsonObject] = None
    # The progress notices the run asked for (`run` parameter notify: "phase", "failures";
    # progress_notice.py); None: none. Kept in run.json, so a resume keeps the choice.
    notify: Optional[list[str]] = None
    # The hash-chain link (swarmbase.audit.chain.run_link, set at start) and the sealed end
    # record (set once when the run ends): compact JSON text, then left in run.json once the
    # run has ended (stow_end). As nested dicts they were most of what a finished run cost
    # the daemon in memory. Read and set them through the `link` and `end` properties.
    _link: Json = attrs.field(default=None, converter=_packed)
    _end: Json = attrs.field(default=None, converter=_packed)
    # When retention archived it (runs/archive.py): its files are then in a zip, and this
    # record holds what the index keeps (no args, history or seal). Not in run.json.
    archived_at: Optional[float] = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def display_label(self) -> str:
        """What the run is called in notices, tools and the dashboard (naming.run_name)."""
        return run_name(self.label, self.meta, self.script_comment)

    def set_status(self, status: str, at: float, **detail: Json) -> None:
        assert status in STATUSES, status
        if self.status in TERMINAL:
            raise ValueError(f"run {self.id} already ended as {self.status}")
        self.status = status
        self.history.append({"status": status, "at": iso(at), **detail})
        if status in TERMINAL:
            self.ended_at = at

    @property
    def link(self) -> Optional[JsonObject]:
        return _unpacked(self._link)

    @link.setter
    def link(self, value: Optional[JsonObject]) -> None:
        self._link = _packed(value)

    @property
    def end(self) -> Optional[JsonObject]:
        return _unpacked(self._end)

    @end.setter
    def end(self, value: Optional[JsonObject]) -> None:
        self._end = _packed(value)

    @property
    def history(self) -> list[JsonObject]:
        return json.loads(self._history) if isinstance(self._history, str) else self._history

    @history.setter
    def history(self, value: list[JsonObject]) -> None:
        self._history = list(value)

    @property
    def sealed(self) -> bool:
        return self._end is not None

    def stow_end(self, run_json: Json) -> None:
        """The run has ended and `run_json` (a Path) holds its sealed end record: keep only
        where it is, and pack the history (it never changes again)."""
        if self.status not in TERMINAL:
            return
        if isinstance(self._end, str):
            self._end = Stowed(run_json, "end")
            if isinstance(self._link, str):
                self._link = Stowed(run_json, "link")
        if isinstance(self._history, list):
            self._history = _packed(self._history)

    def to_json(self) -> JsonObject:
        return {
            "schema": 1,
            "id": self.id, "caller": self.caller, "dirName": self.dir_name,
            "createdAt": self.created_at, "endedAt": self.ended_at,
            "label": self.label, "meta": self.meta, "status": self.status, "history": self.history,
            "args": self.args, "model": self.model, "effort": self.effort, "profile": self.profile,
            "budgetUsd": self.budget_usd, "budgetTokens": self.budget_tokens, "keepWork": self.keep_work,
            "spentUsd": self.spent_usd, "spentEstimated": self.spent_estimated, "spentTokens": self.spent_tokens,
            "agentsTotal": self.agents_total, "agentsDone": self.agents_done,
            "error": self.error, "errorLine": self.error_line, "resumedFrom": self.resumed_from,
            "resumedAs": self.resumed_as, "timeoutMs": self.timeout_ms, "budgetWarnAt": self.budget_warn_at,
            "scriptComment": self.script_comment, "tokenTarget": self.token_target, "description": self.description,
            "repository": self.repository, "project": self.repository, "projectName": self.project_name,
            "link": self.link, "end": self.end,
            "notice": {"log": self.notice_ref[0], "seq": self.notice_ref[1],
                       **({"eventId": self.notice_id} if self.notice_id else {})} if self.notice_ref else None,
            **({"rebuilt": self.rebuilt} if self.rebuilt else {}),
            **({"notify": self.notify} if self.notify else {}),
        }

    @classmethod
    def from_json(cls, d: JsonObject) -> "Run":
        """A run record; raises ValueError (or KeyError/TypeError) for one that is not whole."""
        def num(key: str, default: float = 0.0) -> float:
            v = d.get(key, default)
            if v is None:
                return default
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
                raise ValueError(f"{key} is not a finite number")
            return float(v)

        if not isinstance(d.get("id"), str) or not RUN_ID.fullmatch(d["id"]):
            raise ValueError("no valid run id")
        if d.get("status") not in STATUSES:
            raise ValueError(f"unknown status {str(d.get('status'))[:40]!r}")
        for key in ("caller", "dirName"):
            if not isinstance(d.get(key), str):
                raise ValueError(f"{key} is missing")
        ended = d.get("endedAt")
        return cls(
            id=d["id"], caller=d["caller"], dir_name=d["dirName"], created_at=num("createdAt"),
            ended_at=num("endedAt") if ended is not None else None, label=_str(d.get("label")),
            meta=d.get("meta") if isinstance(d.get("meta"), dict) else None, status=d["status"],
            history=list(d.get("history") or []), args=d.get("args"), model=_str(d.get("model")),
            effort=_str(d.get("effort")), profile=str(d.get("profile", "think")), budget_usd=num("budgetUsd"),
            budget_tokens=int(num("budgetTokens")), keep_work=bool(d.get("keepWork", False)),
            spent_usd=num("spentUsd"), spent_estimated=bool(d.get("spentEstimated", False)),
            spent_tokens=int(num("spentTokens")),
            agents_total=int(num("agentsTotal")), agents_done=int(num("agentsDone")),
            error=_str(d.get("error")), error_line=d.get("errorLine") if isinstance(d.get("errorLine"), int) else None,
            resumed_from=_str(d.get("resumedFrom")), resumed_as=_str(d.get("resumedAs")),
            timeout_ms=d.get("timeoutMs") if isinstance(d.get("timeoutMs"), int) else None,
            budget_warn_at=num("budgetWarnAt") if d.get("budgetWarnAt") is not None else None,
            # Older records kept the first line of code as "scriptLine": never a name now.
            script_comment=_str(d.get("scriptComment")),
            token_target=d.get("tokenTarget") if isinstance(d.get("tokenTarget"), int) and not isinstance(
                d.get("tokenTarget"), bool) else None,
            description=_str(d.get("description")), repository=_str(d.get("repository")),
            project_name=_str(d.get("projectName")),
            notice_ref=d.get("notice"),
            notice_id=_notice_id(d.get("notice")),
            rebuilt=d.get("rebuilt") if isinstance(d.get("rebuilt"), dict) else None,
            notify=([k for k in d["notify"] if isinstance(k, str)] or None) if isinstance(d.get("notify"), list) else None,
            link=d.get("link") if isinstance(d.get("link"), dict) else None,
            end=d.get("end") if isinstance(d.get("end"), dict) else None,
        )

    def summary(self) -> JsonObject:
        """The caller-facing summary used by `list` and `status`."""
        return {
            "runId": self.id, "label": self.display_label, "description": self.description, "status": self.status,
            "createdAt": iso(self.created_at), "endedAt": iso(self.ended_at) if self.ended_at else None,
            "budgetUsd": self.budget_usd, "spentUsd": round(self.spent_usd, 6),
            "spentEstimated": self.spent_estimated, "budgetTokens": self.budget_tokens,
            "spentTokens": self.spent_tokens, "tokenTarget": self.token_target,
            "agents": {"done": self.agents_done, "total": self.agents_total},
            "error": self.error, "errorLine": self.error_line, "resumedFrom": self.resumed_from,
            "resumedAs": self.resumed_as, "project": self.repository, "projectName": self.project_name,
            **({"archivedAt": iso(self.archived_at)} if self.archived_at is not None else {}),
            **({"rebuilt": rebuilt_note(self.rebuilt)} if self.rebuilt else {}),
        }


def rebuilt_note(rebuilt: JsonObject) -> str:
    """What a caller reads about a run whose record was rebuilt from damage."""
    lost = [k for k in rebuilt.get("lost") or [] if isinstance(k, str)]
    return ("its record (run.json) was damaged and was rebuilt from the run's journal, agents, log and result"
            + (f"; not recovered: {', '.join(lost)}" if lost else "")
            + (f"; the damaged file is kept as {rebuilt['damagedCopy']}" if rebuilt.get("damagedCopy") else ""))


def _str(v: Json) -> Optional[str]:
    return v if isinstance(v, str) else None
