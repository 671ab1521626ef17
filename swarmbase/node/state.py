"""A node's state dir: where agents' private dirs and process records live, the reaper
that kills what a dead daemon left behind, and `forget` for one force-cancelled agent."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,120}$")


def node_dir() -> Path:
    return Path(os.environ.get("SWARMBASE_NODE_DIR") or os.path.expanduser("~/.swarmbase-node"))


def _safe(*parts: str) -> None:
    for p in parts:
        if not NAME.fullmatch(p) or p in (".", ".."):
            raise ValueError(f"not a plain name: {p[:60]!r}")


def agent_dirs(owner: str, boot: str, key: str, root: Path | None = None) -> tuple[Path, Path, Path]:
    """(record file, private dir, workspace dir) of one agent."""
    _safe(owner, boot, key)
    root = root or node_dir()
    return (root / "procs" / owner / boot / f"{key}.json", root / "homes" / owner / boot / key,
            root / "work" / owner / boot / key)


def makedirs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def write_record(path: Path, data: dict[str, Any]) -> None:
    makedirs(path.parent)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def marker(owner: str, boot: str, key: str) -> str:
    """Put in the agent's environment: how the reaper recognises its processes once the
    group leader is gone (a pid may be reused; a reused pid never carries this)."""
    return f"{owner}/{boot}/{key}"


MARKER_ENV = "SWARMBASE_NODE_AGENT"


def kill_marked(mark: str) -> int:
    """SIGKILL every process carrying the agent's marker: its group, and what left the
    group (a shell's `cmd &` gets a group of its own) but kept the environment."""
    needle = f"{MARKER_ENV}={mark}".encode()
    killed = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            try:
                os.kill(int(d.name), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def kill_recorded(rec: dict[str, Any]) -> int:
    """Kill what is left of one recorded agent; returns how many processes were signalled:
    its group while the leader still has the recorded start time (a reused pid never
    does), and every process carrying its marker."""
    pgid, start, mark = rec.get("pgid"), rec.get("startTime"), rec.get("marker")
    killed = 0
    if isinstance(pgid, int) and pgid > 1 and start is not None and start_time(pgid) == start:
        try:
            os.killpg(pgid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    if isinstance(mark, str) and mark:
        killed += kill_marked(mark)
    return killed


def forget(owner: str, boot: str, key: str, root: Path | None = None) -> dict[str, Any]:
    """Kill and forget one agent of this daemon life whose task's `finally` may not have
    run: the daemon force-cancelled it, and a force cancel kills the Ray worker wherever
    it was (before the group kill, or between it and the record's removal). The worker's
    guardian ends the group but not what left it, and the record would wait for the next
    boot's reaper."""
    record, private, work = agent_dirs(owner, boot, key, root)
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):        # killed before it wrote the record, or a torn one
        rec = None
    had_record = isinstance(rec, dict)
    killed = kill_recorded(rec) if isinstance(rec, dict) else kill_marked(marker(owner, boot, key))
    record.unlink(missing_ok=True)
    shutil.rmtree(private, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return {"killed": killed, "record": had_record}


def reap(owner: str, keep_boot: str, root: Path | None = None) -> dict[str, Any]:
    """Kill and forget every agent that an earlier life of daemon `owner` left on this
    node (its records, private dirs and shipped workspaces); the current life's are kept."""
    _safe(owner, keep_boot)
    root = root or node_dir()
    killed, records, unreadable = 0, 0, 0
    procs = root / "procs" / owner
    if procs.is_dir():
        for boot in procs.iterdir():
            if boot.name == keep_boot:
                continue
            for rec_file in boot.glob("*.json"):
                records += 1
                try:
                    rec = json.loads(rec_file.read_text())
                except (OSError, ValueError):
                    unreadable += 1
                    continue
                if isinstance(rec, dict):
                    killed += kill_recorded(rec)
            shutil.rmtree(boot, ignore_errors=True)
    for kind in ("homes", "work"):
        base = root / kind / owner
        if base.is_dir():
            for boot in base.iterdir():
                if boot.name != keep_boot:
                    shutil.rmtree(boot, ignore_errors=True)
    return {"records": records, "killed": killed, "unreadable": unreadable, "at": time.time()}
