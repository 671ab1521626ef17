"""Dashboard admin sessions: one-time sign-in links and session cookies.

Why: the Tailscale-User-Login header proves nothing to the daemon when any local process
can reach 127.0.0.1 and send it. An admin action must also present a session cookie that
only a browser signed in through a link from `swarmbase admin-link LOGIN` holds; minting
a link needs the config (the daemon's user). The cookie is HttpOnly and SameSite=Strict,
so no page script and no other site can use it.

The CLI and the daemon are different processes; they meet in the state dir (0700 dirs,
0600 files), and only hashes of tokens are ever stored:
    admin/links/<sha256(link token)>.json      {login, expiresAt}   written by the CLI
    admin/sessions/<sha256(cookie)>.json       {login, createdAt, expiresAt}   by the daemon
A link is redeemed by renaming its file away first, so two uses racing each other cannot
both succeed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Callable

from . import fsutil

LINK_TTL_S = 15 * 60
SESSION_TTL_S = 12 * 3600
COOKIE = "swarmbase_admin"
TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{32,128}$")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AdminStore:
    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.root = state_dir / "admin"
        self.links = self.root / "links"
        self.sessions = self.root / "sessions"
        self.clock = clock

    def _dirs(self) -> None:
        for d in (self.root, self.links, self.sessions):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(d, 0o700)

    def _read(self, path: Path) -> dict | None:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("login"), str):
            return None
        if not isinstance(data.get("expiresAt"), (int, float)) or data["expiresAt"] <= self.clock():
            return None
        return data

    # -- links (written by the CLI) ------------------------------------------------
    def create_link(self, login: str) -> str:
        self._dirs()
        token = secrets.token_urlsafe(32)
        fsutil.write_json(self.links / f"{digest(token)}.json",
                          {"login": login, "expiresAt": self.clock() + LINK_TTL_S})
        self.sweep()
        return token

    def peek_link(self, token: str) -> str | None:
        """The login a link is for, if it is unused and unexpired (does not use it)."""
        if not TOKEN_RE.fullmatch(token):
            return None
        data = self._read(self.links / f"{digest(token)}.json")
        return data["login"] if data else None

    def redeem_link(self, token: str) -> str | None:
        """Use a link: its login, once; None if unknown, used or expired."""
        if not TOKEN_RE.fullmatch(token):
            return None
        path = self.links / f"{digest(token)}.json"
        claimed = path.with_name(f".{path.name}.used-{secrets.token_hex(4)}")
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            return None
        try:
            data = self._read(claimed)
        finally:
            claimed.unlink(missing_ok=True)
        return data["login"] if data else None

    # -- sessions (written by the daemon) ---------------------------------------------
    def create_session(self, login: str) -> str:
        self._dirs()
        token = secrets.token_urlsafe(32)
        now = self.clock()
        fsutil.write_json(self.sessions / f"{digest(token)}.json",
                          {"login": login, "createdAt": now, "expiresAt": now + SESSION_TTL_S})
        return token

    def session_login(self, token: str | None) -> str | None:
        """The login of a live session cookie; None if unknown or expired."""
        if not token or not TOKEN_RE.fullmatch(token):
            return None
        data = self._read(self.sessions / f"{digest(token)}.json")
        return data["login"] if data else None

    def end_session(self, token: str | None) -> None:
        if token and TOKEN_RE.fullmatch(token):
            (self.sessions / f"{digest(token)}.json").unlink(missing_ok=True)

    def sweep(self) -> int:
        """Delete expired links and sessions; returns how many."""
        n = 0
        for d in (self.links, self.sessions):
            if not d.is_dir():
                continue
            for p in d.glob("*.json"):
                if self._read(p) is None:
                    p.unlink(missing_ok=True)
                    n += 1
        return n


def base_url(public_url: str | None, port: int) -> str:
    return (public_url or f"http://127.0.0.1:{port}").rstrip("/")


def link_url(public_url: str | None, port: int, token: str) -> str:
    return f"{base_url(public_url, port)}/admin/login/{token}"
