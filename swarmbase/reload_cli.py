"""`swarmbase reload`: ask the daemon running on the config's state dir to re-read its
config, and report what it said.

The daemon is found through its state-dir lock (statelock.py): a lock held means a
daemon runs, and the file holds its pid. The request is a SIGHUP (the same as `systemctl
reload` and `kill -HUP`), so there is one reload path; the answer is the status file the
daemon writes after each reload (live_reload.write_status), taken only when the daemon
read the config after this command sent its signal. Exit status: 0 reloaded (the message
may still name settings that need a restart), 2 refused (the running config stays), 1 no
daemon, or no answer in time.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .live_reload import STATUS_FILE

POLL_S = 0.05


def daemon_pid(state_dir: Path) -> int | None:
    """The pid of the daemon holding the state dir's lock, or None when none holds it."""
    path = state_dir / "swarmbase.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def read_status(state_dir: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((state_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def request_reload(state_dir: Path, timeout: float) -> tuple[int, str]:
    """(exit status, one line) of a reload of the daemon on `state_dir`."""
    pid = daemon_pid(state_dir)
    if pid is None:
        return 1, f"no daemon is running on {state_dir}; it reads the config when it starts"
    asked_at = time.monotonic()
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return 1, f"the daemon (pid {pid}) on {state_dir} is gone"
    except PermissionError:
        return 1, f"not allowed to signal the daemon (pid {pid}); run this as the daemon's user"
    deadline = asked_at + timeout
    while time.monotonic() < deadline:
        st = read_status(state_dir)
        if st is not None and st.get("pid") == pid and isinstance(st.get("readAt"), (int, float)) \
                and st["readAt"] >= asked_at:
            return (0 if st.get("ok") else 2), str(st.get("message"))
        time.sleep(POLL_S)
    return 1, f"the daemon (pid {pid}) did not answer within {timeout:g} s; see its log"


def reload_command(state_dir: Path, timeout: float, err: TextIO = sys.stderr) -> int:
    code, message = request_reload(state_dir, timeout)
    print(f"swarmbase: {message}", file=err)
    return code
