"""The check a daemon runs on every agent node at boot (and when a node joins): reap what
its earlier lives left there, and say whether the node can run agents — the CLI binary,
each shared root (the daemon wrote a nonce file there; the node must read the same
bytes), its state dir, bubblewrap, and its swarmbase version."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from importlib import metadata
from typing import Any

from . import state
from .agent import where


def _check_root(path: str, nonce_name: str, nonce: str) -> dict[str, Any]:
    if not os.path.isdir(path):
        return {"path": path, "ok": False, "detail": "not a directory on this node"}
    try:
        with open(os.path.join(path, nonce_name)) as f:
            seen = f.read()
    except OSError as e:
        return {"path": path, "ok": False, "detail": f"the daemon's probe file is not there ({e.strerror}): "
                                                     "not the same filesystem as the daemon's"}
    if seen != nonce:
        return {"path": path, "ok": False, "detail": "another filesystem at this path (the probe file differs)"}
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".swarmbase-node-probe-"):
            pass
    except OSError as e:
        return {"path": path, "ok": False, "detail": f"shared but not writable here: {e.strerror}"}
    return {"path": path, "ok": True, "detail": "shared"}


def check_node(owner: str, boot: str, cli: str, roots: list[tuple[str, str, str]]) -> dict[str, Any]:
    node_id, name = where()
    reaped = state.reap(owner, boot)
    cli_ok = os.path.isfile(cli) and os.access(cli, os.X_OK)
    root = state.node_dir()
    try:
        state.makedirs(root)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
        dir_ok, dir_detail = True, str(root)
    except OSError as e:
        dir_ok, dir_detail = False, f"{root}: {e.strerror}"
    try:
        version = metadata.version("swarmbase")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"node": node_id, "name": name, "reaped": reaped,
            "cli": {"path": cli, "ok": cli_ok, "detail": "found" if cli_ok else "missing or not executable"},
            "roots": [_check_root(p, n, v) for p, n, v in roots],
            "stateDir": {"ok": dir_ok, "detail": dir_detail},
            "sandbox": "bwrap" if shutil.which("bwrap") else "none (bubblewrap is not installed)",
            "swarmbase": version, "python": platform.python_version()}
