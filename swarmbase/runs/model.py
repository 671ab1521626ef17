"""What a run is: its record, statuses and transitions. Pure data, no I/O."""

from __future__ import annotations

import secrets
import time
from typing import Any, Optional

import attrs

ACTIVE = ("queued", "running")
TERMINAL = ("completed", "failed", "cancelled", "interrupted")
STATUSES = ACTIVE + TERMINAL


def new_run_id() -> str:
    return "run_" + secrets.token_hex(6)


def stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"


@attrs.define
class Run:
    id: str
    caller: str
    dir_name: str
    created_at: float
    label: Optional[str] = None
    meta: Optional[dict[str, Any]] = None
    status: str = "queued"
    history: list[dict[str, Any]] = attrs.Factory(list)
    args: Any = None
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

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def display_label(self) -> str:
        if self.label:
            return self.label
        if self.meta and isinstance(self.meta.get("name"), str):
            return self.meta["name"]
        return self.id

    def set_status(self, status: str, at: float, **detail: Any) -> None:
        assert status in STATUSES, status
        if self.status in TERMINAL:
            raise ValueError(f"run {self.id} already ended as {self.status}")
        self.status = status
        self.history.append({"status": status, "at": iso(at), **detail})
        if status in TERMINAL:
            self.ended_at = at

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "id": self.id, "caller": self.caller, "dirName": self.dir_name,
            "createdAt": self.created_at, "endedAt": self.ended_at,
            "label": self.label, "meta": self.meta, "status": self.status, "history": self.history,
            "args": self.args, "model": self.model, "effort": self.effort, "profile": self.profile,
            "budgetUsd": self.budget_usd, "budgetTokens": self.budget_tokens, "keepWork": self.keep_work,
            "spentUsd": self.spent_usd, "spentEstimated": self.spent_estimated,
            "agentsTotal": self.agents_total, "agentsDone": self.agents_done,
            "error": self.error, "errorLine": self.error_line, "resumedFrom": self.resumed_from,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Run":
        return cls(
            id=d["id"], caller=d["caller"], dir_name=d["dirName"], created_at=d["createdAt"],
            ended_at=d.get("endedAt"), label=d.get("label"), meta=d.get("meta"), status=d["status"],
            history=list(d.get("history") or []), args=d.get("args"), model=d.get("model"),
            effort=d.get("effort"), profile=d.get("profile", "think"), budget_usd=d.get("budgetUsd", 0.0),
            budget_tokens=d.get("budgetTokens", 0), keep_work=d.get("keepWork", False),
            spent_usd=d.get("spentUsd", 0.0), spent_estimated=d.get("spentEstimated", False),
            agents_total=d.get("agentsTotal", 0), agents_done=d.get("agentsDone", 0),
            error=d.get("error"), error_line=d.get("errorLine"), resumed_from=d.get("resumedFrom"),
        )

    def summary(self) -> dict[str, Any]:
        """The caller-facing summary used by `list` and `status`."""
        return {
            "runId": self.id, "label": self.display_label, "status": self.status,
            "createdAt": iso(self.created_at), "endedAt": iso(self.ended_at) if self.ended_at else None,
            "budgetUsd": self.budget_usd, "spentUsd": round(self.spent_usd, 6),
            "spentEstimated": self.spent_estimated,
            "agents": {"done": self.agents_done, "total": self.agents_total},
            "error": self.error, "errorLine": self.error_line, "resumedFrom": self.resumed_from,
        }
