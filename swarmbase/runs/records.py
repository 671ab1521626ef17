"""Per-agent records under runs/<dir>/agents/<n>/: prompt, options, redacted transcript,
state history, cost, tokens, duration, exit code, error."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import attrs

from .. import fsutil
from ..prices import Tokens
from .model import iso

AGENT_STATES = ("queued", "running", "done", "failed", "skipped", "cancelled")
ENDED = ("done", "failed", "skipped", "cancelled")


class Redactor:
    """Replaces every known secret value before text reaches a record, log or notice."""

    def __init__(self, secrets: list[str] | None = None) -> None:
        self.secrets = sorted({s for s in (secrets or []) if len(s) >= 6}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 6 and secret not in self.secrets:
            self.secrets = sorted([*self.secrets, secret], key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, "[redacted]")
        return text


def redact_value(redact: Redactor, value: Any) -> Any:
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
    history: list[dict[str, Any]] = attrs.Factory(list)
    cost_usd: float = 0.0
    cost_estimated: bool = False
    tokens: Tokens = Tokens()
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None
    replayed: bool = False
    phase: str | None = None
    queued_at: float = attrs.Factory(time.time)
    stream: Any = attrs.field(default=None, repr=False)   # the engine's stream state, for settling a kill
    meter: Any = attrs.field(default=None, repr=False)    # a codex agent's meter entry

    def set_state(self, state: str, **detail: Any) -> None:
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

    def row(self) -> dict[str, Any]:
        """The agent's line in status / phases.json / the dashboard."""
        return {"n": self.n, "label": self.label, "engine": self.engine, "model": self.model, "state": self.state,
                "costUsd": round(self.cost_usd, 6), "estimated": self.cost_estimated, "tokens": self.tokens.total,
                "durationS": self.duration_s, "replayed": self.replayed,
                "queuedAt": self.queued_at, "startedAt": self.started_at, "endedAt": self.ended_at}

    def to_json(self) -> dict[str, Any]:
        return {**self.row(), "profile": self.profile, "history": self.history, "tokens": self.tokens.to_json(),
                "exitCode": self.exit_code, "error": self.error}


def create(agents_dir: Path, rec: AgentRecord, prompt: str, opts: dict[str, Any]) -> None:
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
    chatty agent would pay one per event) and fsync'd once when the agent ends."""

    def __init__(self, path: Path, redact: Redactor) -> None:
        self.path = path
        self.redact = redact

    def append(self, line: bytes) -> None:
        text = self.redact(line.decode("utf-8", "replace"))
        try:
            value = json.loads(text)
        except ValueError:
            value = {"type": "raw", "text": text[:10_000]}
        fsutil.append_line(self.path, value, durable=False)

    def close(self) -> None:
        fsutil.fsync_file(self.path)
