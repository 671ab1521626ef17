"""Refused MCPL connections: what to tell the peer, and when to tell the operator (issue 32.16).

A removed or rotated host retries forever with its old token (real hosts reconnect every
5 s); about 30 refusals in 45 s used to leave no daemon log line. Now:

- the first refusal from an address is logged, and then at most one line per address per
  WINDOW_S, saying how many were refused in between without a line;
- the -32001 answer says "this caller was removed" / "this token was rotated" while the
  daemon remembers the old token's hash. Remembered in memory only (a restart forgets,
  and the answer falls back to "matches no caller"), at most MAX_RETIRED hashes, the
  oldest forgotten first: what it costs to say so is a dict lookup per refusal.

Pure: the caller passes the time (trio.current_time(), so tests run it under MockClock).
"""

from __future__ import annotations

import hashlib

import attrs

from ..config import Config

WINDOW_S = 60.0
MAX_PEERS = 1024          # addresses remembered; beyond, those whose window has ended are dropped
MAX_RETIRED = 1024

UNKNOWN = "unauthorized: the token is missing or matches no caller"
REMOVED = "unauthorized: this caller was removed from the daemon's config"
ROTATED = "unauthorized: this token was rotated; connect with the caller's new token"


def token_sha256(token: str | None) -> str | None:
    return hashlib.sha256(token.encode()).hexdigest() if token else None


@attrs.define
class _Window:
    start: float
    unlogged: int = 0


class Refusals:
    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}
        self._retired: dict[str, tuple[str, str]] = {}      # old token hash -> (message, caller name)

    def retire(self, running: Config, new: Config) -> None:
        """A reload: remember the hashes that `new` no longer accepts, and why."""
        for old in running.callers:
            now = new.caller(old.name)
            if now is None:
                self._remember(old.tokenSha256, REMOVED, old.name)
            elif now.tokenSha256 != old.tokenSha256:
                self._remember(old.tokenSha256, ROTATED, old.name)

    def _remember(self, digest: str, message: str, name: str) -> None:
        self._retired.pop(digest, None)          # re-inserted: the newest
        self._retired[digest] = (message, name)
        while len(self._retired) > MAX_RETIRED:
            del self._retired[next(iter(self._retired))]

    def why(self, presented_sha256: str | None) -> tuple[str, str | None]:
        """(the -32001 message, the caller the token was once of, for the log)."""
        found = self._retired.get(presented_sha256) if presented_sha256 else None
        return found if found is not None else (UNKNOWN, None)

    def note(self, peer: str, now: float) -> int | None:
        """A refusal from `peer` at `now`. None: stay quiet (one line was logged for this
        address less than WINDOW_S ago); else log one, saying how many were refused
        since the last line without one."""
        w = self._windows.get(peer)
        if w is not None and now - w.start < WINDOW_S:
            w.unlogged += 1
            return None
        self._windows.pop(peer, None)
        self._windows[peer] = _Window(now)
        if len(self._windows) > MAX_PEERS:
            self._windows = {p: x for p, x in self._windows.items() if now - x.start < WINDOW_S}
            while len(self._windows) > MAX_PEERS:          # a flood of new addresses: oldest out
                del self._windows[next(iter(self._windows))]
        return w.unlogged if w is not None else 0
