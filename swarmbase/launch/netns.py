"""Starting a process in an allow-listed network namespace of its own: the fds it needs
(a Unix socket pair for handing over the doors, a memfd holding its /etc/hosts), the
netns_init.py prefix of its command line, and the relay around its life.

The socket pair is inherited, never a path: nothing needs to be bind-mounted, so the
child's uid, user namespace and mount view do not matter (an agent running as a non-root
uid in a user namespace gets the same doors), and no other process can connect to it.
Only netns_init holds the child's end, and it closes it before exec.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Sequence

import trio

from .egress import EgressPlan, Endpoint, Relay, plan

NETNS_INIT = str(Path(__file__).resolve().with_name("netns_init.py"))


class NamespaceError(OSError):
    """The namespace could not be made; the process was not started past netns_init."""


class Namespace:
    def __init__(self, allowed: Sequence[Endpoint], mode: str = "auto") -> None:
        self.plan: EgressPlan = plan(allowed)
        self.mode = mode
        self.channel, self._child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.hosts_fd = os.memfd_create("swarmbase-hosts")
        os.write(self.hosts_fd, self.plan.hosts.encode())
        os.lseek(self.hosts_fd, 0, os.SEEK_SET)

    @property
    def pass_fds(self) -> tuple[int, int]:
        return (self._child_end.fileno(), self.hosts_fd)

    def argv(self, command: Sequence[str]) -> list[str]:
        return [sys.executable, "-I", "-S", NETNS_INIT, str(self._child_end.fileno()), self.mode,
                *(d.inside for d in self.plan.doors), "--", *command]

    def close_child_fds(self) -> None:
        """After the fork: the child has its copies."""
        self._child_end.close()
        if self.hosts_fd >= 0:
            os.close(self.hosts_fd)
            self.hosts_fd = -1

    def close(self) -> None:
        self.close_child_fds()
        self.channel.close()

    async def doors(self) -> list[socket.socket]:
        """The listening sockets netns_init made, in door order."""
        self.channel.setblocking(False)
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self.channel, 4096, max(1, len(self.plan.doors)))
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.channel)
        listeners = [socket.socket(fileno=fd) for fd in fds]
        if msg != b"ok" or len(listeners) != len(self.plan.doors):
            for s in listeners:
                s.close()
            why = msg.decode(errors="replace").removeprefix("error: ") or "it exited before saying"
            raise NamespaceError(f"could not make the agent's network namespace: {why}")
        return listeners


@asynccontextmanager
async def relaying(ns: Namespace | None, key: str) -> AsyncIterator[Relay | None]:
    """Around a started process: receive its doors and carry their connections until the
    block ends. Without a namespace, nothing."""
    if ns is None:
        yield None
        return
    ns.close_child_fds()
    relay = Relay(key, ns.plan.doors, await ns.doors())
    async with trio.open_nursery() as n:
        n.start_soon(relay.serve)
        yield relay
        n.cancel_scope.cancel()
