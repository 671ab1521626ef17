"""Run as `python -I -S netns_init.py FD MODE ADDR... -- COMMAND...`, before bubblewrap:
give COMMAND a network namespace of its own whose only open doors are listening sockets
the daemon holds.

It leaves the daemon's network namespace (MODE "auto": a plain new netns when it may, else
a user namespace too, mapping its own uid to root there, which is what a daemon that is
not root can do; "userns" forces the second), brings `lo` up, binds and listens on each
ADDR (`127.0.0.2:443`, `[::1]:8080`; a non-loopback IPv4 address is first added to `lo`),
hands the listening sockets to the daemon over the Unix socket FD (SCM_RIGHTS, in ADDR
order, with "ok"), and execs COMMAND, which inherits the namespace and none of the
sockets. On any fault it sends "error: <why>" instead and exits 70.

Why here and not inside the sandbox: binding port 443 needs CAP_NET_BIND_SERVICE over the
namespace, which an agent (no capabilities, maybe not uid 0) lacks; this runs before
bubblewrap drops them. Why a process at all: a daemon that is not root cannot enter a new
network namespace (setns needs CAP_SYS_ADMIN in its own user namespace, and a threaded
process cannot make a user namespace). Standard library only, no site: it starts in
~12 ms and is replaced by bubblewrap, so nothing of it stays resident.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, SIOCSIFNETMASK = 0x8913, 0x8914, 0x8916, 0x891C
IFF_UP = 0x1


def split_addr(text: str) -> tuple[int, str, int]:
    """`127.0.0.2:443` / `[::1]:443` -> (family, host, port)."""
    host, _, port = text.rpartition(":")
    if host.startswith("["):
        return socket.AF_INET6, host[1:-1], int(port)
    return socket.AF_INET, host, int(port)


def _unshare(libc: ctypes.CDLL, mode: str) -> None:
    if mode == "auto" and libc.unshare(CLONE_NEWNET) == 0:
        return
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _ifreq(name: str, tail: bytes) -> bytes:
    return struct.pack("16s", name.encode()) + tail.ljust(24, b"\0")


def _sockaddr_in(ip: str) -> bytes:
    return struct.pack("=H2s4s", socket.AF_INET, b"\0\0", socket.inet_aton(ip))


def _lo_up(ctl: socket.socket) -> None:
    flags = struct.unpack("16sH", fcntl.ioctl(ctl, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0))[:18])[1]
    fcntl.ioctl(ctl, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def _add_to_lo(ctl: socket.socket, ip: str, label: str) -> None:
    """An alias `lo:N` holding `ip`/32, so a listener can bind it and connects to it stay
    local (the namespace has no other route)."""
    fcntl.ioctl(ctl, SIOCSIFADDR, _ifreq(label, _sockaddr_in(ip)))
    fcntl.ioctl(ctl, SIOCSIFNETMASK, _ifreq(label, _sockaddr_in("255.255.255.255")))


def listen_all(addrs: list[str]) -> list[socket.socket]:
    ctl = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        _lo_up(ctl)
        aliases: dict[str, None] = {}
        out = []
        for text in addrs:
            family, host, port = split_addr(text)
            if family == socket.AF_INET and not host.startswith("127.") and host not in aliases:
                aliases[host] = None
                _add_to_lo(ctl, host, f"lo:{len(aliases)}")
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(128)
            out.append(s)
        return out
    finally:
        ctl.close()


def main(argv: list[str]) -> int:
    fd, mode = int(argv[1]), argv[2]
    sep = argv.index("--")
    addrs, command = argv[3:sep], argv[sep + 1:]
    channel = socket.socket(fileno=fd)
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    # Kept across the exec (bubblewrap is not setuid): the window before its own
    # --die-with-parent is covered too.
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != parent:
        return 70
    try:
        _unshare(libc, mode)
        listeners = listen_all(addrs)
    except OSError as e:
        channel.sendmsg([f"error: {e.strerror or e}{f' ({e.filename})' if e.filename else ''}".encode()])
        return 70
    fds = array.array("i", [s.fileno() for s in listeners])
    channel.sendmsg([b"ok"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())] if listeners else [])
    for s in listeners:
        s.close()
    channel.close()
    os.execv(command[0], command)
    return 70   # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
