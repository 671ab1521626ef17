"""Archived runs on disk: one zip per run in <state>/runs-archive/, and an index of them.

    runs-archive/<dirName>.zip     the run dir's regular files, deflated, paths relative
    runs-archive/index.jsonl       one line per archive: {dirName, archivedAt, run}
    runs-archive/.open/<dirName>/  archives opened for reading (dashboard, tools), a few kept

Zip, not tar.gz: a reader opens one member (run.json, one agent's transcript) without
inflating the whole run, and the stdlib writes and reads it. Symlinks are never followed
or stored (an agent's work dir is not trusted).

Crash safety. Archiving writes `.tmp-<dirName>.zip`, fsyncs it, renames it into place and
fsyncs the folder; appends the index line; renames the run dir to `runs/.pruned-<dirName>`
(boot's loader skips dot names) and removes it. A kill -9 at any point leaves either the
run dir (a temp zip, removed at the next boot: undone) or a whole zip (a run dir beside
it, or a `.pruned-` one, is removed at the next boot: finished). The zip is the truth and
the index only a cache of each archive's run.json, so boot never opens 100,000 zips: it
reads the index and lists the folder, reading the run.json of an archive the index lacks
and dropping lines whose archive is gone.

The index line keeps what `list`, `status` and the run list show; args, history and the
seal stay in the archive's run.json (an index line is ~0.5 KB, a run.json ~2-5 KB).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import time
import zipfile
from pathlib import Path
from typing import Iterator

from ..jsonvalue import Json, JsonObject
from .. import fsutil
from .model import Run

log = logging.getLogger("swarmbase.archive")

ROOT = "runs-archive"
INDEX = "index.jsonl"
OPEN = ".open"
PRUNED = ".pruned-"
TMP = ".tmp-"
OPEN_KEPT = 16              # opened archives kept extracted for the dashboard and tools
INDEX_DROPPED = ("args", "history", "link", "end")


def root(state_dir: Path) -> Path:
    return state_dir / ROOT


def zip_path(state_dir: Path, dir_name: str) -> Path:
    return root(state_dir) / f"{dir_name}.zip"


def open_dir(state_dir: Path, dir_name: str) -> Path:
    """Where an archived run reads from once opened (store.dir of an archived run)."""
    return root(state_dir) / OPEN / dir_name


# -- writing ---------------------------------------------------------------------------
def _members(run_dir: Path) -> Iterator[tuple[Path, str]]:
    """(path, name in the zip) of every regular file under run_dir, never through a symlink."""
    for top, dirs, files in os.walk(run_dir, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            p = Path(top) / name
            if stat.S_ISREG(os.lstat(p).st_mode):
                yield p, p.relative_to(run_dir).as_posix()


def write(run_dir: Path, dest: Path) -> tuple[int, int]:
    """The run dir as a zip at `dest`, durable before it appears under that name. Returns
    (bytes of the files, bytes of the zip)."""
    tmp = dest.with_name(TMP + dest.name)
    raw = 0
    try:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
                for path, name in _members(run_dir):
                    z.write(path, name)
                    raw += path.stat().st_size
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsutil.fsync_file(dest.parent)
    return raw, dest.stat().st_size


def index_line(run_json: JsonObject, archived_at: float) -> JsonObject:
    return {"dirName": run_json.get("dirName"), "archivedAt": archived_at,
            "run": {k: v for k, v in run_json.items() if k not in INDEX_DROPPED}}


def append_index(state_dir: Path, lines: list[JsonObject]) -> None:
    fsutil.append_lines(root(state_dir) / INDEX, lines)


def remove_dir(run_dir: Path) -> None:
    """A run dir gone for good: renamed out of the loader's sight first, so a crash mid-way
    leaves a `.pruned-` dir that the next boot removes, never a half run."""
    gone = run_dir.with_name(PRUNED + run_dir.name)
    os.replace(run_dir, gone)
    fsutil.fsync_file(run_dir.parent)
    shutil.rmtree(gone, ignore_errors=True)


def archive_run(state_dir: Path, run_dir: Path, now: float) -> tuple[JsonObject, int, int]:
    """Archive one ended run's dir and remove it (see the module docstring for the order).
    Returns (its index line, bytes of its files, bytes of its zip)."""
    root(state_dir).mkdir(mode=0o700, exist_ok=True)
    run_json = fsutil.read_json(run_dir / "run.json")
    if not isinstance(run_json, dict):
        raise ValueError(f"{run_dir.name}/run.json cannot be read")
    raw, packed = write(run_dir, zip_path(state_dir, run_dir.name))
    line = index_line(run_json, now)
    append_index(state_dir, [line])
    remove_dir(run_dir)
    return line, raw, packed


# -- boot ------------------------------------------------------------------------------
def _whole(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None and "run.json" in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def settle(state_dir: Path) -> list[str]:
    """Finish or undo what a killed daemon left half done, before runs are loaded: temp
    zips and opened copies removed, a run dir beside its whole archive (or renamed for
    removal) removed. Returns what it did, one line each."""
    done: list[str] = []
    arch, runs = root(state_dir), state_dir / "runs"
    zips: set[str] = set()            # listed once: boot must not stat every run dir's zip
    if arch.is_dir():
        shutil.rmtree(arch / OPEN, ignore_errors=True)
        for e in os.scandir(arch):
            if e.name.startswith(TMP):
                os.unlink(e.path)
                done.append(f"removed the unfinished archive {e.name}")
            elif e.name.endswith(".zip"):
                zips.add(e.name[: -len(".zip")])
    if runs.is_dir():
        for e in os.scandir(runs):
            p = Path(e.path)
            if e.name.startswith(PRUNED):
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"finished removing {e.name[len(PRUNED):]}")
            elif e.name in zips and e.is_dir(follow_symlinks=False):
                z = zip_path(state_dir, e.name)
                if _whole(z):
                    remove_dir(p)
                    done.append(f"finished archiving {p.name}")
                else:                 # cannot happen after an fsynced rename; kept safe anyway
                    z.unlink()
                    done.append(f"removed a damaged archive of {p.name}; the run dir is kept")
    return done


def agent_records(zip_file: Path) -> Iterator[tuple[int, JsonObject]]:
    """(n, agent.json) of every agent in an archive whose record parses (as
    audit.rundirs.agent_records reads a run dir)."""
    try:
        with zipfile.ZipFile(zip_file) as z:
            names = {int(m.split("/")[1]): m for m in z.namelist()
                     if m.startswith("agents/") and m.endswith("/agent.json") and m.split("/")[1].isdigit()}
            for n in sorted(names):
                try:
                    rec = json.loads(z.read(names[n]))
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield n, rec
    except (OSError, zipfile.BadZipFile):
        return


def index_lines(state_dir: Path) -> list[JsonObject]:
    """The archive index as written (for readers outside the daemon: `swarmbase usage`)."""
    lines, _ = fsutil.read_lines(root(state_dir) / INDEX)
    return [x for x in lines if isinstance(x, dict) and isinstance(x.get("run"), dict)]


def read_member(path: Path, name: str) -> bytes | None:
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(name)
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _index_lines(path: Path) -> Iterator[tuple[bytes, Json]]:
    """(raw line, parsed or None) of the index, one at a time: read whole, a 100,000-run
    index parsed at once would leave its peak in the daemon's RSS."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for raw in f:
            if raw.strip():
                try:
                    yield raw, json.loads(raw)
                except ValueError:
                    yield raw, None


