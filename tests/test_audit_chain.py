"""Hash chains as pure logic: sealing, canonical bytes, and the verifier's verdict for an
edited, removed, reordered, appended or truncated line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmbase import fsutil
from swarmbase.audit import chain
from swarmbase.audit.chain import NOT_SEALED, ChainWriter
from swarmbase.audit.seal import RunChains

LINK = chain.link_hash(chain.run_link("run_0123456789ab", "0" * 64))
START = chain.chain_start(LINK, "journal.jsonl")


def sealed_file(n: int = 5) -> tuple[list[bytes], str]:
    w = ChainWriter("journal.jsonl", START)
    rows = [chain.line_bytes(w.seal({"key": f"k{i}", "n": i, "costUsd": 0.1 * i, "text": "héllo\n\"q\""}))
            for i in range(n)]
    assert w.last is not None
    return rows, w.last


def verify(rows: list[bytes], sealed=NOT_SEALED) -> chain.ChainResult:
    return chain.verify_lines("runs/x/journal.jsonl", "journal.jsonl", b"".join(rows), START, sealed)


def test_intact_sealed_and_open() -> None:
    rows, last = sealed_file()
    assert verify(rows, last).status == "intact"
    r = verify(rows)
    assert r.status == "open" and r.entries == 5 and r.last == last and r.brk is None


def test_fsutil_writes_the_canonical_bytes(tmp_path: Path) -> None:
    """The core keeps writing with fsutil: a sealed entry must come out byte for byte."""
    w = ChainWriter("log.jsonl", START)
    entry = w.seal({"z": 1, "a": {"y": [1, {"d": 2, "c": 3}], "b": "ü"}, "m": 1.5})
    fsutil.append_line(tmp_path / "log.jsonl", entry)
    assert (tmp_path / "log.jsonl").read_bytes() == chain.line_bytes(entry)
    fsutil.write_json(tmp_path / "agent.json", entry)
    assert (tmp_path / "agent.json").read_bytes() == chain.line_bytes(entry)


@pytest.mark.parametrize("line", [0, 2, 4])
def test_one_edited_byte_names_its_line(line: int) -> None:
    rows, last = sealed_file()
    raw = bytearray(rows[line])
    i = raw.index(b'"k') + 2                 # a byte inside the key's value
    raw[i] = ord("X")
    rows[line] = bytes(raw)
    r = verify(rows, last)
    assert r.status == "broken" and r.brk.line == line + 1
    assert "edited" in r.brk.reason


def test_a_meaning_preserving_edit_still_shows() -> None:
    rows, last = sealed_file()
    rows[1] = rows[1].replace(b'"n":1,', b'"n": 1,')      # whitespace only: same parsed value
    r = verify(rows, last)
    assert r.brk.line == 2 and "not as written" in r.brk.reason


def test_edit_that_breaks_json() -> None:
    rows, last = sealed_file()
    rows[3] = rows[3][:10] + b"\n"
    assert verify(rows, last).brk.line == 4


def test_removed_line() -> None:
    rows, last = sealed_file()
    del rows[2]
    r = verify(rows, last)
    assert r.brk.line == 3 and "removed" in r.brk.reason


def test_removed_first_line() -> None:
    rows, last = sealed_file()
    del rows[0]
    r = verify(rows, last)
    assert r.brk.line == 1 and "removed" in r.brk.reason


def test_swapped_lines() -> None:
    rows, last = sealed_file()
    rows[1], rows[2] = rows[2], rows[1]
    r = verify(rows, last)
    assert r.brk.line == 2 and "out of order" in r.brk.reason


def test_removed_tail_needs_the_seal() -> None:
    rows, last = sealed_file()
    short = rows[:3]
    assert verify(short).status == "open"                  # without an end record it looks whole
    r = verify(short, last)
    assert r.brk.line == 4 and "removed from the end" in r.brk.reason
    assert verify([], last).brk.line == 1


def test_appended_after_the_seal() -> None:
    rows, _ = sealed_file(5)
    rows3, last3 = rows[:3], chain.json.loads(rows[2])["hash"]
    r = verify(rows, last3)
    assert r.brk.line == 4 and "after the run's end record" in r.brk.reason
    assert verify(rows3, None).brk.line == 1                 # the end record said: no entries


def test_resealed_line_with_a_wrong_prev_is_caught() -> None:
    """Recomputing an edited line's own hash is not enough: the next line's prev breaks."""
    rows, last = sealed_file()
    e = json.loads(rows[1])
    e["costUsd"] = 99.0
    rows[1] = chain.line_bytes(chain.seal(e, e["prev"]))
    r = verify(rows, last)
    assert r.brk.line == 3 and "missing" in r.brk.reason


def test_torn_tail_is_not_a_break() -> None:
    rows, last = sealed_file()
    r = verify(rows + [b'{"key":"k5","n'], last)
    assert r.status == "intact" and r.torn


def test_unchained_file() -> None:
    rows = [json.dumps({"key": "a"}).encode() + b"\n", json.dumps({"key": "b"}).encode() + b"\n"]
    assert verify(rows).status == "unchained"
    assert verify(rows, "ab" * 32).status == "broken"        # a sealed run whose file lost its hashes


def test_mixed_file_breaks_at_the_unhashed_line() -> None:
    rows, last = sealed_file()
    rows.insert(2, b'{"key":"forged"}\n')
    assert verify(rows, last).brk.line == 3


def test_hostile_bytes_do_not_raise() -> None:
    rows, last = sealed_file()
    for bad in (b'"\\ud800"\n', b"[1,2]\n", b"\xff\xfe\n", b'{"hash":1,"prev":2}\n', b"NaN\n", b"\n"):
        r = verify(rows[:2] + [bad] + rows[2:], last)
        assert r.status == "broken" and r.brk.line == 3, bad


def test_resume_picks_the_chain_up() -> None:
    rows, last = sealed_file(3)
    w = ChainWriter.resume("journal.jsonl", START, b"".join(rows) + b'{"torn')
    assert w.last == last and w.count == 3
    rows.append(chain.line_bytes(w.seal({"key": "k3"})))
    assert verify(rows, w.last).status == "intact"


def test_rollback_after_a_failed_write() -> None:
    """A batch sealed but not written (a full disk) is sealed again later from the same place."""
    w = ChainWriter("log.jsonl", START)
    first = w.seal_line({"m": 1})
    mark = w.mark()
    lost = w.seal_line({"m": 2})
    w.rollback(mark)
    again = w.seal_line({"m": 2})
    assert again == lost
    r = chain.verify_lines("f", "log.jsonl", first + again, START, w.last)
    assert r.status == "intact"


def test_carried_entries_are_resealed() -> None:
    """A resumed run carries the old journal's successes: their old prev/hash are replaced."""
    rows, _ = sealed_file(2)
    old = json.loads(rows[1])
    w = ChainWriter("journal.jsonl", START)
    new = w.seal(old)
    assert new["prev"] == START and new["hash"] != old["hash"] and new["key"] == old["key"]


