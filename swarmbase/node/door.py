"""The doors of one node agent, on a Trio loop of its own in a thread (a Ray task body is
synchronous and a node has no daemon loop to lend): the key door it holds a bearer for,
and the relay of its network namespace's doors. The same pieces as on the daemon's
machine, not copies: engines/key_door.KeyDoor (served as the daemon serves it) and
launch/netns.relaying / launch/egress.Relay.

- `key_door(model_key)`: a KeyDoor of the agent's own on the node's loopback, holding the
  caller's key (from the task's arguments, never the agent's env) for the bearer the
  daemon made (so the daemon's redactor knows it); the CLI gets that bearer and the URL, and the namespace's door to the model API leads to it. TLS to the API
  starts there, on the node.
- `relay(ns)` before the fork, `spawned()` once the CLI runs (the child's fds are closed,
  the listeners taken over).
- `close()` after the group is killed ends what was opened in reverse order: the relay
  drains what the agent already sent (bounded, netns.DRAIN_S) through the key door,
  which then stops (its upstream connections closed).
"""

from __future__ import annotations

import threading
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, AsyncIterator, TypeVar

import trio

from ..engines.bearer_relay import serve_relay
from ..engines.key_door import KeyDoor
from ..launch.netns import Namespace, RelayScope, relaying
from ..launch.spec import ModelKey

T = TypeVar("T")


@asynccontextmanager
async def serving_key_door(model_key: ModelKey) -> AsyncIterator[tuple[str, str]]:
    """(its URL, the agent's bearer) while a key door holding this key for the bearer the
    daemon made serves on loopback."""
    door = KeyDoor()
    async with trio.open_nursery() as n:
        await n.start(serve_relay, door)
        agent = door.register(model_key.key, model_key.upstream, model_key.bearer)
        try:
            yield door.url, agent.bearer
        finally:
            door.unregister(agent)
            n.cancel_scope.cancel()


class NodeDoor:
    def __init__(self, key: str) -> None:
        self.key = key
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.Event | None = None
        self._held: list[tuple[trio.Event, trio.Event]] = []   # (release, done) per context, in entry order
        self._scope: RelayScope | None = None
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
            async with trio.open_nursery() as n:
                self._nursery = n
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
        finally:
            self._ready.set()          # never leaves __enter__ waiting

    def key_door(self, model_key: ModelKey) -> tuple[str, str]:
        """(URL, bearer) of the agent's key door, which lives until close()."""
        return self._hold(serving_key_door(model_key))

    def relay(self, ns: Namespace) -> None:
        """Before the fork: the relay of the namespace's doors, which lives until close()."""
        self._scope = self._hold(relaying(ns, self.key))

    def spawned(self) -> None:
        """The CLI runs: carry its connections (NamespaceError if its namespace failed)."""
        if self._scope is None:        # no namespace: the node's network
            return
        assert self._token is not None
        trio.from_thread.run(self._scope.start, trio_token=self._token)

    def _hold(self, cm: AbstractAsyncContextManager[T]) -> T:
        """Enter `cm` on the loop in a task of its own (a nursery must end in the task that
        opened it), which holds it until close(); what entering raises is raised here."""
        assert self._nursery is not None and self._token is not None

        async def holding(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            release, done = trio.Event(), trio.Event()
            try:
                async with cm as value:
                    task_status.started((value, release, done))
                    await release.wait()
            finally:
                done.set()

        value, release, done = trio.from_thread.run(self._nursery.start, holding, trio_token=self._token)
        self._held.append((release, done))
        return value

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            held, stop = self._held, self._stop

            async def release_all() -> None:
                for release, done in reversed(held):
                    release.set()
                    await done.wait()
                stop.set()
            try:
                trio.from_thread.run(release_all, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._token = None
        self._thread.join()