def load_index(state_dir: Path) -> list[tuple[Run, float]]:
    """Every archived run (from the index; an archive it lacks from the archive's own
    run.json, added to it), with when it was archived. Lines whose archive is gone, and
    ones that do not parse, are left out (and the index rewritten without them)."""
    arch = root(state_dir)
    if not arch.is_dir():
        return []
    zips = {e.name[:-4] for e in os.scandir(arch) if e.name.endswith(".zip") and not e.name.startswith(".")}
    found: dict[str, tuple[Run, float]] = {}
    stale = 0
    for _, line in _index_lines(arch / INDEX):
        try:
            name, at = line["dirName"], float(line["archivedAt"])
            if name not in zips or name in found:
                raise ValueError("no archive, or a second line")
            found[name] = (Run.from_json(line["run"]), at)
        except (ValueError, KeyError, TypeError):
            stale += 1
    added = []
    for name in sorted(zips - found.keys()):
        raw = read_member(arch / f"{name}.zip", "run.json")
        try:
            data = json.loads(raw) if raw is not None else None
            if not isinstance(data, dict):
                raise ValueError("no run.json")
            line = index_line(data, os.stat(arch / f"{name}.zip").st_mtime)
            found[name] = (Run.from_json(line["run"]), line["archivedAt"])
            added.append(line)
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("archive %s.zip: its run.json cannot be read; not listed", name)
    if stale:
        _rewrite_index(arch / INDEX, set(found), added)
    elif added:
        append_index(state_dir, added)
    return list(found.values())


