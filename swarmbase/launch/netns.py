"""Starting a process in an allow-listed network namespace of its own, and the relay
around its life. Two ways to make the namespace (netns_init.py has the pieces):

- "thread" (a daemon that may make network namespaces: root). On the spawning thread,
  around the fork: the thread leaves for a new namespace, brings `lo` up, listens on the
  doors, forks the child (born there), and goes back. The daemon holds the listeners from
  the start; nothing extra runs. Cost: what bubblewrap's own --unshare-net costs (one
  namespace; measured within noise of a start on the host's network, median of 50).
- "helper" (anyone else) and "userns" (the same, always with a user namespace; tests):
  the command is prefixed with `python -I -S netns_init.py`, which makes the namespace,
  hands the listeners over an inherited Unix socket pair, then execs bubblewrap. Costs an
  interpreter start: +50 to +65 ms a process here (bench/isolation.py, loaded 2 cores).

Either way the child's /etc/hosts comes from a memfd (bubblewrap's --ro-bind-data), and
nothing is passed by path: no socket file to bind-mount, so the child's uid, user
namespace and mount view do not matter (an agent running as a non-root uid in a user
namespace gets the same doors), and no other process can connect to the pair.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import AsyncIterator, Iterator, Sequence

import trio

from . import netns_init
from .egress import EgressPlan, Endpoint, Relay, plan

DRAIN_S = 5.0          # what a dead agent's open connections get to deliver what it sent
NETNS_INIT = str(Path(__file__).resolve().with_name("netns_init.py"))
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(OSError):
    """The namespace could not be made; the process was not started past netns_init."""


def _thread_ns() -> int:
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def _back_to(host: int) -> None:
    if _libc.setns(host, netns_init.CLONE_NEWNET) != 0:
        # Never seen; if it were, every later child would start in this namespace.
        raise SystemError(f"the spawning thread could not return to the daemon's network namespace: "
                          f"{os.strerror(ctypes.get_errno())}")


def thread_can_unshare() -> bool:
    """Whether this thread may make a network namespace (run on the spawning thread once)."""
    host = _thread_ns()
    try:
        if _libc.unshare(netns_init.CLONE_NEWNET) != 0:
            return False
        _back_to(host)
        return True
    finally:
        os.close(host)


class Namespace:
    def __init__(self, allowed: Sequence[Endpoint], kind: str) -> None:
        assert kind in ("thread", "helper", "userns")
        self.plan: EgressPlan = plan(allowed)
        self.kind = kind
        self.listeners: list[socket.socket] = []
        self.channel: socket.socket | None = None
        self._child_end: socket.socket | None = None
        if kind != "thread":
            self.channel, self._child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.hosts_fd = os.memfd_create("swarmbase-hosts")
        os.write(self.hosts_fd, self.plan.hosts.encode())
        os.lseek(self.hosts_fd, 0, os.SEEK_SET)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return (self.hosts_fd,) + ((self._child_end.fileno(),) if self._child_end else ())

    def argv(self, command: Sequence[str]) -> list[str]:
        if self._child_end is None:
            return list(command)
        mode = "userns" if self.kind == "userns" else "auto"
        return [sys.executable, "-I", "-S", NETNS_INIT, str(self._child_end.fileno()), mode,
                *(d.inside for d in self.plan.doors), "--", *command]

    @contextmanager
    def around_fork(self) -> Iterator[None]:
        """On the spawning thread ("thread" only): the fork inside happens in the new namespace."""
        if self.kind != "thread":
            yield
            return
        host = _thread_ns()
        try:
            try:
                netns_init.unshare_net(_libc, "thread")
                fds = netns_init.listen_all([d.inside for d in self.plan.doors])
            except OSError as e:
                raise NamespaceError(e.errno, f"could not make the agent's network namespace: {e.strerror or e}") from None
            self.listeners = [socket.socket(fileno=fd) for fd in fds]
            yield
        finally:
            _back_to(host)          # only the fork stays in the namespace, whatever happened
            os.close(host)

    def close_child_fds(self) -> None:
        """After the fork: the child has its copies."""
        if self._child_end is not None:
            self._child_end.close()
        if self.hosts_fd >= 0:
            os.close(self.hosts_fd)
            self.hosts_fd = -1

    def close(self) -> None:
        self.close_child_fds()
        if self.channel is not None:
            self.channel.close()
        for s in self.listeners:
            s.close()

    async def doors(self) -> list[socket.socket]:
        """The listening sockets, in door order (from netns_init, for a helper)."""
        if self.channel is None:
            return self.listeners
        self.channel.setblocking(False)
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self.channel, 4096, max(1, len(self.plan.doors)))
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.channel)
        self.listeners = [socket.socket(fileno=fd) for fd in fds]
        if msg != b"ok" or len(self.listeners) != len(self.plan.doors):
            why = msg.decode(errors="replace").removeprefix("error: ") or "it exited before saying"
            raise NamespaceError(f"could not make the agent's network namespace: {why}")
        return self.listeners


class RelayScope:
    """The relay of one process: `start()` once the process is spawned (its doors are then
    known); it drains after the block that opened it, which holds the process group, has
    killed the group."""

    def __init__(self, ns: Namespace | None, key: str, nursery: trio.Nursery | None) -> None:
        self.ns = ns
        self.relay = Relay(key, ns.plan.doors) if ns else None
        self._nursery = nursery

    async def start(self) -> None:
        if self.ns is None or self.relay is None or self._nursery is None:
            return
        self.ns.close_child_fds()
        listeners = await self.ns.doors()
        self.ns.listeners = []                # the relay owns (and closes) them now
        self.relay.start(self._nursery, listeners)


@asynccontextmanager
async def relaying(ns: Namespace | None, key: str) -> AsyncIterator[RelayScope]:
    """Open before the process starts; without a namespace, a scope that does nothing.
    What the block raises comes out as itself, not inside an exception group (the relay's
    nursery would wrap it, and callers catch OSError from a launch)."""
    if ns is None:
        yield RelayScope(None, key, None)
        return
    try:
        async with trio.open_nursery() as n:
            scope = RelayScope(ns, key, n)
            try:
                yield scope
            finally:
                if scope.relay is not None:
                    with trio.CancelScope(shield=True):
                        await scope.relay.drain(DRAIN_S)
                n.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
