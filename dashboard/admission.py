"""Admission and dropping for SSE viewers. Pure bookkeeping, clock injected.

A viewer's key is a path, most trusted level first (dashboard/peers.py: account, address,
route, login). The rules:
- a key (one client) holds at most `max_per_client` streams; when it opens one more, its
  own oldest stream makes room (after stalled ones are reaped), so a client's idle
  streams never lock it out, and a flood sharing a key only churns itself;
- at most `max_total` streams in all. At the cap a newcomer first reclaims stalled viewers;
  then, walking its key from the top, at the first level where some other branch holds
  two or more streams more than the newcomer's branch, that branch gives up its oldest
  stream (taken from its heaviest sub-branch, down to one client). If no level has such a
  branch, the newcomer is refused: it is among the heaviest itself.
So 256 streams from one account cannot keep a viewer from another account out, and
within one account 256 forged tailnet logins cannot keep out a viewer that is not using
the proxy route, whatever it is keyed on below.
"""

from __future__ import annotations

from typing import Callable

import attrs
import trio

MAX_STREAMS = 256
MAX_PER_CLIENT = 16
STALL_S = 10.0
REAP_AT_ONCE = 32

Key = tuple[str, ...]


@attrs.define(eq=False)
class Viewer:
    client: Key
    since: float = 0.0
    sending_since: float | None = None
    drop: Callable[[], None] | None = None      # ends the stream: cancels it, closes its socket


class Viewers:
    def __init__(self, max_total: int = MAX_STREAMS, max_per_client: int = MAX_PER_CLIENT,
                 stall_s: float = STALL_S, clock: Callable[[], float] = trio.current_time) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.stall_s = stall_s
        self.clock = clock
        self.by_client: dict[Key, list[Viewer]] = {}
        # For every branch (a key's prefix; the root is ()), how many streams each of its
        # child branches holds.
        self.tree: dict[Key, dict[str, int]] = {}
        self.count = 0
        self.refused = 0
        self.dropped = 0
        self.high = 0             # most viewers since the last ebb
        self.on_ebb: Callable[[], None] = lambda: None
        self._last_reap = 0.0

    def admit(self, client: Key) -> Viewer | str:
        """A new viewer, or why not (a reason for the 429/503 answer)."""
        if len(self.by_client.get(client, ())) >= self.max_per_client:
            self.reap()
            mine = self.by_client.get(client, [])
            if len(mine) >= self.max_per_client:
                oldest = next((v for v in mine if v.drop is not None), None)
                if oldest is None:
                    self.refused += 1
                    return f"at most {self.max_per_client} live streams per client; close some tabs"
                self._drop(oldest)
        if self.count >= self.max_total:
            self.reap()
        if self.count >= self.max_total:
            victim = self._victim(client)
            if victim is None:
                self.refused += 1
                return f"the dashboard serves at most {self.max_total} live streams; try again shortly"
            self._drop(victim)
        v = Viewer(client, since=self.clock())
        self.by_client.setdefault(client, []).append(v)
        for i, part in enumerate(client):
            kids = self.tree.setdefault(client[:i], {})
            kids[part] = kids.get(part, 0) + 1
        self.count += 1
        self.high = max(self.high, self.count)
        return v

    def _victim(self, client: Key) -> Viewer | None:
        prefix: Key = ()
        for part in client:
            children = self.tree.get(prefix, {})
            mine = children.get(part, 0)
            others = [(c, p) for p, c in children.items() if p != part]
            if others and max(others)[0] > mine + 1:
                return self._oldest_under(prefix + (max(others)[1],))
            if mine == 0:
                return None
            prefix += (part,)
        return None

    def _oldest_under(self, prefix: Key) -> Viewer | None:
        """The oldest droppable stream of the heaviest client under `prefix`."""
        while prefix not in self.by_client:
            children = self.tree.get(prefix)
            if not children:
                return None
            prefix += (max(children.items(), key=lambda kv: kv[1])[0],)
        return next((v for v in self.by_client[prefix] if v.drop is not None), None)

    def _drop(self, v: Viewer) -> None:
        self.leave(v)
        if v.drop is not None:
            v.drop()
            v.drop = None
        self.dropped += 1

    def leave(self, v: Viewer) -> None:
        mine = self.by_client.get(v.client)
        if mine and v in mine:
            mine.remove(v)
            self.count -= 1
            if not mine:
                del self.by_client[v.client]
            for i, part in enumerate(v.client):
                kids = self.tree[v.client[:i]]
                kids[part] -= 1
                if not kids[part]:
                    del kids[part]
                    if not kids:
                        del self.tree[v.client[:i]]
            if self.count <= self.high // 10 and self.high >= 64:
                self.high = self.count
                self.on_ebb()

    def stalled(self) -> list[Viewer]:
        now = self.clock()
        return [v for vs in self.by_client.values() for v in vs
                if v.sending_since is not None and now - v.sending_since >= self.stall_s]

    def reap(self, limit: int = REAP_AT_ONCE) -> int:
        """Drop viewers stuck in one send for stall_s or longer, longest stuck first, at most
        `limit` at a time (hundreds unwinding at once would stall the loop); returns how many."""
        self._last_reap = self.clock()
        stuck = sorted((v for v in self.stalled() if v.drop is not None), key=lambda v: v.sending_since or 0.0)
        for v in stuck[:limit]:
            self._drop(v)
        return len(stuck[:limit])

    def reap_now_and_then(self) -> None:
        if self.clock() - self._last_reap >= 1.0:
            self.reap()
