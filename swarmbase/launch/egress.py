"""An agent's network as an allow-list: which host:port it may reach, how that looks from
inside its network namespace, and the daemon-side relay that carries each connection out.

Design (issue 20; docs/decisions.md "Agents' network is an allow-list" has what was tried):
- Every agent gets a network namespace of its own holding only `lo`. For each allowed
  destination there is one listening socket in it (a "door"), made before the sandbox
  starts (launch/netns.py) and held by the daemon, which accepts on it from its event
  loop and connects to that one destination from the host's network. A door leads to one
  place, so the allow-list is checked by construction: there is nothing to parse, and
  nothing else listens inside. What the agent dials that has no door is refused by the
  kernel at once (loopback) or unreachable (no route): the dashboard, other loopback
  services, the LAN, the internet.
- Addresses inside: an IP literal keeps its own address and port (`127.0.0.1:<port>` for
  a loopback baseUrl or the codex meter, so the URL the CLI has works unchanged); a name
  gets an address of its own, 127.0.0.2, .3, …, written into the agent's /etc/hosts. TLS
  therefore runs end to end (the CLI sends its SNI and checks the real certificate; the
  relay sees bytes), and no proxy variable is needed, so every client inside — the CLI,
  curl, git, pip — takes the same path without being told.
- No DNS inside: names on the list resolve from the hosts file; any other name fails to
  resolve (the resolver's server is unreachable from the namespace) — a quick failure,
  never a wait. Hence entries are exact names, no wildcards.
- The relay runs on the daemon's event loop: ~165–200 MB/s through one door here against
  ~325–480 MB/s direct (bench/isolation.py); model APIs stream a few KB/s per agent, so
  nothing resident per agent is worth the copy it would save.
- A name is resolved by the relay once per connection, and every answer is checked: a
  name that resolves to a loopback, link-local or unspecified address, or to the cloud
  metadata address, is refused (issue 31 #4), so a listed name cannot be rebound to the
  daemon's host (its dashboard, its relays) or to the metadata service. The connection
  goes to the checked addresses, never to the name again. An IP literal on the list is
  explicit and is carried as written (`127.0.0.1:<port>` opens that port on purpose).
Pure functions apart from `Relay`.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from typing import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

import attrs
import trio

log = logging.getLogger("swarmbase.egress")

ANTHROPIC_API = "https://api.anthropic.com"      # where claude goes without a baseUrl
BARE_NAME_PORTS = (443, 80)                       # a `network` entry without a port
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*\.?")


@attrs.frozen
class Endpoint:
    host: str          # a name (lower case), an IPv4 or an IPv6 literal (no brackets)
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _host_error(host: str) -> str | None:
    ip = _ip(host)
    if ip is not None:
        if ip.version == 6 and not ip.is_loopback:
            return "an IPv6 address other than ::1 cannot be given to an agent; use a host name"
        return None
    if len(host) > 253 or not _NAME.fullmatch(host):
        return "not a host name"
    return None


def _refusal(parse: Callable[[str], object], text: str) -> str | None:
    try:
        parse(text)
    except ValueError as e:
        return str(e)
    return None


def entry_error(entry: str) -> str | None:
    """Why a `network` entry (`host` or `host:port`) is refused, or None."""
    return _refusal(endpoints, entry)


def endpoints(entry: str) -> tuple[Endpoint, ...]:
    """`host` → host:443 and host:80; `host:port`, `[::1]:port` → that one."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([^:\[\]/]+)(?::(\d{1,5}))?", entry)
    if not m:
        raise ValueError(f"{entry!r} is not host or host:port (no scheme, path or wildcard)")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    why = _host_error(host)
    if why:
        raise ValueError(f"{entry!r}: {why}")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"{entry!r}: the port must be between 1 and 65535")
    host = host.lower().rstrip(".")
    if port is not None:
        return (Endpoint(host, int(port)),)
    return tuple(Endpoint(host, p) for p in BARE_NAME_PORTS)


