"""A minimal MCPL host, for people and tests.

    python -m swarmbase.client <caller> <tool> '<json>' [--wait]

Reads the caller's token from <state dir>/mcpl-<caller>.token, plays the MCPL 0.5 host
sequence (initialize id 0 → notifications/initialized → featureSets/update → tools/call)
and prints the tool result's text (what a host shows its model: the guide as text, other
results as JSON). Without --wait it selects only the tools set, so the daemon pushes it no
notices and the caller's queued ones stay queued for its real host. With --wait it also
selects swarmbase.notify and stays connected until the end notice of the run it started
(or named by runId) arrives, printing every notice it accepts meanwhile.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket_url

from . import config
from .client_progress import Output, OutputClosed, printable, watch


class ConnectionLost(ConnectionError):
    """The connection closed while a request waited for its answer."""

    def __init__(self, closed: ConnectionClosed | None) -> None:
        super().__init__("the server closed the connection")
        self.closed = closed


class RpcFailure(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        # Printed to the user's terminal; the message may quote what a script wrote.
        super().__init__(printable(f"{error.get('code')}: {error.get('message')}", one_line=True))
        self.error = error
        self.code = error.get("code")


def accept_all(params: dict[str, Any]) -> dict[str, Any]:
    return {"result": {"accepted": True, "inferenceId": f"swarmbase-client-{params.get('eventId')}"}}


class HostClient:
    """One host connection. `push_answer(params)` returns (or, async, resolves to)
    {"result": …} or {"error": …}; while it is awaited the connection reads nothing else."""

    def __init__(self, ws: WebSocketConnection,
                 push_answer: Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]] = accept_all):
        self.ws = ws
        self.push_answer = push_answer
        self._next = 0
        self._waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.notices_send, self.notices = trio.open_memory_channel[dict[str, Any]](10_000)
        self.seen: dict[str, dict[str, Any]] = {}     # every accepted notice by eventId
        self._new_notice = trio.Event()
        self.closed: ConnectionClosed | None = None
        self.closed_event = trio.Event()

    async def _reader(self) -> None:
        try:
            while True:
                text = await self.ws.get_message()
                for line in (text if isinstance(text, str) else text.decode()).split("\n"):
                    if line.strip():
                        await self._on_message(json.loads(line))
        except ConnectionClosed as e:
            self.closed = e
        finally:
            self.closed_event.set()
            for ch in self._waiting.values():
                ch.close()

    async def _on_message(self, msg: dict[str, Any]) -> None:
        if "method" in msg and "id" in msg:
            if msg["method"] == "push/event":
                answer = self.push_answer(msg["params"])
                if inspect.isawaitable(answer):     # a host that takes its time (tests hold answers)
                    answer = await answer
                await self.ws.send_message(json.dumps({"jsonrpc": "2.0", "id": msg["id"], **answer}))
                if "result" in answer and (answer["result"].get("accepted") or answer["result"].get("reason") == "duplicate"):
                    self.notices_send.send_nowait(msg["params"])
                    self.seen[msg["params"].get("eventId")] = msg["params"]
                    self._new_notice.set()
                    self._new_notice = trio.Event()
            else:
                await self.ws.send_message(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                                       "error": {"code": -32601, "message": "method not found"}}))
        elif "id" in msg:
            ch = self._waiting.pop(msg["id"], None)
            if ch is not None:
                ch.send_nowait(msg)

    async def request(self, method: str, params: Any = None, *, raw: bool = False) -> Any:
        rid = self._next
        self._next += 1
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[rid] = send
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        await self.ws.send_message(json.dumps(msg))
        try:
            resp = await recv.receive()
        except trio.EndOfChannel:
            raise ConnectionLost(self.closed) from None
        if raw:
            return resp
        if "error" in resp:
            raise RpcFailure(resp["error"])
        return resp["result"]

    async def notify(self, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self.ws.send_message(json.dumps(msg))

    async def handshake(self, mcpl_version: str | None = "0.5", grant: bool = True,
                        client_name: str = "swarmbase-client", notices: bool = True,
                        own_runs_only: bool = False) -> dict[str, Any]:
        """`notices=False` selects the tools set only: nothing is pushed to this host.
        `own_runs_only`: only the notices of runs started from this connection (the
        daemon leaves the caller's other notices to its other sessions)."""
        sets = ["swarmbase", "swarmbase.notify"] if notices else ["swarmbase"]
        caps: dict[str, Any] = {}
        if mcpl_version is not None:
            caps = {"experimental": {"mcpl": {"version": mcpl_version, "pushEvents": True, "featureSets": True}}}
            if own_runs_only:
                caps["experimental"]["swarmbase"] = {"notices": "ownRuns"}
        init = await self.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": caps,
                                                 "clientInfo": {"name": client_name, "version": "1"}})
        await self.notify("notifications/initialized")
        if mcpl_version is not None and grant:
            if tuple(int(p) for p in mcpl_version.split(".")) >= (0, 5):
                self.receipt = await self.request("featureSets/update", {
                    "effectiveCapabilities": ["pushEvents", "tools"] if notices else ["tools"],
                    "deniedCapabilities": [], "enabled": sets, "disabled": []})
            else:
                await self.notify("featureSets/update", {"enabled": sets})
        return init

    async def tool(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments or {}})

    async def wait_notice(self, event_id: str) -> dict[str, Any]:
        """The notice with this eventId, whenever it arrived (the channel is left alone)."""
        while event_id not in self.seen:
            if self.closed_event.is_set():
                raise ConnectionError("connection closed before the notice arrived")
            await self._new_notice.wait()
        return self.seen[event_id]


