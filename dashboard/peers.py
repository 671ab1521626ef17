"""Who a dashboard viewer is, for sharing live streams fairly: only what a viewer cannot
forge.

The daemon listens on loopback, so every viewer's peer is a loopback address: local
processes and, through `tailscale serve`, the whole tailnet. Headers prove nothing there
(any local process can send `Tailscale-User-Login`, `X-Forwarded-For` and the tailnet
Host), and the address proves little (a local process may connect from any of
127.0.0.0/8). Keyed on the login header, 256 streams with distinct forged logins filled
the daemon and every real viewer got 503; keyed on the address, 16 idle streams gave
every other loopback viewer 429.

So a viewer's key is a path, most trusted first, and streams are shared level by level
(dashboard/admission.py):
1. the local account behind the connection, as the kernel reports it for the peer's
   socket (sock_diag, ~12 µs a lookup; on loopback only, Linux only, else "loopback"):
   tailscaled's account carries the tailnet, every other account is its own source;
2. the peer address;
3. whether the request came through the tailnet proxy: from loopback, for the host of
   `publicUrl`, with the `X-Forwarded-For` of a tailnet address (100.64.0.0/10,
   fd7a:115c:a1e0::/48) that `tailscale serve` always sets, and a login. A process that
   forges all of that is only ever sharing its own account's streams;
4. the tailnet login, for proxied requests only.
A process of the daemon's own account could still crowd the daemon's own account's
viewers; that account can read the state dir anyway (the spec's stated limit), and agents
do not reach loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Any, Callable

LOOPBACK_PEERS = ("127.", "::1", "::ffff:127.")
TAILNET = (ipaddress.ip_network("100.64.0.0/10"), ipaddress.ip_network("fd7a:115c:a1e0::/48"))

# sock_diag (linux/inet_diag.h): look up one TCP socket by its 4-tuple.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_ESTABLISHED = 1 << 1


def _addr16(family: int, host: str) -> bytes:
    return socket.inet_pton(family, host).ljust(16, b"\0")


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the socket at the other end of a loopback TCP connection (the peer's
    own socket: source `peer`, destination `local`), or None when the kernel does not say."""
    try:
        host = peer[0][7:] if peer[0].startswith("::ffff:") else peer[0]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        here = local[0][7:] if local[0].startswith("::ffff:") and family == socket.AF_INET else local[0]
        sockid = struct.pack("!HH16s16s", peer[1], local[1], _addr16(family, host), _addr16(family, here))
        sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
        req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _ESTABLISHED) + sockid
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(struct.pack("=IHHII", 16 + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req)
            data = nl.recv(8192)
        _, kind = struct.unpack_from("=IH", data)
        if kind != _SOCK_DIAG_BY_FAMILY or len(data) < 16 + 72 + 8:
            return None
        # inet_diag_msg: 4 bytes, the sockid (48), expires, rqueue, wqueue, then uid.
        return int(struct.unpack_from("=I", data, 16 + 4 + 48 + 12)[0])
    except (OSError, ValueError, struct.error, AttributeError):   # no netlink (macOS), no diag module, gone
        return None


def header(scope: dict[str, Any], name: bytes) -> str | None:
    for k, v in scope.get("headers") or ():
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _host_name(host: str) -> str:
    h = host.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def _tailnet_address(value: str | None) -> bool:
    if not value:
        return False
    try:
        addr = ipaddress.ip_address(value.split(",")[-1].strip())    # the proxy's own entry is last
    except ValueError:
        return False
    return any(addr in net for net in TAILNET)


def through_tailnet_proxy(scope: dict[str, Any], proxy_host: str | None) -> bool:
    """What `tailscale serve` sends for a tailnet user: see the module docstring."""
    peer = (scope.get("client") or ("", 0))[0] or ""
    return bool(proxy_host and peer.startswith(LOOPBACK_PEERS)
                and _host_name(header(scope, b"host") or "") == proxy_host
                and _tailnet_address(header(scope, b"x-forwarded-for"))
                and header(scope, b"tailscale-user-login"))


def viewer_key(scope: dict[str, Any], proxy_host: str | None,
               uid_of: Callable[[tuple[str, int], tuple[str, int]], int | None] = peer_uid) -> tuple[str, ...]:
    """(account, address, route, login) of the viewer behind an ASGI `scope`."""
    client = scope.get("client") or ("?", 0)
    peer = client[0] or "?"
    if peer.startswith(LOOPBACK_PEERS):
        server = scope.get("server") or ("127.0.0.1", 0)
        uid = uid_of((peer, int(client[1])), (server[0], int(server[1] or 0)))
        account = f"uid {uid}" if uid is not None else "loopback"
    else:
        account = peer
    if through_tailnet_proxy(scope, proxy_host):
        return (account, peer, "tailnet", (header(scope, b"tailscale-user-login") or "")[:200])
    return (account, peer, "direct", "")