def url_error(url: str) -> str | None:
    """Why a base URL cannot be an agent's destination, or None."""
    return _refusal(url_endpoint, url)


def url_endpoint(url: str) -> Endpoint:
    """Where an http(s) base URL connects: its host and port (80/443 by scheme)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{url!r}: the port must be between 1 and 65535") from None
    why = _host_error(parts.hostname)
    if why:
        raise ValueError(f"{url!r}: {why}")
    return Endpoint(parts.hostname.lower().rstrip("."), port)


@attrs.frozen
class Door:
    inside: str        # the listening address in the agent's namespace: "127.0.0.2:443"
    to: Endpoint       # where a connection to it is carried


@attrs.frozen
class EgressPlan:
    doors: tuple[Door, ...]
    hosts: str         # the agent's /etc/hosts


# `localhost` is IPv4 only inside: its doors are on 127.0.0.1, and a client that tried ::1
# first would be refused there.
HOSTS_HEAD = "127.0.0.1\tlocalhost\n::1\tip6-localhost ip6-loopback\n"


def _loopback(k: int) -> str:
    return f"127.{(k >> 16) & 255}.{(k >> 8) & 255}.{k & 255}"


def plan(allowed: Sequence[Endpoint]) -> EgressPlan:
    """One door per destination; a name gets its own loopback address (127.0.0.2 up,
    skipping any literal on the list) and a line in the hosts file."""
    wanted = list(dict.fromkeys(allowed))
    literals = {ep.host for ep in wanted if _ip(ep.host) is not None}
    names: dict[str, str] = {"localhost": "127.0.0.1"}
    k = 1
    doors = []
    for ep in wanted:
        if ep.host not in literals and ep.host not in names:
            k += 1
            while _loopback(k) in literals:
                k += 1
            names[ep.host] = _loopback(k)
        ip = ep.host if ep.host in literals else names[ep.host]
        doors.append(Door(inside=f"[{ip}]:{ep.port}" if ":" in ip else f"{ip}:{ep.port}", to=ep))
    lines = "".join(f"{ip}\t{name}\n" for name, ip in names.items() if name != "localhost")
    return EgressPlan(doors=tuple(doors), hosts=HOSTS_HEAD + lines)


# ---------------------------------------------------------------------------
# Where a name may lead.

METADATA = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


def answer_refusal(addr: str) -> str | None:
    """Why a resolved address may not be a name's destination, or None."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])        # an IPv6 scope (fe80::1%eth0) is link-local anyway
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA:
        return "the cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_unspecified:
        return "the unspecified address (this host)"
    return None


class DestinationRefused(OSError):
    """A name resolved to an address no name may lead to."""


