"""The door of one node agent's network namespace: the daemon's own relay
(launch/netns.relaying, launch/egress.Relay), run on a Trio loop of its own in a thread,
since a Ray task body is synchronous and a node has no daemon loop to lend.

Same life as on the daemon's machine: opened before the fork, `spawned()` once the CLI
runs (the child's fds are closed, the listeners taken over), and `close()` after the
group is killed drains what the agent already sent (bounded, netns.DRAIN_S) and stops.
"""

from __future__ import annotations

import threading

import trio

from ..launch.netns import Namespace, RelayScope, relaying


class NodeDoor:
    def __init__(self, ns: Namespace, key: str) -> None:
        self.ns, self.key = ns, key
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: RelayScope | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name=f"swarmbase-door-{key}",
                                        daemon=True)

    def __enter__(self) -> "NodeDoor":
        self._thread.start()
        self._ready.wait()
        if self._token is None:
            self._thread.join()
            raise RuntimeError("the agent's door could not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _main(self) -> None:
        try:
            self._stop = trio.Event()
            async with relaying(self.ns, self.key) as scope:
                self._scope = scope
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()          # never leaves __enter__ waiting

    def spawned(self) -> None:
        """The CLI runs: carry its connections (NamespaceError if its namespace failed)."""
        assert self._scope is not None and self._token is not None
        trio.from_thread.run(self._scope.start, trio_token=self._token)

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._token = None
        self._thread.join()