def _rewrite_index(path: Path, keep: set[str], added: list[JsonObject]) -> None:
    """The index with one line per archive in `keep` (the first good one) plus `added`."""
    out, seen = [], set()
    for raw, line in _index_lines(path):
        name = line.get("dirName") if isinstance(line, dict) else None
        if name in keep and name not in seen and isinstance(line.get("run"), dict):
            seen.add(name)
            out.append(raw if raw.endswith(b"\n") else raw + b"\n")
    out += [json.dumps(x, ensure_ascii=False, separators=(",", ":")).encode() + b"\n" for x in added
            if x["dirName"] not in seen]
    fsutil.write_atomic(path, b"".join(out))


# -- reading ---------------------------------------------------------------------------
def _safe_name(name: str) -> bool:
    parts = name.split("/")
    return not name.startswith("/") and "\\" not in name and all(p not in ("", ".", "..") for p in parts)


def extract(zip_file: Path, dest: Path) -> None:
    """Every member of an archive under `dest` (created), files 0600 and folders 0700;
    a member named outside `dest` is refused (the daemon never writes one)."""
    dest.mkdir(mode=0o700, parents=True)
    with zipfile.ZipFile(zip_file) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            if not _safe_name(info.filename):
                raise ValueError(f"{zip_file.name}: member {info.filename[:80]!r} is not a run file")
            target = dest / info.filename
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with z.open(info) as src, open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                                           "wb") as out:
                shutil.copyfileobj(src, out)


def open_run(state_dir: Path, dir_name: str) -> Path:
    """The archive extracted under .open/ (once; the least recently opened beyond
    OPEN_KEPT removed), for readers that take a run dir. Call it in a worker thread."""
    dest = open_dir(state_dir, dir_name)
    if dest.is_dir():
        os.utime(dest)
        return dest
    dest.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = dest.with_name(f"{TMP}{dir_name}-{os.getpid()}-{time.monotonic_ns()}")
    extract(zip_path(state_dir, dir_name), tmp)
    try:
        os.rename(tmp, dest)
    except OSError:                    # opened meanwhile by another reader
        shutil.rmtree(tmp, ignore_errors=True)
    _evict(dest.parent, keep=dest)
    return dest


def _evict(folder: Path, keep: Path) -> None:
    opened = sorted((p for p in folder.iterdir() if not p.name.startswith(TMP) and p != keep),
                    key=lambda p: p.stat().st_mtime)
    for p in opened[: max(0, len(opened) + 1 - OPEN_KEPT)]:
        shutil.rmtree(p, ignore_errors=True)


def full_record(state_dir: Path, dir_name: str) -> JsonObject | None:
    """An archived run's whole run.json (args, history, seal), read from its zip."""
    raw = read_member(zip_path(state_dir, dir_name), "run.json")
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
