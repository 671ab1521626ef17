"""The check a daemon runs on every agent node at boot (and when a node joins): reap what
its earlier lives left there, and say whether the node can run agents — the CLI binary,
each shared root (the daemon wrote a nonce file there; the node must read the same
bytes), its state dir, whether it can give agents the daemon's sandbox (bubblewrap, the
caller's uid: node/confine.py, the rule each agent's start applies), and its swarmbase
version."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from importlib import metadata
from typing import Any

from ..launch.sandbox import HostLayout
from . import confine, state
from .agent import where

REFUSES = "refuses agents: "


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


def sandbox_check(wanted: str, user: dict[str, Any] | None, name: str) -> str:
    """What the nodes page says of the node's sandbox; REFUSES and the reason when its
    agents would be refused (`user`: one the daemon would send, for the rule's sake)."""
    why = confine.refusal(wanted, HostLayout.probe(), os.geteuid(), confine.user_of({"user": user}), name)
    if why is not None:
        return REFUSES + why
    return "bwrap" if shutil.which("bwrap") else "none (bubblewrap is not installed)"


def check_node(owner: str, boot: str, cli: str, roots: list[tuple[str, str, str]], sandbox: str = "bwrap",
               user: dict[str, Any] | None = None) -> dict[str, Any]:
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
            "sandbox": sandbox_check(sandbox, user, name),
            "swarmbase": version, "python": platform.python_version()}
