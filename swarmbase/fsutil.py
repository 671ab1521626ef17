"""Crash-safe file writes: whole files by temp + rename, logs by fsync'd appends.

A crash at any instant leaves each file either old or new, never torn; an append-only
log may lose at most its unfinished last line, which readers skip.
"""

from __future__ import annotations

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
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
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
    line = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


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


def tail_lines(path: Path, n: int) -> list[Any]:
    entries, _ = read_lines(path)
    return entries[-n:]


def iter_dirs(path: Path) -> Iterator[Path]:
    if not path.is_dir():
        return iter(())
    return (p for p in sorted(path.iterdir()) if p.is_dir())
