"""A network namespace whose only open doors are listening sockets the daemon holds: the
pieces that make one (`unshare_net`, `lo_up`, `listen_all`), used in two ways.

- In the daemon (netns.py, when it may make network namespaces: root): on the spawning
  thread, just before the fork, so the child is born in it; the thread goes back after.
- As a helper, `python -I -S netns_init.py FD MODE ADDR... -- COMMAND...`, for a daemon
  that may not (not root: a threaded process can neither make a user namespace nor enter
  a network namespace without CAP_SYS_ADMIN): MODE "auto" tries a plain network namespace,
  then one inside a user namespace of its own that maps its uid to root (what anyone may
  do); "userns" goes straight to the second. It binds each ADDR, hands the listening
  sockets to the daemon over the inherited Unix socket FD (SCM_RIGHTS, in ADDR order, with
  "ok"), and execs COMMAND (bubblewrap), which inherits the namespace and none of the
  sockets. On a fault it sends "error: <why>" instead and exits 70.

Why before the sandbox: binding port 443 needs CAP_NET_BIND_SERVICE over the namespace,
which an agent (no capabilities, maybe not uid 0) lacks. ADDR is `127.0.0.2:443` or
`[::1]:8080`; a non-loopback IPv4 address is added to `lo` first (an alias, /32), since the
namespace has no other route. Standard library C modules only and no site, so the helper
starts in about the time of a bare interpreter; bubblewrap replaces it.
"""

from __future__ import annotations

import _socket
import fcntl
import os
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
        return _socket.AF_INET6, host[1:-1], int(port)
    return _socket.AF_INET, host, int(port)


def unshare_net(libc: object, mode: str) -> None:
    """Leave the caller's network namespace (the calling thread only, in a threaded
    process). mode "thread"/"auto": a plain one (needs CAP_SYS_ADMIN); "auto" then falls
    back, and "userns" goes straight, to one inside a new user namespace (single-threaded
    processes only)."""
    import ctypes
    if mode != "userns":
        if libc.unshare(CLONE_NEWNET) == 0:  # type: ignore[attr-defined]
            return
        if mode != "auto":
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:  # type: ignore[attr-defined]
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _ifreq(name: str, tail: bytes) -> bytes:
    return name.encode().ljust(16, b"\0") + tail.ljust(24, b"\0")


def _sockaddr_in(ip: str) -> bytes:
    return _socket.AF_INET.to_bytes(2, sys.byteorder) + b"\0\0" + _socket.inet_aton(ip)


def lo_up() -> None:
    ctl = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        flags = int.from_bytes(fcntl.ioctl(ctl.fileno(), SIOCGIFFLAGS, _ifreq("lo", b""))[16:18], sys.byteorder)
        fcntl.ioctl(ctl.fileno(), SIOCSIFFLAGS, _ifreq("lo", (flags | IFF_UP).to_bytes(2, sys.byteorder)))
    finally:
        ctl.close()


def listen_all(addrs: list[str]) -> list[int]:
    """Bring `lo` up and listen on each address; returns the sockets' fds (close-on-exec)."""
    lo_up()
    ctl = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    fds: list[int] = []
    try:
        aliases: list[str] = []
        for text in addrs:
            family, host, port = split_addr(text)
            if family == _socket.AF_INET and not host.startswith("127.") and host not in aliases:
                aliases.append(host)
                label = f"lo:{len(aliases)}"
                fcntl.ioctl(ctl.fileno(), SIOCSIFADDR, _ifreq(label, _sockaddr_in(host)))
                fcntl.ioctl(ctl.fileno(), SIOCSIFNETMASK, _ifreq(label, _sockaddr_in("255.255.255.255")))
            s = _socket.socket(family, _socket.SOCK_STREAM)
            try:
                s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                s.bind((host, port))
                s.listen(128)
            except BaseException:
                s.close()
                raise
            fds.append(s.detach())
        return fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        ctl.close()


def main(argv: list[str]) -> int:
    import ctypes
    fd, mode = int(argv[1]), argv[2]
    sep = argv.index("--")
    addrs, command = argv[3:sep], argv[sep + 1:]
    channel = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getppid()
    # Kept across the exec (bubblewrap is not setuid): the window before its own
    # --die-with-parent is covered too.
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != parent:
        return 70
    try:
        unshare_net(libc, mode)
        fds = listen_all(addrs)
    except (OSError, ValueError, OverflowError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        channel.sendmsg([f"error: {why}".encode()])
        return 70
    rights = b"".join(f.to_bytes(4, sys.byteorder, signed=True) for f in fds)
    channel.sendmsg([b"ok"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)] if fds else [])
    for f in fds:
        os.close(f)
    channel.close()
    os.execv(command[0], command)
    return 70   # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