def test_agent_record_and_end_record() -> None:
    rc = RunChains.start("run_0123456789ab", "return 1")
    rec = rc.agent_record(1, {"n": 1, "state": "done", "costUsd": 0.5}, {"prompt.txt": "ab" * 32})
    name = chain.agent_chain(1)
    data = chain.line_bytes(rec)
    start = rc.agent_start(1)
    assert chain.verify_record("f", name, data, start, rec["hash"]).status == "intact"
    assert chain.verify_record("f", name, data.replace(b"0.5", b"0.6"), start, rec["hash"]).status == "broken"
    assert "end record" in chain.verify_record("f", name, data, start, "00" * 32).brk.reason
    assert "added after" in chain.verify_record("f", name, data, start, None).brk.reason
    assert chain.verify_record("f", name, None, start, rec["hash"]).brk.reason.startswith("missing")
    end = rc.end_record({"id": "run_0123456789ab", "status": "completed", "spentUsd": 0.5, "junk": 1}, {})
    assert "junk" not in end and end["chains"][name] == rec["hash"] and end["chains"]["journal.jsonl"] is None
    end_start = chain.chain_start(rc.link_hash, chain.END)
    assert chain.verify_end("run.json", end, end_start) is None
    assert chain.verify_end("run.json", {**end, "spentUsd": 0.4}, end_start) is not None
    assert chain.verify_end("run.json", end, "0" * 64) is not None


@pytest.mark.parametrize("body", [
    {"prev": "p", "a": 1, "z": [1.5, -0.0, 1e300, None, True], "m": {"b": {"y": 1, "x": "\u2028é\\"}}},
    {"prev": "p", "hash_": "x", "h": 1, "ha": 2, "hat": "\x00\t"},
    {"prev": "p", "result": float("nan"), "big": 10**30},
])
def test_spliced_encoding_is_canonical(body: dict) -> None:
    body_bytes, line, h = chain.encode(body)
    assert body_bytes == chain.canonical(body)
    assert line == chain.canonical({**body, "hash": h}) and h == chain.digest(body)
