"""Crash-safe file writes: whole files by temp + rename, logs by fsync'd appends.

A crash at any instant leaves each file either old or new, never torn; an append-only
log may lose at most its unfinished last line, which readers skip.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Iterator


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Temp file + rename: readers see the old or the new file, never a torn one.
    durable=False skips the fsyncs, for derived records that a crash may leave one
    update behind (still whole) but that are not a source of truth."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise _named(e, path) from None
    if durable:
        _fsync_dir(path.parent)


def write_json(path: Path, value: Any, durable: bool = True) -> None:
    # Compact separators keep json on its C encoder (indent forces the pure-Python one).
    write_atomic(path, json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n",
                 durable=durable)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return default


def append_line(path: Path, value: Any, durable: bool = True) -> None:
    append_lines(path, [value], durable)


def _named(e: BaseException, path: Path) -> BaseException:
    """An OSError from writing `path` that says which file (os.write does not)."""
    if isinstance(e, OSError) and not e.filename:
        named = OSError(e.errno, e.strerror, str(path))
        named.__cause__ = e
        return named
    return e


def append_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Append lines that are already bytes (sealed chain entries: written as sealed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is out (a filling disk may take part of a write)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> tuple[list[Any], int]:
    """Parsed lines of a JSON-lines file and the number of torn (unparseable) lines."""
    entries: list[Any] = []
    torn = 0
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return entries, 0
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            torn += 1
    return entries, torn


def iter_dirs(path: Path) -> Iterator[Path]:
    if not path.is_dir():
        return iter(())
    return (p for p in sorted(path.iterdir()) if p.is_dir())


# Errors that mean the disk, not the daemon, failed: they fail the run being written,
# never the daemon.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}


def disk_fault(exc: BaseException | None) -> OSError | None:
    """The disk error inside `exc` (an exception group, or a chain), if any."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
            return e
        if isinstance(e, BaseExceptionGroup):
            stack.extend(e.exceptions)
        stack.extend([e.__cause__, e.__context__])
    return None


def describe_disk_fault(e: OSError, root: Path | None = None) -> str:
    what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EIO: "the disk failed (I/O error)", errno.EROFS: "the disk is read-only"}.get(e.errno or 0, str(e))
    where = ""
    if e.filename:
        name = str(e.filename)
        if root is not None:
            try:
                name = str(Path(name).relative_to(root))
            except ValueError:
                pass
        where = f" while writing {name}"
    return what + where


def tail_lines(path: Path, n: int, chunk: int = 65536) -> list[Any]:
    """The last n parseable lines of a JSON-lines file, read from the end (a long log is
    never read whole)."""
    if n <= 0:
        return []
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return []
    with f:
        end = f.seek(0, os.SEEK_END)
        data = b""
        pos = end
        while pos > 0 and data.count(b"\n") <= n:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    out: list[Any] = []
    for line in data.split(b"\n")[-(n + 1):]:
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out[-n:]


def append_lines(path: Path, values: list[Any], durable: bool = True) -> None:
    """Several lines in one write (and one fsync)."""
    data = b"".join(json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for v in values)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        write_all(fd, data)
        if durable:
            os.fsync(fd)
    except OSError as e:
        raise _named(e, path) from None
    finally:
        os.close(fd)
