"""Hash chains over a run's records. Pure logic: bytes and values in, verdicts out.

A chain is one file of a run: `journal.jsonl` and `log.jsonl` (one entry a line), each
`agents/<n>/agent.json` (one entry: the agent's final record) and the run's end record
(the `end` object in run.json). Every entry carries

    prev  the hash of the entry before it in its chain; for the first entry, the chain's
          start: sha256 of {"chain": <name>, "link": <the run's link hash>}
    hash  sha256 of the entry's canonical bytes without `hash` (so it covers `prev`)

and is written in canonical form (keys sorted at every level, no spaces, UTF-8), so the
line on disk is exactly the bytes that were hashed plus the `hash` key: any edited byte,
even one that leaves the parsed value alone, shows.

The run's link ties its chains to where the run came from:
    {"run": <id>, "script": sha256(script.js)}                          a fresh run
    {..., "resumedFrom": <old id>, "after": <old end record's hash>}      a resumed run
    {..., "nestedIn": {"runId": <parent>, "workflow": <path>,
                       "after": <parent's link hash>}}                    a nested workflow
so a resumed or nested run tree verifies as one: editing an old run's end record breaks
the link of every run resumed from it.

The end record holds the last hash of each chain, so a removed tail (or a whole removed
file) is caught too. Entries appended after it are reported as breaks.

Design log:
- Hashing the parsed value alone (not the bytes) was rejected: `1.0` → `1.00` or
  reordered keys would pass, and "edit one byte" must always show. The writer therefore
  emits canonical bytes: `seal_line` gives the line itself (for an append of bytes),
  `seal` a dict whose insertion order is canonical (so `fsutil.write_json` /
  `append_line` write exactly those bytes).
- Sealing and checking splice the canonical bytes from one encoding of each top-level
  value (`encode`) instead of dumping the entry twice: chaining costs about one
  json.dumps per entry (bench/chain_cost.py).
- Without a secret key a chain is tamper-evident, not tamper-proof: whoever rewrites a
  whole tree consistently is not caught by the files alone. The end record's hash is small
  enough to hand out (in the run-end notice), which anchors it outside the disk.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from json.encoder import encode_basestring
from typing import Any, Iterable, Literal

import attrs

VERSION = 1
END = "run.json#end"          # the end record's chain name
Status = Literal["intact", "open", "unchained", "broken"]


# One encoder, built once: json.dumps with options builds a new JSONEncoder per call.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8", "surrogatepass")


def canonical(value: Any) -> bytes:
    """The bytes that are hashed: sorted keys, compact, UTF-8 (lone surrogates kept, so a
    hostile file cannot make the verifier raise)."""
    return _dumps(value)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    return sha256_hex(canonical(value))


def sorted_value(value: Any) -> Any:
    """The same JSON value with every object's keys in sorted order, so a writer that keeps
    insertion order (json.dumps without sort_keys) emits canonical bytes."""
    if isinstance(value, dict):
        return {k: sorted_value(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_value(v) for v in value]
    return value


# -- links ------------------------------------------------------------------

def run_link(run_id: str, script_sha256: str | None, *, resumed_from: str | None = None,
             resumed_end_hash: str | None = None, nested_in: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's link object (stored in run.json as `link` and repeated in the end record).
    `resumed_end_hash` is None when the resumed run had no end record (an unchained run)."""
    link: dict[str, Any] = {"v": VERSION, "run": run_id, "script": script_sha256}
    if resumed_from is not None:
        link["resumedFrom"] = resumed_from
        link["after"] = resumed_end_hash
    if nested_in is not None:
        link["nestedIn"] = {"runId": nested_in["runId"], "workflow": nested_in["workflow"],
                            "after": nested_in.get("after")}
    return link


def link_hash(link: dict[str, Any]) -> str:
    return digest(link)


def chain_start(link_h: str, name: str) -> str:
    """The `prev` of a chain's first entry."""
    return digest({"chain": name, "link": link_h})


def agent_chain(n: int) -> str:
    return f"agents/{n}/agent.json"


# -- sealing ------------------------------------------------------------------

def encode(body: dict[str, Any], h: str | None = None) -> tuple[bytes, bytes, str]:
    """(canonical bytes of `body`, the line with `hash` in its sorted place, the hash).
    Each top-level value is serialized once (json's C encoder) and spliced, so sealing or
    checking an entry costs about one json.dumps of it, not two or three."""
    items = [(k, (encode_basestring(k) + ":" + _ENCODER.encode(body[k])).encode("utf-8", "surrogatepass"))
             for k in sorted(body)]
    body_bytes = b"{" + b",".join(p for _, p in items) + b"}"
    if h is None:
        h = sha256_hex(body_bytes)
    i = bisect.bisect([k for k, _ in items], "hash")
    parts = [p for _, p in items]
    parts.insert(i, b'"hash":' + _dumps(h))
    return body_bytes, b"{" + b",".join(parts) + b"}", h


def _body(entry: dict[str, Any], prev: str) -> dict[str, Any]:
    body = {k: v for k, v in entry.items() if k not in ("prev", "hash")}
    body["prev"] = prev
    return body


def seal(entry: dict[str, Any], prev: str) -> dict[str, Any]:
    """The entry with `prev` and `hash`, keys in canonical order (so fsutil.append_line and
    write_json emit its canonical bytes). Any old prev/hash (a carried journal line from
    the run it resumed) is replaced."""
    body = _body(entry, prev)
    _, _, h = encode(body)
    return sorted_value({**body, "hash": h})


def seal_line(entry: dict[str, Any], prev: str) -> tuple[bytes, str]:
    """The fast path: the sealed entry's line (with its newline) and its hash, for a writer
    that appends bytes."""
    _, line, h = encode(_body(entry, prev))
    return line + b"\n", h


def line_bytes(sealed: dict[str, Any]) -> bytes:
    """A sealed entry as its line in a .jsonl file (what fsutil.append_line writes)."""
    return canonical(sealed) + b"\n"


class ChainWriter:
    """One chain being written: remembers the last hash. Holds no file."""

    def __init__(self, name: str, start: str, last: str | None = None, count: int = 0) -> None:
        self.name = name
        self.start = start
        self.last = last
        self.count = count

    def seal(self, entry: dict[str, Any]) -> dict[str, Any]:
        """The sealed entry as a dict in canonical key order (for fsutil.append_line)."""
        sealed = seal(entry, self.last or self.start)
        self.last = sealed["hash"]
        self.count += 1
        return sealed

    def seal_line(self, entry: dict[str, Any]) -> bytes:
        """The sealed entry's line, newline included (for an append of bytes): cheaper."""
        line, self.last = seal_line(entry, self.last or self.start)
        self.count += 1
        return line

    def mark(self) -> tuple[str | None, int]:
        """Where the chain stands, to go back to if the sealed lines could not be written."""
        return self.last, self.count

    def rollback(self, mark: tuple[str | None, int]) -> None:
        self.last, self.count = mark

    @classmethod
    def resume(cls, name: str, start: str, data: bytes) -> "ChainWriter":
        """Pick a chain up from its file's bytes (after a restart): the last whole entry
        with a hash is where it goes on; a torn tail is ignored."""
        last, count = None, 0
        for raw in data.split(b"\n"):
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if isinstance(e, dict) and isinstance(e.get("hash"), str):
                last, count = e["hash"], count + 1
        return cls(name, start, last, count)


def end_record(*, run: dict[str, Any], link: dict[str, Any], chains: dict[str, str | None],
               files: dict[str, str]) -> dict[str, Any]:
    """The run's end record (run.json `end`). `run` holds the settled facts (status,
    endedAt, spentUsd, …); `chains` the last hash of every chain (None: no entries);
    `files` the sha256 of whole files that are final at the end (script.js, result.json)."""
    body = {**run, "v": VERSION, "link": link, "chains": dict(chains), "files": dict(files)}
    return seal(body, chain_start(link_hash(link), END))


# -- verifying -------------------------------------------------------------------

@attrs.frozen
class Break:
    file: str         # relative to the state dir, e.g. runs/<dir>/journal.jsonl
    line: int         # 1-based
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}"


@attrs.frozen
class ChainResult:
    name: str
    status: Status             # intact (sealed and whole), open (whole, no seal), unchained, broken
    entries: int
    last: str | None
    torn: bool = False         # an unfinished last line (a crash mid-append), ignored
    brk: Break | None = None


NOT_SEALED = object()


def check_entry(e: Any, raw: bytes) -> str | None:
    """Why a parsed line is not a valid sealed entry, or None."""
    if not isinstance(e, dict) or not isinstance(e.get("hash"), str) or not isinstance(e.get("prev"), str):
        return "no prev/hash: a line was edited or inserted"
    try:
        body, line, _ = encode({k: v for k, v in e.items() if k != "hash"}, e["hash"])
    except (TypeError, ValueError):
        return "not canonical JSON: the line was edited"
    if line != raw:
        return "not as written (bytes differ from the canonical form): the line was edited"
    if sha256_hex(body) != e["hash"]:
        return "content does not match its hash: the line was edited"
    return None


