"""Loopback sockets for tests: a port nothing listens on yet, a listener, a tiny server."""

from __future__ import annotations

import socket

import trio


def free_port() -> int:
    """A port that was free a moment ago (for a daemon that must be started on a fixed port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve_hello(lsock: socket.socket, word: bytes) -> None:
    """Answer every connection to `lsock` with `word`, until cancelled; then close it
    (it is the server's: a listener left to the garbage collector is a ResourceWarning)."""
    with trio.socket.from_stdlib_socket(lsock) as s:
        while True:
            conn, _ = await s.accept()
            with conn:
                await conn.recv(4096)
                await conn.send(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(word), word))


def listener() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]
