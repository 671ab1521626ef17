"""Per-agent records under runs/<dir>/agents/<n>/: prompt, options, redacted transcript,
state history, cost, tokens, duration, exit code, error."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

import attrs

from .. import fsutil, json_depth
from ..engines.base import LiveUsage
from ..jsonvalue import Json, JsonObject
from ..prices import Tokens
from .model import iso

AGENT_STATES = ("queued", "waiting-budget", "waiting-node", "running", "done", "failed", "skipped", "cancelled",
                "interrupted")
WAITING = ("queued", "waiting-budget", "waiting-node")
ENDED = ("done", "failed", "skipped", "cancelled", "interrupted")
ERROR_SHORT = 300


def finished(rec: "AgentRecord") -> bool:
    """Ended by itself (what agentsDone counts), not stopped with its run."""
    return rec.state in ENDED and rec.state != "interrupted" and not (
        rec.state == "cancelled" and (rec.error or "").startswith("cancelled with the run"))


class Redactor:
    """Replaces every known secret value before text reaches a record, log or notice."""

    def __init__(self, secrets: list[str] | None = None) -> None:
        self.secrets = sorted({s for s in (secrets or []) if len(s) >= 6}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 6 and secret not in self.secrets:
            self.secrets = sorted([*self.secrets, secret], key=len, reverse=True)

    def discard(self, secret: str | None) -> None:
        if secret in self.secrets:
            self.secrets = [s for s in self.secrets if s != secret]

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "[redacted]")
        return text


def redact_value(redact: Redactor, value: Json) -> Json:
    """A JSON value with every known secret replaced."""
    if not redact.secrets:
        return value
    return json.loads(redact(json.dumps(value, ensure_ascii=False)))


@attrs.define
class AgentRecord:
    n: int
    dir: Path
    label: str
    engine: str
    model: str | None
    profile: str
    state: str = "queued"
    history: list[JsonObject] = attrs.Factory(list)
    cost_usd: float = 0.0
    cost_estimated: bool = False
    tokens: Tokens = Tokens()
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    replayed: bool = False
    phase: str | None = None
    workflow: str = ""
    priced: bool = True
    node: str | None = None
    branch: JsonObject | None = None
    original_duration_s: float | None = None
    cwd: str | None = None
    queued_at: float = attrs.Factory(time.time)
    usage: LiveUsage | None = attrs.field(default=None, repr=False)    # LiveUsage while running

    def set_state(self, state: str, **detail: Json) -> None:
        assert state in AGENT_STATES, state
        now = time.time()
        self.state = state
        self.history.append({"state": state, "at": iso(now), **detail})
        if state == "running":
            self.started_at = now
        if state in ENDED:
            self.ended_at = now

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return round((self.ended_at or time.time()) - self.started_at, 3)

    def row(self) -> JsonObject:
        """The agent's line in status / phases.json / the dashboard. While it runs, cost and
        tokens are the live (estimated) figures."""
        cost, tokens, estimated = self.cost_usd, self.tokens.total, self.cost_estimated
        if self.state == "running" and self.usage is not None:
            cost, tokens, estimated = self.usage.cost_usd, self.usage.tokens.total, True
        return {"n": self.n, "label": self.label, "engine": self.engine, "model": self.model,
                "profile": self.profile, "state": self.state, "costUsd": round(cost, 6), "estimated": estimated,
                "priced": self.priced, "tokens": tokens, "durationS": self.duration_s, "replayed": self.replayed,
                "queuedAt": self.queued_at, "startedAt": self.started_at, "endedAt": self.ended_at,
                "error": (self.error or "")[:ERROR_SHORT] or None, "phase": self.phase, "workflow": self.workflow,
                "originalDurationS": self.original_duration_s, "node": self.node,
                "branch": self.branch.get("branch") if self.branch else None}

    def to_json(self) -> JsonObject:
        return {**self.row(), "history": self.history, "tokens": self.tokens.to_json(),
                "exitCode": self.exit_code, "error": self.error, "cwd": self.cwd, "worktree": self.branch}

    @classmethod
    def from_json(cls, d: JsonObject, dir: Path) -> "AgentRecord":
        tokens = d.get("tokens")
        t: JsonObject = tokens if isinstance(tokens, dict) else {}
        return cls(n=int(d["n"]), dir=dir, label=str(d.get("label", "")), engine=str(d.get("engine", "claude")),
                   model=d.get("model"), profile=str(d.get("profile", "read")), state=str(d.get("state", "queued")),
                   history=list(d.get("history") or []), cost_usd=float(d.get("costUsd") or 0.0),
                   cost_estimated=bool(d.get("estimated")),
                   tokens=Tokens(input=int(t.get("input", 0)), output=int(t.get("output", 0)),
                                 cache_read=int(t.get("cacheRead", 0)), cache_write=int(t.get("cacheWrite", 0))),
                   started_at=d.get("startedAt"), ended_at=d.get("endedAt"), exit_code=d.get("exitCode"),
                   error=d.get("error"), replayed=bool(d.get("replayed")), phase=d.get("phase"),
                   workflow=str(d.get("workflow") or ""), priced=d.get("priced", True) is not False,
                   node=d.get("node"), branch=d.get("worktree"), original_duration_s=d.get("originalDurationS"),
                   cwd=d.get("cwd"), queued_at=d.get("queuedAt") or 0.0)


def create(agents_dir: Path, rec: AgentRecord, prompt: str, opts: JsonObject) -> None:
    rec.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fsutil.write_atomic(rec.dir / "prompt.txt", prompt.encode(), durable=False)
    fsutil.write_json(rec.dir / "opts.json", opts, durable=False)
    save(rec)


def save(rec: AgentRecord, durable: bool = False) -> None:
    """agent.json is written whole at each state change; the journal (not this) is what
    resume trusts, so only the final write is made durable."""
    fsutil.write_json(rec.dir / "agent.json", rec.to_json(), durable=durable)


class Transcript:
    """The agent's stream, line by line, redacted. Appended without a per-line fsync (a
    chatty agent would pay one per event) and fsync'd once when the agent ends. Each
    entry also goes to `on_entry` (the live agent page).

    The transcript is a record, not the result: a write that fails (a full disk) stops
    the transcript there (`fault` says why) and never the agent, whose reply is already
    paid for (issue 25 #6: an ENOSPC here crashed agents after their reply)."""

    def __init__(self, path: Path, redact: Redactor, on_entry: Callable[[Json], None] | None = None) -> None:
        self.path = path
        self.redact = redact
        self.on_entry = on_entry
        self._fd: int | None = None
        self.lines = 0
        self.fault: OSError | None = None

    def append(self, line: bytes) -> None:
        text = self.redact(line.decode("utf-8", "replace"))
        try:
            value = json_depth.loads(text, json_depth.LINE_DEPTH)
        except ValueError:             # not JSON, or nested too deep to keep as JSON
            value = {"type": "raw", "text": text[:10_000]}
        if self.fault is None:
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                fsutil.write_all(self._fd, json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
                self.lines += 1
            except OSError as e:
                self.fault = e
                self._close_quietly()
        if self.on_entry is not None:
            self.on_entry(value)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as e:
                self.fault = self.fault or e
            finally:
                self._close_quietly()

    def _close_quietly(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