def verify_lines(file: str, name: str, data: bytes, start: str | None,
                 sealed_last: Any = NOT_SEALED) -> ChainResult:
    """Verify one JSON-lines chain. `start` is the expected first prev (None: not known,
    don't check); `sealed_last` the end record's last hash for this chain (None: the
    chain had no entries; NOT_SEALED: the run has no end record)."""
    segments = data.split(b"\n")
    tail = segments.pop()                   # after the last newline: b"" or a torn line
    torn = tail.strip() != b""
    parsed: list[Any] = []
    for raw in segments:
        try:
            parsed.append(json.loads(raw))
        except ValueError:
            parsed.append(_UNPARSEABLE)
    hashed = [isinstance(e, dict) and "hash" in e for e in parsed]
    if not any(hashed) and sealed_last is NOT_SEALED:
        return ChainResult(name, "unchained", len(parsed), None, torn)

    def broken(line: int, reason: str, count: int, last: str | None) -> ChainResult:
        return ChainResult(name, "broken", count, last, torn, Break(file, line, reason))

    where = {e["hash"]: i for i, e in enumerate(parsed) if isinstance(e, dict) and isinstance(e.get("hash"), str)}
    last = None
    for i, (raw, e) in enumerate(zip(segments, parsed, strict=False)):
        if e is _UNPARSEABLE:
            return broken(i + 1, "not valid JSON: the line was edited or damaged", i, last)
        why = check_entry(e, raw)
        if why:
            return broken(i + 1, why, i, last)
        expected = last if i else start
        if expected is not None and e["prev"] != expected:
            j = where.get(e["prev"])
            if j is not None and j != i - 1:
                return broken(i + 1, f"out of order: the entry it follows is on line {j + 1}", i, last)
            if i == 0:
                return broken(1, "the first entry does not start this run's chain: lines were removed "
                                 "before it, or the file belongs to another run", i, last)
            return broken(i + 1, "the entry before it is missing: a line was removed", i, last)
        last = e["hash"]
    count = len(parsed)
    if sealed_last is NOT_SEALED:
        return ChainResult(name, "open", count, last, torn)
    if sealed_last == last:
        return ChainResult(name, "intact", count, last, torn)
    if sealed_last is None:
        return broken(1, "written after the run's end record, which says this file had no entries", count, last)
    if sealed_last is not None and sealed_last in where:
        k = where[sealed_last]
        return broken(k + 2, "written after the run's end record: lines were appended", count, last)
    return broken(count + 1, "the run's end record names a later last entry: lines were removed from the end",
                  count, last)


def verify_record(file: str, name: str, data: bytes | None, start: str | None,
                  sealed: Any = NOT_SEALED) -> ChainResult:
    """Verify a one-entry chain written whole (agents/<n>/agent.json): the file is the
    canonical entry and a newline. `sealed` is the end record's hash for it."""
    if data is None:
        if sealed is NOT_SEALED or sealed is None:
            return ChainResult(name, "unchained", 0, None)
        return ChainResult(name, "broken", 0, None, brk=Break(file, 1, "missing: the run's end record lists it"))
    raw = data[:-1] if data.endswith(b"\n") else data
    try:
        e = json.loads(raw)
    except ValueError:
        return ChainResult(name, "broken", 0, None, brk=Break(file, 1, "not valid JSON: the file was edited or damaged"))
    if not (isinstance(e, dict) and "hash" in e):
        if sealed is NOT_SEALED or sealed is None:
            return ChainResult(name, "unchained", 1, None)
        return ChainResult(name, "broken", 1, None, brk=Break(file, 1, "no prev/hash: the record was replaced"))
    why = check_entry(e, raw)
    if why is None and start is not None and e["prev"] != start:
        why = "does not belong to this run's chain (prev differs)"
    if why is None and sealed is not NOT_SEALED and sealed != e["hash"]:
        why = ("not in the run's end record: added after the run ended" if sealed is None
               else "differs from the hash in the run's end record: the record was replaced")
    if why:
        return ChainResult(name, "broken", 1, None, brk=Break(file, 1, why))
    return ChainResult(name, "open" if sealed is NOT_SEALED else "intact", 1, e["hash"])


def verify_end(file: str, end: Any, start: str) -> Break | None:
    """The end record inside run.json (line 1 of that file)."""
    if not isinstance(end, dict) or not isinstance(end.get("hash"), str):
        return Break(file, 1, "the end record has no hash: it was edited")
    if digest({k: v for k, v in end.items() if k != "hash"}) != end["hash"]:
        return Break(file, 1, "the end record does not match its hash: it was edited")
    if end.get("prev") != start:
        return Break(file, 1, "the end record does not belong to this run's link")
    return None


def first_break(results: Iterable[ChainResult]) -> Break | None:
    return next((r.brk for r in results if r.brk is not None), None)


class _Unparseable:
    def __repr__(self) -> str:
        return "<unparseable>"


_UNPARSEABLE = _Unparseable()
