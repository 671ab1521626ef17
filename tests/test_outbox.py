"""The outbox log: append-only adds and acks, torn tails, damage, migration from outbox.json,
compaction, and a disk that refuses writes (a real, full or read-only tmpfs)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio
import trio.lowlevel
import trio.testing

from swarmbase.notify import outbox as outbox_mod
from swarmbase.notify import outbox_file
from swarmbase.notify.outbox import Outbox

from .conftest import notice


def ids(notices: list[dict[str, Any]]) -> list[str]:
    return [n["eventId"] for n in notices]


def lines(path: Path) -> list[dict[str, Any]]:
    """The add and ack lines (not the log's base line)."""
    return [rec for ln in path.read_bytes().splitlines() if (rec := json.loads(ln))["op"] != "base"]


def test_adds_append_and_acks_survive_reload(tmp_path: Path) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    for i in range(3):
        ob.add("a", notice(i))
    inode = p.stat().st_ino
    ob.add("a", notice(1))           # same eventId: kept once
    ob.add("b", notice(9))
    assert p.stat().st_ino == inode   # appended, never rewritten
    assert [ln["op"] for ln in lines(p)] == ["add"] * 4
    ob.ack(notice(0)["eventId"])
    ob.ack(notice(0)["eventId"])      # a second ack of the same notice writes nothing
    assert lines(p)[-1] == {"op": "ack", "eventId": notice(0)["eventId"]} and len(lines(p)) == 5
    again = Outbox(p)
    assert ids(again.pending("a")) == ids([notice(1), notice(2)])
    assert ids(again.pending("b")) == ids([notice(9)])
    assert again.next_pending("a", skip={notice(1)["eventId"]}) == notice(2)


def test_a_held_notice_keeps_the_ones_behind_it_waiting(tmp_path: Path) -> None:
    # Run ends can be released out of order (their final writes race); a host must still
    # get a caller's notices in the order they were queued.
    box = Outbox(tmp_path / "outbox.jsonl")
    box.add("bob", notice(1))
    box.add("bob", notice(2), hold=True)
    box.add("bob", notice(3))
    assert box.next_pending("bob")["eventId"] == notice(1)["eventId"]
    box.ack(notice(1)["eventId"])
    assert box.next_pending("bob") is None          # 3 waits behind the held 2
    box.release(notice(2)["eventId"])
    assert box.next_pending("bob")["eventId"] == notice(2)["eventId"]
    assert box.next_pending("bob", skip={notice(2)["eventId"]})["eventId"] == notice(3)["eventId"]


def test_an_amended_notice_replaces_the_first_on_reload(tmp_path: Path) -> None:
    # A run's end notice is queued held, then amended with its end-record hash.
    p = tmp_path / "outbox.jsonl"
    box = Outbox(p)
    box.add("bob", notice(1))
    box.add("bob", notice(2), hold=True)
    box.add("bob", notice(3))
    amended = {**notice(2), "origin": {**notice(2)["origin"], "endHash": "ab" * 32}}
    assert box.amend(notice(2)["eventId"], amended)
    assert not box.amend(notice(7)["eventId"], notice(7))            # nothing to amend
    assert not box.amend(notice(1)["eventId"], notice(2))            # another eventId: refused
    assert [ln["op"] for ln in lines(p)] == ["add"] * 4 and box.persisted
    box.release(notice(2)["eventId"])
    again = Outbox(p)
    assert again.pending("bob") == [notice(1), amended, notice(3)]     # its place kept
    # Three live notices in four lines: the earlier add is a dead line (for compaction).
    assert (again._file_lines, again._file_live) == (4, 3)
    again.ack(notice(1)["eventId"])
    again.ack(notice(2)["eventId"])
    assert Outbox(p).pending("bob") == [notice(3)]


def test_torn_tail_loses_nothing_whole(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    for i in range(4):
        ob.add("a", notice(i))
    ob.ack(notice(0)["eventId"])
    whole = p.read_bytes()
    p.write_bytes(whole + b'{"op":"add","caller":"a","notice":{"eventId":"run_torn')   # a crash mid-write
    recovered = Outbox(p)
    assert ids(recovered.pending("a")) == ids([notice(i) for i in (1, 2, 3)])
    assert "torn line" in caplog.text
    assert not recovered.recovered_from_damage and not list(tmp_path.glob("*.damaged-*"))
    recovered.add("a", notice(5))       # the torn bytes are cut before this line goes on
    assert p.read_bytes().startswith(whole)
    assert ids(Outbox(p).pending("a")) == ids([notice(i) for i in (1, 2, 3, 5)])


def test_whole_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    ob.add("a", notice(1))
    ob.add("a", notice(2))
    p.write_bytes(p.read_bytes().rstrip(b"\n"))
    assert ids(Outbox(p).pending("a")) == ids([notice(1), notice(2)])
    assert p.read_bytes().endswith(b"\n")      # rewritten whole on load
    Outbox(p).add("a", notice(3))
    assert ids(Outbox(p).pending("a")) == ids([notice(i) for i in (1, 2, 3)])


def test_damaged_lines_are_kept_aside_and_the_rest_served(tmp_path: Path) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    for i in range(3):
        ob.add("a", notice(i))
    raw = p.read_bytes().split(b"\n")
    assert json.loads(raw[0])["op"] == "base"
    raw[2] = b"\x00\xffgarbage{"          # notice(1)'s add line
    p.write_bytes(b"\n".join(raw))
    recovered = Outbox(p)
    assert recovered.recovered_from_damage
    assert ids(recovered.pending("a")) == ids([notice(0), notice(2)])
    [copy] = tmp_path.glob("outbox.jsonl.damaged-*")
    assert b"garbage" in copy.read_bytes()
    assert b"garbage" not in p.read_bytes()


def test_outbox_json_is_migrated_then_retired(tmp_path: Path) -> None:
    legacy = tmp_path / "outbox.json"
    entries = [{"caller": "a", "addedAt": 1.0, "notice": notice(i)} for i in range(3)]
    legacy.write_text(json.dumps({"schema": 1, "entries": entries}))
    ob = Outbox(tmp_path / "outbox.jsonl")
    assert ids(ob.pending("a")) == ids([notice(i) for i in range(3)])
    assert not legacy.exists()
    ob.ack(notice(1)["eventId"])
    assert ids(Outbox(tmp_path / "outbox.jsonl").pending("a")) == ids([notice(0), notice(2)])


def test_torn_outbox_json_is_salvaged_on_migration(tmp_path: Path) -> None:
    legacy = tmp_path / "outbox.json"
    entries = [{"caller": "a", "addedAt": 1.0, "notice": notice(i)} for i in range(4)]
    raw = json.dumps({"schema": 1, "entries": entries}).encode()
    legacy.write_bytes(raw[: raw.rfind(b'"eventId"')])      # torn inside the last entry
    ob = Outbox(tmp_path / "outbox.jsonl")
    assert ob.recovered_from_damage
    assert ids(ob.pending("a")) == ids([notice(i) for i in range(3)])
    assert list(tmp_path.glob("outbox.json.damaged-*")) and not legacy.exists()
    assert ids(Outbox(tmp_path / "outbox.jsonl").pending("a")) == ids([notice(i) for i in range(3)])


async def test_compaction_keeps_live_notices_and_lines_written_meanwhile(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    n = outbox_mod.COMPACT_MIN_DEAD
    for i in range(n + 10):
        ob.add("a", notice(i))
    for i in range(n // 4):             # an ack makes two dead lines: its own and its add
        ob.ack(notice(i)["eventId"])
    assert not ob.compaction_due()
    for i in range(n // 4, n // 2):
        ob.ack(notice(i)["eventId"])
    assert ob.compaction_due()

    in_thread = trio.Event()
    real_write_temp = outbox_file.write_temp

    def slow_write_temp(path: Path, data: bytes) -> Path:
        trio.from_thread.run_sync(in_thread.set)
        time.sleep(0.3)                 # the event loop keeps adding and acking meanwhile
        return real_write_temp(path, data)

    monkeypatch.setattr(outbox_file, "write_temp", slow_write_temp)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            results: list[bool] = []

            async def compact() -> None:
                results.append(await ob.compact())
            nursery.start_soon(compact)
            await in_thread.wait()
            ob.add("a", notice(9000))
            ob.ack(notice(n // 2)["eventId"])
    assert results == [True]
    expected = ids([notice(i) for i in range(n // 2 + 1, n + 10)] + [notice(9000)])
    assert ids(ob.pending("a")) == expected
    assert len(lines(p)) == (n + 10 - n // 2) + 2     # the snapshot's live adds + the add and ack carried over
    assert ids(Outbox(p).pending("a")) == expected
    assert not list(tmp_path.glob(".outbox.jsonl.tmp-*"))


async def test_maintain_compacts_in_the_background(tmp_path: Path) -> None:
    # Real clock: compaction writes from a worker thread, which MockClock's autojump
    # would treat as idle time.
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    ob.add("a", notice(5000))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ob.maintain)
            for i in range(300):
                ob.add("a", notice(i))
                ob.ack(notice(i)["eventId"])
                if i % 50 == 0:
                    await trio.lowlevel.checkpoint()
            while ob.compactions == 0 or ob.compaction_due():
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    # Compacted at least once, and what is left is below the threshold.
    assert len(lines(p)) < 1 + outbox_mod.COMPACT_MIN_DEAD
    assert lines(p)[0]["notice"]["eventId"] == notice(5000)["eventId"]
    assert ids(Outbox(p).pending("a")) == ids([notice(5000)])


# -- lost notices (issue 25 #3) ------------------------------------------------------

def test_a_torn_add_line_is_known_lost_and_an_acknowledged_notice_is_not(tmp_path: Path) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    refs = [ob.add("a", notice(i)) for i in range(4)]
    assert [r[1] for r in refs] == [0, 1, 2, 3] and {r[0] for r in refs} == {ob.log_id}
    assert ob.add("a", notice(2)) is None and ob.ref(notice(2)["eventId"]) == refs[2]
    ob.ack(notice(0)["eventId"])
    *whole, add3, ack0, _ = p.read_bytes().split(b"\n")
    assert b"run_000000000003" in add3 and b'"ack"' in ack0
    p.write_bytes(b"\n".join(whole) + b"\n" + add3[:40])    # notice 3's add torn, notice 0's ack gone with it
    again = Outbox(p)
    lost = [i for i in range(4) if again.lost_at_load(notice(i)["eventId"], refs[i])]
    assert lost == [3]                                  # 0 is pending again (its ack was torn), 1, 2 pending
    assert ids(again.pending("a")) == ids([notice(0), notice(1), notice(2)])
    assert not again.lost_at_load(notice(3)["eventId"], None)                    # an older run: no ref
    assert not again.lost_at_load(notice(3)["eventId"], ("another-log", 3))    # another log's notice
    again.add("a", notice(3))                           # boot queues it again: no longer lost
    assert not again.lost_at_load(notice(3)["eventId"], refs[3])
    again.boot_done()


def test_damaged_lines_and_compaction_keep_what_was_acknowledged(tmp_path: Path) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    refs = [ob.add("a", notice(i)) for i in range(4)]
    ob.ack(notice(0)["eventId"])
    raw = p.read_bytes().split(b"\n")
    raw[3] = b"\x00garbage"                            # notice 2's add line, damaged from outside
    p.write_bytes(b"\n".join(raw))
    for _ in range(2):          # the load rewrites the log: a second load still knows the same
        loaded = Outbox(p)
        assert [i for i in range(4) if loaded.lost_at_load(notice(i)["eventId"], refs[i])] == [2]
    # A compaction drops the acknowledged ones' lines; its base says they were acknowledged.
    loaded.add("a", notice(2))
    for i in range(1, 4):
        loaded.ack(notice(i)["eventId"])
    trio.run(loaded.compact)
    assert [ln["op"] for ln in lines(p)] == []          # nothing live is left, nothing dead kept
    after = Outbox(p)
    assert not any(after.lost_at_load(notice(i)["eventId"], refs[i]) for i in range(4))
    late = after.add("a", notice(7))
    assert late[1] >= 4                                 # numbers never go back
    p.write_bytes(p.read_bytes()[:-10])                 # and a torn line after a compaction is found
    assert Outbox(p).lost_at_load(notice(7)["eventId"], late)


def test_a_notice_acknowledged_before_its_line_was_written_is_not_lost(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    ob.add("a", notice(1))
    real_append = outbox_file.LogFile.append

    def full(self: outbox_file.LogFile, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(outbox_file.LogFile, "append", full)
    ref = ob.add("a", notice(2))           # in memory only: the disk is full
    ob.ack(notice(2)["eventId"])           # delivered from memory
    monkeypatch.setattr(outbox_file.LogFile, "append", real_append)
    ob.flush()                             # space is back: the ack line alone is written
    assert [ln["op"] for ln in lines(p)] == ["add", "ack"]
    assert not Outbox(p).lost_at_load(notice(2)["eventId"], ref)


# -- a disk that refuses writes ------------------------------------------------------

@contextmanager
def small_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> None:
    """Fill the filesystem of `path` to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096) == 4096:
            pass
        os.write(fd, b"\0")
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarmbase.outbox" and r.levelno >= logging.ERROR]


@pytest.mark.timeout(60)
async def test_full_tmpfs_keeps_notices_in_memory_and_writes_them_when_space_returns(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        p = disk / "outbox.jsonl"
        ob = Outbox(p)
        ob.add("a", notice(0, pad=1000))
        filler = disk / "filler"
        fill(filler)
        for i in range(1, 21):
            ob.add("a", notice(i, pad=1000))          # never raises
        assert ids(ob.pending("a")) == ids([notice(i) for i in range(21)])
        assert not ob.persisted
        assert len(errors_logged(caplog)) == 1 and "No space left" in errors_logged(caplog)[0]
        ob.ack(notice(3)["eventId"])                  # delivered from memory meanwhile
        ob.flush()
        for ln in p.read_bytes().splitlines():          # whatever reached the disk is whole lines
            json.loads(ln)
        filler.unlink()                               # space returns; the timer writes the rest
        with trio.fail_after(outbox_mod.RETRY_S * 3):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ob.maintain)
                while not ob.persisted:
                    await trio.sleep(1)
                nursery.cancel_scope.cancel()
        assert len(errors_logged(caplog)) == 1
        assert "written again" in caplog.text
        expected = ids([notice(i) for i in range(21) if i != 3])
        assert ids(Outbox(p).pending("a")) == expected


@pytest.mark.timeout(60)
async def test_short_write_on_a_full_tmpfs_leaves_no_broken_line(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", size="16k") as disk:
        p = disk / "outbox.jsonl"
        ob = Outbox(p)
        big = notice(1, pad=20_000)                   # larger than the whole filesystem
        ob.add("a", notice(0))
        ob.add("a", big)
        assert not ob.persisted
        assert [ln["notice"]["eventId"] for ln in lines(p)] == [notice(0)["eventId"]]   # cut back whole
        ob.ack(big["eventId"])                        # delivered from memory: never needs the disk
        ob.add("a", notice(2))
        assert ob.persisted
        assert ids(Outbox(p).pending("a")) == ids([notice(0), notice(2)])


@pytest.mark.timeout(60)
def test_read_only_remount_then_writable_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with small_tmpfs(tmp_path / "disk") as disk:
        p = disk / "outbox.jsonl"
        ob = Outbox(p)
        ob.add("a", notice(0))
        ob.close()          # a filesystem with a file open for writing cannot be remounted read-only
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            ob.add("a", notice(1))
            ob.ack(notice(0)["eventId"])
            ob.flush()
            assert not ob.persisted
            assert "Read-only file system" in errors_logged(caplog)[0]
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        ob.add("a", notice(2))
        assert ob.persisted
        assert ids(Outbox(p).pending("a")) == ids([notice(1), notice(2)])


def test_eio_on_write_is_kept_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "outbox.jsonl"
    ob = Outbox(p)
    real_write = os.write

    def failing_write(fd: int, data: bytes) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(outbox_file.os, "write", failing_write)
    for i in range(3):
        ob.add("a", notice(i))
    assert ids(ob.pending("a")) == ids([notice(i) for i in range(3)])
    assert len(errors_logged(caplog)) == 1 and "Input/output error" in errors_logged(caplog)[0]
    monkeypatch.setattr(outbox_file.os, "write", real_write)
    ob.flush()
    assert ob.persisted and ids(Outbox(p).pending("a")) == ids([notice(i) for i in range(3)])


def test_unreadable_log_at_boot_does_not_stop_the_outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "outbox.jsonl"
    Outbox(p).add("a", notice(0))

    def eio(path: Path) -> Any:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(outbox_file, "read_log", eio)
    ob = Outbox(p)
    ob.add("a", notice(1))                  # appended after what is there; nothing cut
    monkeypatch.undo()
    assert ids(Outbox(p).pending("a")) == ids([notice(0), notice(1)])


def test_empty_outbox_json_is_retired_and_an_unreadable_one_left_alone(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = tmp_path / "outbox.json"
    legacy.write_text(json.dumps({"schema": 1, "entries": []}))
    Outbox(tmp_path / "outbox.jsonl")
    assert not legacy.exists()
    legacy.write_text(json.dumps({"schema": 1, "entries": [{"caller": "a", "notice": notice(1)}]}))

    def eio(path: Path) -> Any:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(outbox_file, "read_legacy", eio)
    assert Outbox(tmp_path / "outbox.jsonl").pending("a") == []
    assert legacy.exists()                       # kept for the next start
    monkeypatch.undo()
    assert ids(Outbox(tmp_path / "outbox.jsonl").pending("a")) == ids([notice(1)])
    assert not legacy.exists()
