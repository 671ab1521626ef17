"""The embedded default config (first start) and `swarmbase add-caller`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from . import fsutil, jsonc
from .config import ConfigError, fill_command

DEFAULT_PORT = 7360
# What to do when no agent CLI was found (the first start, and agent() without an engine).
NO_ENGINE_FIX = ('install Claude Code (npm install -g @anthropic-ai/claude-code), add "engines": {"claude": {}} '
                 "to the daemon's config and restart the daemon")


def _new_token_file(state_dir: Path, name: str) -> tuple[Path, str]:
    token = secrets.token_hex(24)
    path = state_dir / f"mcpl-{name}.token"
    fsutil.write_atomic(path, (token + "\n").encode(), mode=0o600)
    os.chmod(path, 0o600)
    return path, hashlib.sha256(token.encode()).hexdigest()


def _new_key_file(state_dir: Path, name: str) -> Path:
    """An empty 0600 key file for the caller's API key. Made here, before the operator fills
    it: `printf … > file` keeps the mode of a file that exists, so the key is never readable
    by others, even for a moment."""
    key_path = state_dir / f"{name}.key"
    if not key_path.exists():
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    os.chmod(key_path, 0o600)
    return key_path


def _found_engines() -> dict[str, Any]:
    engines: dict[str, Any] = {}
    claude = shutil.which("claude")
    if claude:
        engines["claude"] = {"bin": claude, "baseUrl": None}
    # The codex engine needs a baseUrl to be on; it is listed only as a hint.
    return engines


def write_default(path: Path, port: int = DEFAULT_PORT) -> str:
    """Write a first config: the port (7360 unless chosen with --port), caller `local` with
    a fresh token, engines for the CLIs found on PATH. Returns the message to print.

    The caller lists no `engines` of its own (default: every configured engine), so
    adding an engine to the config later is all it takes to give `local` agents."""
    state = path.parent
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    token_path, digest = _new_token_file(state, "local")
    key_path = _new_key_file(state, "local")
    engines = _found_engines()
    # The sandbox needs bubblewrap; without it the daemon still starts, unconfined (see README).
    sandbox = "bwrap" if shutil.which("bwrap") else "none"
    cfg = {
        "port": port,
        "sandbox": sandbox,
        "engines": engines,
        "callers": [{"name": "local", "tokenSha256": digest, "apiKeyFile": str(key_path), "maxProfile": "read"}],
    }
    fsutil.write_json(path, cfg)
    found = ", ".join(sorted(engines)) or f"none: {NO_ENGINE_FIX} ({path})"
    sandbox_note = "" if sandbox == "bwrap" else (
        "swarmbase: bubblewrap is not installed: agents and scripts run without the sandbox "
        "(apt-get install bubblewrap, then set \"sandbox\": \"bwrap\")\n")
    return (f"swarmbase: wrote a first config to {path}\n{sandbox_note}"
            f"swarmbase: caller 'local' token is in {token_path} (mode 0600)\n"
            f"swarmbase: caller 'local' API key goes in {key_path} (mode 0600, empty now; agents need it): "
            f"{fill_command(str(key_path))}\n"
            f"swarmbase: engines found on PATH: {found}\n"
            f"swarmbase: connect an MCPL host to ws://127.0.0.1:{port}/mcpl?token=<contents of {token_path.name}>")


def add_caller(path: Path, name: str) -> str:
    """The spec's "To add a caller" steps: token file, its sha256 in the config, a 0600
    key file for the caller's API key. The CLI then reloads a running daemon (reload_cli.py)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ConfigError(f"caller name {name!r} must be 1-64 letters, digits, '_' or '-'")
    if not path.exists():
        write_default(path)
    raw = jsonc.loads(path.read_text())
    callers = raw.setdefault("callers", [])
    if any(isinstance(c, dict) and c.get("name") == name for c in callers):
        raise ConfigError(f"callers: a caller named {name!r} already exists")
    state = path.parent
    token_path, digest = _new_token_file(state, name)
    key_path = _new_key_file(state, name)
    callers.append({"name": name, "tokenSha256": digest, "apiKeyFile": str(key_path), "maxProfile": "read"})
    backup = path.with_name(path.name + ".bak")
    shutil.copy2(path, backup)
    fsutil.write_atomic(path, (json.dumps(raw, indent=2) + "\n").encode(), mode=0o600)
    return (f"swarmbase: added caller {name!r} to {path} (previous version, with any comments, in {backup.name})\n"
            f"swarmbase: its MCPL token is in {token_path} (mode 0600)\n"
            f"swarmbase: put the caller's API key or gateway token in {key_path} (mode 0600): "
            f"{fill_command(str(key_path))}")