def result_text(result: dict[str, Any]) -> str:
    """A tools/call result as a person reads it: its text blocks (the guide is text, the
    other tools' text is their JSON)."""
    texts = [b["text"] for b in result.get("content") or [] if isinstance(b, dict) and b.get("type") == "text"]
    if texts:
        return "\n".join(texts).rstrip("\n")
    return json.dumps(result.get("structuredContent", result), indent=1, ensure_ascii=False)


@asynccontextmanager
async def connect(url: str, token: str | None, **kw: Any) -> AsyncIterator[HostClient]:
    full = f"{url}?token={token}" if token is not None else url
    async with open_websocket(full, max_message_size=64 * 1024 * 1024) as ws:
        client = HostClient(ws, **kw)
        async with trio.open_nursery() as n:
            n.start_soon(client._reader)
            try:
                yield client
            finally:
                n.cancel_scope.cancel()


@asynccontextmanager
async def open_websocket(url: str, **kw: Any) -> AsyncIterator[WebSocketConnection]:
    """trio-websocket's open_websocket_url, whose TCP connection is closed however the
    WebSocket ended: 0.12 leaves it open when the other side closed first (its aclose
    returns early once a close reason is set), for the garbage collector to find."""
    ws = None
    try:
        async with open_websocket_url(url, **kw) as ws:
            yield ws
    finally:
        if ws is not None:
            with trio.CancelScope(shield=True):
                await ws._stream.aclose()


async def _main(args: argparse.Namespace) -> int:
    path = config.config_path()
    cfg = config.load(path)
    token_path = cfg.state_dir / f"mcpl-{args.caller}.token"
    try:
        token = token_path.read_text().strip()
    except OSError as e:
        print(f"swarmbase.client: cannot read {token_path}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        arguments = json.loads(args.json) if args.json else {}
    except ValueError as e:
        print(f"swarmbase.client: the arguments are not valid JSON: {e}", file=sys.stderr)
        return 2
    url = f"ws://127.0.0.1:{cfg.port}/mcpl"
    out = Output(sys.stdout)
    async with connect(url, token) as host:
        # A one-shot call must not take (and acknowledge) notices queued for the caller's
        # host, and `--wait` takes only its own run's: this connection sits beside the
        # caller's resident host, which keeps its session (and every other notice).
        await host.handshake(notices=args.wait, own_runs_only=True)
        try:
            result = await host.tool(args.tool, arguments)
        except RpcFailure as e:
            print(f"swarmbase.client: {e}", file=sys.stderr)
            return 1
        out.print(result_text(result))
        if result.get("isError"):
            return 1
        if args.wait:
            run_id = (result.get("structuredContent") or {}).get("runId") or arguments.get("runId")
            if not run_id:
                print("swarmbase.client: --wait needs a tool that names a run", file=sys.stderr)
                return 2
            args.waiting_for = run_id

            async def status() -> dict[str, Any] | None:
                try:
                    res = await host.tool("status", {"runId": run_id, "logLines": 0})
                except RpcFailure:
                    return None
                return res.get("structuredContent")
            await watch(status, host.notices, run_id, out)
    return 0


def _find(e: BaseException, kinds: Any) -> BaseException | None:
    """The first exception of `kinds` in `e`, looking inside exception groups."""
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = _find(sub, kinds)
            if found is not None:
                return found
        return None
    return e if isinstance(e, kinds) else None


def _close_reason(e: BaseException) -> str:
    closed = e.closed if isinstance(e, ConnectionLost) else e
    reason = closed.reason if isinstance(closed, ConnectionClosed) else None
    if reason is None:
        return "it closed"
    code = getattr(reason, "code", None)
    said = getattr(reason, "reason", None)
    if said:
        # The daemon says why (a rotated token, a removed caller, too many sessions): its
        # words, not the code's class ("private reserved" for every 4000-4999 code).
        return f"close code {code}: {printable(str(said), one_line=True)}"
    name = str(getattr(reason, "name", "") or "").replace("_", " ").lower()
    return f"close code {code}" + (f", {name}" if name else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swarmbase.client", description="A minimal MCPL host for SwarmBase")
    p.add_argument("caller")
    p.add_argument("tool")
    p.add_argument("json", nargs="?", default="{}")
    p.add_argument("--wait", action="store_true", help="stay connected until the run's end notice arrives")
    args = p.parse_args(argv)
    try:
        return trio.run(_main, args)
    except BaseException as e:
        # The reader of our output went away (`... | head`): stop quietly, like other
        # tools cut off by a closed pipe (128 + SIGPIPE).
        if _find(e, (OutputClosed, BrokenPipeError)) is not None:
            return 141
        if (err := _find(e, config.ConfigError)) is not None:
            print(f"swarmbase.client: bad config: {err}", file=sys.stderr)
            return 2
        if (closed := _find(e, (ConnectionClosed, ConnectionLost))) is not None:
            # The daemon died or stopped under us: one line, never a traceback.
            if sys.stdout.isatty():
                print(file=sys.stdout, flush=True)        # end the progress line first
            waiting = getattr(args, "waiting_for", None)
            print(f"swarmbase.client: lost the connection to the daemon ({_close_reason(closed)})"
                  + (f" while waiting for {waiting}; its end notice stays queued for this caller" if waiting else ""),
                  file=sys.stderr)
            return 1
        if (err := _find(e, (OSError, ConnectionError))) is not None:
            print(f"swarmbase.client: cannot reach the daemon: {err}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
