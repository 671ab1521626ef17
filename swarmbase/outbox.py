"""Durable run-end notices: outbox.json holds every notice until its caller's host
answered accepted or duplicate. Written atomically before any push is attempted."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import trio

from . import fsutil

log = logging.getLogger("swarmbase.outbox")

BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
REMOVE_FLUSH_S = 0.5


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with ±25 % jitter: 1 s, 2 s, 4 s … capped at 300 s."""
    rng = rng or random.Random()
    base = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** max(0, attempt)))
    return base * rng.uniform(0.75, 1.25)


def classify_answer(result: Any = None, error: dict[str, Any] | None = None) -> str:
    """What a host's answer to push/event means for the outbox entry:
    'done' (drop it), 'wait-grant' (keep; retry after the next grant),
    'hold' (keep; the set is off for this host) or 'retry' (keep; back off)."""
    if error is not None:
        code = error.get("code")
        if code == -32002:
            return "wait-grant"
        if code in (-32001, -32003):
            return "hold"
        return "retry"
    if isinstance(result, dict):
        if result.get("accepted") is True:
            return "done"
        if result.get("reason") == "duplicate":
            return "done"
    return "retry"


class Outbox:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[dict[str, Any]] = []
        self.recovered_from_damage = False
        self._changed: dict[str, trio.Event] = {}
        self._dirty = False
        self._saved_at = 0.0
        self._load()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            entries = data.get("entries", []) if isinstance(data, dict) else []
        except ValueError:
            # Writes are atomic, so this is damage from outside; keep what parses.
            entries = self._salvage(raw)
            self.recovered_from_damage = True
            damaged = self.path.with_name(self.path.name + f".damaged-{int(time.time())}")
            self.path.rename(damaged)
            log.warning("outbox.json was damaged; kept %d notices, the original is at %s", len(entries), damaged)
        self.entries = [e for e in entries if isinstance(e, dict) and "caller" in e and "notice" in e]
        if self.recovered_from_damage:
            self._save()

    @staticmethod
    def _salvage(raw: bytes) -> list[dict[str, Any]]:
        """Recover whole entry objects from a torn file by decoding them one by one."""
        text = raw.decode("utf-8", errors="replace")
        start = text.find("[")
        out: list[dict[str, Any]] = []
        if start < 0:
            return out
        dec = json.JSONDecoder()
        i = start + 1
        while i < len(text):
            while i < len(text) and text[i] in " \r\n\t,":
                i += 1
            try:
                obj, i = dec.raw_decode(text, i)
            except ValueError:
                break
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def _save(self) -> None:
        fsutil.write_json(self.path, {"schema": 1, "entries": self.entries})
        self._dirty = False
        self._saved_at = time.monotonic()

    def _wake(self, caller: str) -> None:
        ev = self._changed.pop(caller, None)
        if ev is not None:
            ev.set()

    def add(self, caller: str, notice: dict[str, Any]) -> None:
        if any(e["notice"]["eventId"] == notice["eventId"] for e in self.entries):
            return
        self.entries.append({"caller": caller, "addedAt": time.time(), "notice": notice})
        self._save()
        self._wake(caller)

    def pending(self, caller: str) -> list[dict[str, Any]]:
        """Oldest first (entries are kept in insertion order)."""
        return [e["notice"] for e in self.entries if e["caller"] == caller]

    def remove(self, event_id: str) -> None:
        """Drop an accepted notice. Removals are written at most every REMOVE_FLUSH_S (and
        by flush()): a crash in between re-sends a few accepted notices with their same
        eventId, which hosts answer as duplicates. Adds are always written at once."""
        before = len(self.entries)
        self.entries = [e for e in self.entries if e["notice"]["eventId"] != event_id]
        if len(self.entries) != before:
            self._dirty = True
            if time.monotonic() - self._saved_at >= REMOVE_FLUSH_S:
                self.flush()

    def flush(self) -> None:
        if self._dirty:
            self._save()

    def changed_event(self, caller: str) -> trio.Event:
        """Set at the caller's next add(). Take it *before* reading pending(), so an add
        that lands in between cannot be missed."""
        ev = self._changed.get(caller)
        if ev is None:
            ev = self._changed[caller] = trio.Event()
        return ev