Resolve = Callable[[str, int], Awaitable[Sequence[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The host's addresses for a TCP connection, in the resolver's order."""
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def checked_addresses(to: Endpoint, resolve: Resolve) -> list[str]:
    """Where a connection to `to` may go: an IP literal as written; a name's answers, all
    of them checked (DestinationRefused if any is refused: a name that answers loopback
    among public addresses is being rebound, and the client would not pick for us)."""
    if _ip(to.host) is not None:
        return [to.host]
    answers = list(await resolve(to.host, to.port))
    if not answers:
        raise DestinationRefused(f"{to.host} has no address")
    for addr in answers:
        why = answer_refusal(addr)
        if why:
            raise DestinationRefused(f"{to.host} resolves to {addr}, {why}: refused (list an IP literal to mean it)")
    return answers


# ---------------------------------------------------------------------------
# The relay: the daemon's side of the doors.

Connect = Callable[[str, int], Awaitable[trio.abc.Stream]]


async def _copy(src: trio.abc.Stream, dst: trio.abc.Stream, pair: trio.CancelScope) -> None:
    """One direction; at its EOF the other side is half-closed (an HTTP client may send
    its request and shut down writing while it reads). A reset ends both directions."""
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
        if isinstance(dst, trio.abc.HalfCloseableStream):
            await dst.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pair.cancel()


class Relay:
    """Accepts on each door (listening sockets in door order) and carries every connection
    to that door's destination, both ways, half-closes included, in tasks of `nursery`.

    `drain()` ends it, once the process group is dead, like a network would: no new
    connections, and what the agent already sent is still delivered (a client that wrote
    and exited has its last bytes carried out, as the kernel would have flushed them),
    for at most `grace` seconds; answers have nobody left to read them and are cut, and so
    is a connection still connecting (its client is gone)."""

    def __init__(self, key: str, doors: Sequence[Door], connect: Connect = trio.open_tcp_stream,
                 resolver: Resolve = resolve) -> None:
        self.key = key
        self.doors = list(doors)
        self.connect = connect
        self.resolver = resolver
        self.carried = 0
        self.failed = 0
        self.refused = 0             # connections whose name resolved where no name may lead
        self.sending = 0             # connected, and the agent-to-destination half is not done
        self._accepting = trio.CancelScope()
        self._changed = trio.Event()

    def start(self, nursery: trio.Nursery, listeners: Sequence[socket.socket]) -> None:
        assert len(listeners) == len(self.doors)
        nursery.start_soon(self._accept_all, [trio.socket.from_stdlib_socket(s) for s in listeners], nursery)

    async def drain(self, grace: float) -> None:
        self._accepting.cancel()
        with trio.move_on_after(grace):
            while self.sending:
                await self._changed.wait()

    async def _accept_all(self, listeners: list[trio.socket.SocketType], nursery: trio.Nursery) -> None:
        try:
            with self._accepting:
                async with trio.open_nursery() as n:
                    for door, lsock in zip(self.doors, listeners, strict=False):
                        n.start_soon(self._accept, door, lsock, nursery)
        finally:
            for s in listeners:
                s.close()

    async def _accept(self, door: Door, lsock: trio.socket.SocketType, nursery: trio.Nursery) -> None:
        while True:
            try:
                conn, _ = await lsock.accept()
            except OSError as e:          # EMFILE and the like: this door waits, the others go on
                log.warning("agent %s: accept on %s failed: %s", self.key, door.inside, e)
                await trio.sleep(0.5)
                continue
            nursery.start_soon(self._carry, door, trio.SocketStream(conn))

    async def _open(self, to: Endpoint) -> trio.abc.Stream:
        """A connection to the first checked address that answers (resolved once, here)."""
        error: OSError | None = None
        for addr in await checked_addresses(to, self.resolver):
            try:
                return await self.connect(addr, to.port)
            except OSError as e:
                error = e
        assert error is not None
        raise error

    async def _carry(self, door: Door, inside: trio.SocketStream) -> None:
        done = True                  # until connected: a drain does not wait for a connect

        def sent() -> None:
            """Once per connection: its agent-to-destination half is over."""
            nonlocal done
            if not done:
                done = True
                self.sending -= 1
                self._changed.set()
                self._changed = trio.Event()

        async def upstream(outside: trio.abc.Stream, pair: trio.CancelScope) -> None:
            try:
                await _copy(inside, outside, pair)
            finally:
                sent()

        try:
            async with inside:
                try:
                    outside = await self._open(door.to)
                except DestinationRefused as e:
                    self.failed += 1
                    self.refused += 1
                    log.warning("agent %s: %s", self.key, e)
                    return
                except OSError as e:
                    self.failed += 1
                    log.info("agent %s: could not reach %s: %s", self.key, door.to, e)
                    return
                self.carried += 1
                self.sending += 1
                done = False
                async with outside:
                    async with trio.open_nursery() as pair:
                        pair.start_soon(upstream, outside, pair.cancel_scope)
                        pair.start_soon(_copy, outside, inside, pair.cancel_scope)
        finally:
            sent()
