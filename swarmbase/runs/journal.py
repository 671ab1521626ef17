"""The resume cache: one journal line per finished agent(), keyed by content.

Design log:
- Keys are built from what determines an agent's output (engine, model, profile, effort,
  schema, cwd, prompt), a hash of the run's args, and the occurrence index among
  identical calls, never from start order. Claude Code's own journal keyed by
  position replayed 7 of 40 agents under parallel(); a key without the args replayed
  stale results after the args changed (see the team's lessons notes, #12-#13).
- The occurrence index is counted in the order the script *calls* agent() (the bridge
  delivers calls in that order), which is deterministic for a deterministic script,
  whatever order the agents finish in.
- Options that only bound an agent (maxUsd, maxTokens, timeoutMs) and its label are left
  out: a result that succeeded under one cap is the same result.
- The first line is a header with the schema version; a version this build does not know
  is an error, a torn last line (a crash mid-append) is counted and skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import attrs

from .. import fsutil
from ..audit.chain import ChainWriter
from ..jsonvalue import Json, JsonObject

SCHEMA = "swarmbase-journal"
VERSION = 1


class JournalError(Exception):
    pass


def canonical(value: Json) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_hash(args: Json) -> str:
    return hashlib.sha256(canonical(args).encode()).hexdigest()[:16]


def base_key(*, engine: str, model: str | None, profile: str, effort: str | None, schema: Json,
             cwd: str | None, prompt: str, args_digest: str, **extra: Json) -> str:
    """cwd None means the run's own work/ dir (a fresh one on resume). `extra` holds
    options that exist only on some calls (worktree isolation, a workflow path), so keys
    of calls without them stay what they were."""
    material = canonical({"engine": engine, "model": model, "profile": profile, "effort": effort,
                          "schema": schema, "cwd": cwd, "prompt": prompt, "args": args_digest,
                          **{k: v for k, v in extra.items() if v is not None}})
    return hashlib.sha256(material.encode()).hexdigest()


class KeyCounter:
    """Adds the occurrence index among identical calls, in call order."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def key(self, base: str) -> str:
        i = self._seen.get(base, 0)
        self._seen[base] = i + 1
        return f"{base}:{i}"


@attrs.frozen
class Loaded:
    entries: dict[str, JsonObject]     # key -> the last successful entry
    lines: list[JsonObject]            # every entry line, in order
    torn: int


def header(run_id: str, args_digest: str, caller: str | None = None) -> JsonObject:
    """The first line. `caller` names the run's owner beside run.json, so a run whose
    run.json is damaged can still be rebuilt for its caller (runs/rebuild.py)."""
    head = {"schema": SCHEMA, "v": VERSION, "runId": run_id, "args": args_digest}
    return {**head, "caller": caller} if caller else head


def load(path: Path) -> Loaded:
    lines, torn = fsutil.read_lines(path)
    if not lines:
        return Loaded({}, [], torn)
    head = lines[0]
    if not (isinstance(head, dict) and head.get("schema") == SCHEMA):
        raise JournalError(f"{path.name}: no journal header; not a SwarmBase journal")
    if head.get("v") != VERSION:
        raise JournalError(f"{path.name}: journal schema version {head.get('v')!r} is not supported "
                           f"(this build reads version {VERSION})")
    entries: dict[str, JsonObject] = {}
    body = [e for e in lines[1:] if isinstance(e, dict) and isinstance(e.get("key"), str)]
    for e in body:
        if e.get("ok"):
            entries[e["key"]] = e
    return Loaded(entries, body, torn)


class Journal:
    """Appends (fsync'd) to runs/<dir>/journal.jsonl.

    An entry is a paid agent result: one the disk refuses (ENOSPC, EIO) is kept in
    `pending`, in order, and written before the next one or by flush() once space
    returns; append() still raises, so the caller knows it is not on disk yet."""

    def __init__(self, path: Path, run_id: str, args_digest: str, carried: list[JsonObject] | None = None,
                 chain: ChainWriter | None = None, caller: str | None = None) -> None:
        self.path = path
        self.chain = chain            # a swarmbase.audit.chain.ChainWriter, or None (unchained)
        self.pending: list[JsonObject] = []
        self._write(header(run_id, args_digest, caller))
        # Carry the old journal's successes forward so a resume of a resume replays them too
        # (sealed again in this run's chain: their old prev/hash are replaced).
        for e in carried or []:
            self._write(e, durable=False)
        if carried:
            fsutil.fsync_file(path)

    def _write(self, entry: JsonObject, durable: bool = True) -> None:
        mark = self.chain.mark() if self.chain is not None else None
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        try:
            line = (self.chain.seal_line(entry) if self.chain is not None else
                    json.dumps(entry, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
            fsutil.append_bytes(self.path, line, durable=durable)
        except BaseException:
            if self.chain is not None and mark is not None:
                self.chain.rollback(mark)
            try:                     # a short write on a full disk must not leave half a line
                os.truncate(self.path, size)
            except OSError:
                pass
            raise

    def append(self, entry: JsonObject) -> None:
        self.append_many([entry])

    def append_many(self, entries: list[JsonObject]) -> None:
        """Entries in order, with one fsync for all of them (a group commit: agents that
        ended together cost one fsync, not one each); as append() on a disk fault."""
        self.pending.extend(entries)
        written = 0
        try:
            while self.pending:
                self._write(self.pending[0], durable=False)
                del self.pending[0]
                written += 1
        finally:
            if written:
                fsutil.fsync_file(self.path)

    def flush(self) -> None:
        """Write what a disk fault kept back, oldest first; raises OSError while it still fails."""
        while self.pending:
            self._write(self.pending[0])
            del self.pending[0]
