"""Driving a real daemon's config reloads from a test: edit its config file, give a caller a
new token, SIGHUP and wait for the status of a reload that read the file after it."""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import time
from pathlib import Path
from typing import Any

import trio

from swarmbase.reload_cli import read_status

from .clidaemon import CliDaemon


def edit_config(path: Path, change: Any) -> None:
    cfg = json.loads(path.read_text())
    change(cfg)
    path.write_text(json.dumps(cfg))


def new_token(state: Path, name: str) -> tuple[str, str]:
    tok = secrets.token_hex(24)
    (state / f"mcpl-{name}.token").write_text(tok)
    return tok, hashlib.sha256(tok.encode()).hexdigest()


async def sighup_and_wait(d: CliDaemon, state: Path) -> dict[str, Any]:
    """SIGHUP, then the daemon's status for a reload that read the file after it."""
    asked = time.monotonic()
    d.proc.send_signal(signal.SIGHUP)
    while True:
        st = read_status(state)
        if st is not None and st["readAt"] >= asked:
            return st
        await trio.sleep(0.02)
