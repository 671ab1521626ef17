"""A stdio MCPL server that is SwarmBase: relays newline-delimited JSON-RPC on stdin/stdout
to the daemon's WebSocket and back.

Host builds that only spawn servers (agent-framework main before its WebSocket transport,
e.g. 58af1a24bd16 and 0329c03: `McplServerConfig` has `command`/`args`/`env` and no `url`)
connect through it: the host starts `python -m swarmbase.stdio_relay <caller>`, and each
line it writes goes to the daemon as one text frame; each frame the daemon sends is split
on newlines and written as lines (the framing both transports use). It holds no state of
its own, so a host that respawns it on reconnect gets a fresh MCPL session, as over a
WebSocket.

The token is never an argument (argv is world-readable in /proc): it is read from
`SWARMBASE_TOKEN` (the host config's `env`), `--token-file`, or the daemon's own token file
for the caller. When the daemon closes the connection, the close code and reason go to
stderr (hosts log a server's stderr) and the relay exits 1; end of stdin exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import quote

import trio
from trio_websocket import ConnectionClosed

from . import config
from .client import open_websocket

MAX_MESSAGE = 64 * 1024 * 1024


def lines_of(buf: bytes) -> tuple[list[bytes], bytes]:
    """The complete, non-blank lines in `buf`, and the unfinished rest."""
    *done, rest = buf.split(b"\n")
    return [ln.rstrip(b"\r") for ln in done if ln.strip()], rest


def frame_lines(message: str | bytes) -> list[bytes]:
    """A frame from the daemon as the lines a stdio host reads: one message per line."""
    text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
    return [ln.encode() + b"\n" for ln in text.split("\n") if ln.strip()]


def close_words(e: ConnectionClosed) -> str:
    r = e.reason
    if r is None:
        return "the connection closed"
    return f"close code {r.code}" + (f": {r.reason}" if r.reason else "")


async def relay(url: str, token: str, stdin: trio.abc.ReceiveStream, stdout: trio.abc.SendStream) -> int:
    """Relay until stdin ends (0) or the daemon closes the socket (1)."""
    host_gone = False
    async with open_websocket(f"{url}?token={quote(token, safe='')}", max_message_size=MAX_MESSAGE) as ws:
        async with trio.open_nursery() as n:
            async def upstream() -> None:
                nonlocal host_gone
                rest = b""
                try:
                    async for chunk in stdin:
                        done, rest = lines_of(rest + chunk)
                        for line in done:
                            await ws.send_message(line.decode("utf-8", "replace"))
                    if rest.strip():
                        await ws.send_message(rest.decode("utf-8", "replace"))
                except ConnectionClosed:
                    return                  # the reader below reports it
                host_gone = True
                await ws.aclose()           # the host is gone: end the session as a closed socket does

            n.start_soon(upstream)
            try:
                while True:
                    for line in frame_lines(await ws.get_message()):
                        await stdout.send_all(line)
            except ConnectionClosed as e:
                if not host_gone:
                    print(f"swarmbase.stdio_relay: the daemon ended the session ({close_words(e)})",
                          file=sys.stderr, flush=True)
            n.cancel_scope.cancel()
    return 0 if host_gone else 1


def find_token(args: argparse.Namespace, state_dir: Path | None) -> str:
    if env := os.environ.get("SWARMBASE_TOKEN", "").strip():
        return env
    path = Path(args.token_file) if args.token_file else (state_dir / f"mcpl-{args.caller}.token" if state_dir else None)
    if path is None:
        raise SystemExit("swarmbase.stdio_relay: no token: set SWARMBASE_TOKEN or --token-file")
    try:
        return path.read_text().strip()
    except OSError as e:
        raise SystemExit(f"swarmbase.stdio_relay: cannot read the token file {path}: {e.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swarmbase.stdio_relay",
                                description="SwarmBase as a stdio MCPL server: relays to the daemon's WebSocket")
    p.add_argument("caller", nargs="?", default="local", help="whose token file to read (default: local)")
    p.add_argument("--url", help="the daemon's MCPL WebSocket (default: ws://127.0.0.1:<config port>/mcpl)")
    p.add_argument("--token-file", help="a file holding the caller's token (default: SWARMBASE_TOKEN, "
                                        "else the daemon's <state>/mcpl-<caller>.token)")
    args = p.parse_args(argv)
    state_dir = None
    url = args.url
    if url is None or (not args.token_file and not os.environ.get("SWARMBASE_TOKEN")):
        try:
            cfg = config.load(config.config_path())
        except config.ConfigError as e:
            print(f"swarmbase.stdio_relay: bad config: {e}", file=sys.stderr)
            return 2
        state_dir = cfg.state_dir
        url = url or f"ws://127.0.0.1:{cfg.port}/mcpl"
    token = find_token(args, state_dir)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    try:
        return trio.run(relay, url, token, stdin, stdout)
    except OSError as e:
        print(f"swarmbase.stdio_relay: cannot reach the daemon at {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
