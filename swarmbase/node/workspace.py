"""Shipping a run's private work dir to a node that does not share it, and bringing the
agent's edits back — through Ray's object store, as tarballs.

Only for the run's own `work/` dir (a cwd a caller named must be on a shared root). The
node unpacks the tree, remembers what it unpacked, and after the CLI ends sends back only
what changed (new or modified files, new dirs) plus the list of deleted paths, so two
agents of one run that edit different files both keep their edits; edits to the same file
are last-writer-wins. Extraction uses tarfile's "data" filter on both sides (no absolute
paths, no `..`, no links out of the tree, no device files).
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

MAX_BYTES = 64 * 1024 * 1024

Manifest = dict[str, tuple[str, int, int]]      # rel path -> (kind, size, mtime_ns)


class WorkspaceTooLarge(Exception):
    pass


def manifest(root: Path) -> Manifest:
    out: Manifest = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            kind = "l" if os.path.islink(p) else "d" if os.path.isdir(p) else "f"
            out[os.path.relpath(p, root)] = (kind, 0 if kind == "d" else st.st_size, 0 if kind == "d" else st.st_mtime_ns)
    return out


def _pack(root: Path, names: list[str]) -> bytes:
    total = sum(os.lstat(root / n).st_size for n in names if os.path.isfile(root / n))
    if total > MAX_BYTES:
        raise WorkspaceTooLarge(f"{total:,} bytes is more than {MAX_BYTES:,}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for n in sorted(names):
            tar.add(root / n, arcname=n, recursive=False)
    return buf.getvalue()


def pack(root: Path) -> bytes:
    """The whole tree under root."""
    return _pack(root, list(manifest(root)))


def unpack(data: bytes, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        tar.extractall(root, filter="data")


def changes(root: Path, before: Manifest) -> tuple[bytes, list[str]]:
    """(tarball of what is new or changed, paths deleted) since `before`."""
    now = manifest(root)
    changed = [n for n, v in now.items() if before.get(n) != v]
    deleted = sorted(n for n in before if n not in now)
    return _pack(root, changed), deleted


def apply(root: Path, data: bytes, deleted: list[str]) -> None:
    """Bring a node's changes into root (the daemon's copy)."""
    real = os.path.realpath(root)
    for rel in sorted(deleted, key=len, reverse=True):      # children before their dirs
        target = os.path.join(real, rel)
        parent = os.path.realpath(os.path.dirname(target))
        if os.path.isabs(rel) or ".." in Path(rel).parts or not (parent == real or parent.startswith(real + "/")):
            continue
        if os.path.islink(target) or os.path.isfile(target):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target, ignore_errors=True)
    unpack(data, root)
