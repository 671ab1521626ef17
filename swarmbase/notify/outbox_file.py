"""The outbox's files: the append-only log's reader and writer, the compaction rewrite,
and the reader for the old whole-file `outbox.json`. Blocking I/O, no policy."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

from .. import fsutil


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _valid(rec: Any) -> bool:
    if not isinstance(rec, dict):
        return False
    if rec.get("op") == "base":
        return isinstance(rec.get("log"), str) and isinstance(rec.get("seq"), int) and rec["seq"] >= 0
    if rec.get("op") == "ack":
        return isinstance(rec.get("eventId"), str)
    if rec.get("op") == "add":
        notice = rec.get("notice")
        if isinstance(notice, dict) and isinstance(notice.get("eventId"), str) and isinstance(rec.get("caller"), str):
            rec["eventId"] = notice["eventId"]
            return True
    return False


@attrs.define
class Loaded:
    records: list[dict[str, Any]]     # add and ack lines, in order
    good_size: int            # bytes up to the end of the last whole line
    damaged: int              # whole lines that are not records (damage from outside)
    torn_tail: int            # bytes of an unfinished last line (a crash mid-write)
    damaged_copy: Path | None
    intact_tail: bool = False   # the last line is whole but lacks its newline
    base: dict[str, Any] | None = None    # the last base line: {"op": "base", "log", "seq"}


def _split_base(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    base = None
    kept = []
    for rec in records:
        if rec["op"] == "base":
            base = rec
        else:
            kept.append(rec)
    return kept, base


def read_log(path: Path) -> Loaded:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Loaded([], 0, 0, 0, None)
    records: list[dict[str, Any]] = []
    damaged = 0
    pos = 0
    while True:
        nl = raw.find(b"\n", pos)
        if nl < 0:
            break
        line = raw[pos:nl]
        pos = nl + 1
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            rec = None
        if _valid(rec):
            records.append(rec)
        else:
            damaged += 1
    good_size = pos
    tail = raw[pos:]
    intact = False
    if tail.strip():
        try:
            rec = json.loads(tail)
        except (ValueError, RecursionError):
            rec = None
        if _valid(rec):       # whole, only its newline is missing: keep it
            records.append(rec)
            intact = True
    copy = None
    if damaged:
        # Keep the bytes before a rewrite drops the damaged lines; without a copy
        # (disk full) the file is left as it is and its damage skipped on every load.
        copy = path.with_name(f"{path.name}.damaged-{_utc_stamp()}")
        try:
            fsutil.write_atomic(copy, raw)
        except OSError:
            copy = None
    records, base = _split_base(records)
    return Loaded(records, good_size, damaged, 0 if intact else len(tail), copy, intact, base)


@attrs.define
class Legacy:
    entries: list[dict[str, Any]]
    damaged_copy: Path | None = None
    found: bool = False


def read_legacy(path: Path) -> Legacy:
    """The entries of an old `outbox.json` ({"schema":1,"entries":[...]}); a damaged
    one is moved aside (bytes kept) and its whole entries salvaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Legacy([])
    try:
        data = json.loads(raw)
        entries = data.get("entries", []) if isinstance(data, dict) else []
        copy = None
    except (ValueError, RecursionError):
        entries = _salvage(raw)
        copy = path.with_name(f"{path.name}.damaged-{_utc_stamp()}")
        path.rename(copy)
    good = [e for e in entries if isinstance(e, dict) and "caller" in e and isinstance(e.get("notice"), dict)]
    return Legacy(good, copy, found=True)


def _salvage(raw: bytes) -> list[dict[str, Any]]:
    """Whole entry objects from a torn `outbox.json`, decoded one by one."""
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
        except (ValueError, RecursionError):
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out


class LogFile:
    """Appends whole lines. `size` is where the last whole line ends: anything past it
    (a torn line from a crash or from a short write on a full disk) is cut off before
    the next append, so a new line never glues onto a broken one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.size: int | None = None      # None: trust the file's size when opened

    def _open(self) -> int:
        if self.fd is None:
            created = not self.path.exists()
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            if created:
                fsutil._fsync_dir(self.path.parent)
        return self.fd

    def append(self, data: bytes) -> None:
        try:
            fd = self._open()
            actual = os.fstat(fd).st_size
            if self.size is None or actual < self.size:
                self.size = actual
            elif actual > self.size:
                os.ftruncate(fd, self.size)
            n = os.write(fd, data)
            if n < len(data):
                os.ftruncate(fd, self.size)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.size += n
        except OSError:
            self.close()        # reopen next time: the fd itself may be what is broken
            raise

    def sync(self) -> None:
        if self.fd is not None:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def reopen(self, size: int | None) -> None:
        self.close()
        self.size = size


def _temp_for(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def remove_temps(path: Path) -> None:
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        tmp.unlink(missing_ok=True)


def rewrite(path: Path, data: bytes) -> None:
    fsutil.write_atomic(path, data)


def write_temp(path: Path, data: bytes) -> Path:
    """Compaction, step 1 (in a thread): the new log beside the old one, fsync'd."""
    tmp = _temp_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        discard(tmp)
        raise
    os.close(fd)
    return tmp


def finish_temp(path: Path, tmp: Path, carried: bytes) -> None:
    """Compaction, step 2 (on the event loop, so no line can slip in between): append
    the lines written to the old log since the snapshot, then rename over it."""
    if carried:
        fd = os.open(tmp, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            if os.write(fd, carried) < len(carried):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    fsutil._fsync_dir(path.parent)


def discard(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass
