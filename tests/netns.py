"""A network namespace holding only `lo`, for tests (and benches) that must not bind any
other interface: Ray binds `*:port` even with `--node-ip-address=127.0.0.1`.

The namespace is held by a small child process; processes are started inside it with
`nsenter --net=/proc/<holder>/ns/net`, and this process makes sockets inside it from a
short-lived thread that joined it (a socket keeps the namespace it was made in; the
namespace of a thread changes, the process's other threads stay where they are).
Closing it SIGKILLs every process that is still a member, found by namespace inode: the
exact set this harness started, whatever they forked or however they were reparented.
Needs root (CAP_SYS_ADMIN), like the rest of the suite's sandbox tests.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

CLONE_NEWNET = 0x40000000

# The holder: leave the parent's network namespace, bring `lo` up (SIOCSIFFLAGS, so no
# dependency on iproute2), say so, and live until its stdin closes.
HOLDER = r"""
import ctypes, fcntl, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x40000000) != 0:
    sys.exit("unshare(CLONE_NEWNET) failed: errno %d (run as root)" % ctypes.get_errno())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifr = struct.pack("16sH", b"lo", 0)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, ifr))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
print("ready", flush=True)
sys.stdin.read()
"""


def _ns_inode(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class NetNS:
    def __init__(self) -> None:
        self.holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.holder.stdout.readline() if self.holder.stdout else b""
        if line.strip() != b"ready":
            err = self.holder.stderr.read().decode() if self.holder.stderr else ""
            raise RuntimeError(f"could not make a network namespace: {err or line!r}")
        self.path = f"/proc/{self.holder.pid}/ns/net"
        self.inode = _ns_inode(self.holder.pid)
        self._fd = os.open(self.path, os.O_RDONLY)

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.argv(argv), **kw)

    def run_inside(self, fn: Callable[[], Any]) -> Any:
        """fn() on a fresh thread that joined the namespace; returns its result."""
        box: dict[str, Any] = {}

        def body() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(self._fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns failed")
                box["value"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e

        t = threading.Thread(target=body, name="netns-socket")
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def connect(self, host: str, port: int, timeout: float = 10.0) -> socket.socket:
        return self.run_inside(lambda: socket.create_connection((host, port), timeout=timeout))

    def listen(self, host: str = "127.0.0.1", port: int = 0) -> socket.socket:
        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(128)
            return s
        return self.run_inside(make)

    def members(self) -> list[int]:
        """Live processes in the namespace other than the holder."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != self.holder.pid and _ns_inode(d.name) == self.inode:
                try:
                    state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if state not in ("Z", "X"):
                    out.append(int(d.name))
        return out

    def kill_members(self, timeout: float = 10.0) -> None:
        """SIGKILL every process in the namespace (the holder excepted) until none is left."""
        deadline = time.monotonic() + timeout
        while (pids := self.members()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def close(self, timeout: float = 10.0) -> None:
        self.kill_members(timeout)
        os.close(self._fd)
        if self.holder.stdin:
            self.holder.stdin.close()
        try:
            self.holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()
        for pipe in (self.holder.stdout, self.holder.stderr):     # else a ResourceWarning later
            if pipe is not None:
                pipe.close()
