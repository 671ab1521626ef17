"""Room for the last words of a daemon stopped on a full disk (issue 32 #12).

A run that ended while the disk refused writes waits in memory (runs/deferred.py): its
journal lines (paid results), its final record, its end notice. Stopped before space
returned, all of it used to be lost, and the next start, finding the run in flight on
disk, told the host "interrupted" under the eventId it had already acknowledged as
"completed". So the daemon keeps a reserve file in its state dir; a stop that still has
unwritten state deletes it, writes what then fits, and records what still did not fit in
`stop-note.json`, which the next boot reads (and deletes) to say it in the run's notice.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .. import fsutil
from ..jsonvalue import JsonObject

log = logging.getLogger("swarmbase.supervisor")

RESERVE = "reserve.bin"
NOTE = "stop-note.json"
RESERVE_BYTES = 512 * 1024     # what a stop needs: a few journal lines, records, outbox lines


def hold(state_dir: Path) -> None:
    """Keep the reserve (at boot, once space is there again); a disk too full for it now is
    only logged: the daemon runs without the reserve until the next start."""
    path = state_dir / RESERVE
    try:
        if path.stat().st_size == RESERVE_BYTES:
            return
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot check %s: %s", path, e)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * RESERVE_BYTES)      # written, not sparse: the blocks are really held
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        path.unlink(missing_ok=True)
        log.warning("cannot keep %d KiB in reserve for a stop on a full disk (%s): %s",
                    RESERVE_BYTES // 1024, path, fsutil.describe_disk_fault(e, state_dir))


def release(state_dir: Path) -> bool:
    """Give the reserve's space back to the disk; True when there was one."""
    try:
        (state_dir / RESERVE).unlink()
    except FileNotFoundError:
        return False
    return True


def write(state_dir: Path, runs: dict[str, JsonObject]) -> None:
    try:
        fsutil.write_json(state_dir / NOTE, {"runs": runs})
    except OSError as e:
        log.error("cannot write %s (%s): the next start cannot say what was lost", state_dir / NOTE, e)


def take(state_dir: Path) -> dict[str, JsonObject]:
    """What the last stop could not write, by run id (read once: the file is deleted)."""
    path = state_dir / NOTE
    try:
        data = fsutil.read_json(path, None)
    except (OSError, ValueError):
        data = None
    path.unlink(missing_ok=True)
    runs = data.get("runs") if isinstance(data, dict) else None
    return {k: v for k, v in runs.items() if isinstance(v, dict)} if isinstance(runs, dict) else {}


def unwritten_words(entry: JsonObject) -> str:
    """What a note entry says could not be written, for a log line or a notice."""
    parts = entry.get("unwritten")
    return "; ".join(p for p in parts if isinstance(p, str)) if isinstance(parts, list) else "(not recorded)"
