"""What `python -m swarmbase.client ... --wait` shows while it waits: one progress line
(agents done/total, spend against budget, phase) rewritten in place on a terminal, one line
per change otherwise; and an output that ends the client quietly when its reader goes
away (`... | head`).

Phase titles, log lines, labels, results and errors are written by scripts and agents,
so nothing reaches the terminal as it came: control characters (C0 but tab and newline,
DEL, C1 — terminal escapes among them, which can retitle a window, move the cursor or
rewrite what was shown) and the bidirectional overrides that reorder a line are shown as
U+FFFD, and a progress line is one line. The client's own escapes are added after that.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, AsyncIterable, Awaitable, Callable, TextIO

import trio

from .money import usd


_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile("[\t\n]")


def printable(text: str, one_line: bool = False) -> str:
    """`text` with every control character shown as U+FFFD (tab and newline kept, or made
    spaces when `one_line`)."""
    if one_line:
        text = _LINE_BREAKS.sub(" ", text)
    return _CONTROLS.sub("\ufffd", text)


def progress_line(st: dict[str, Any]) -> str:
    """One line from a `status` result. Fields the daemon may not send yet are optional."""
    agents = st.get("agents") or {}
    parts = [f"{st.get('runId', '?')} {st.get('status', '?')}"]
    line = f"agents {agents.get('done', 0)}/{agents.get('total', 0)} done"
    if agents.get("running"):
        line += f" ({agents['running']} running)"
    parts.append(line)
    spend = usd(st.get('spentUsd'))
    if st.get("spentEstimated"):
        spend += " (est.)"
    reserved = float(st.get("reservedUsd") or 0)
    if reserved:
        spend += f" + {usd(reserved)} reserved"
    parts.append(f"{spend} of {usd(st.get('budgetUsd'))}")
    phases = st.get("phases") or []
    if phases and isinstance(phases[-1], dict) and phases[-1].get("title"):
        parts.append(f"phase: {phases[-1]['title']}")
    return " · ".join(parts)


class OutputClosed(Exception):
    pass


class Output:
    """stdout for the client. A closed reader (EPIPE) raises OutputClosed once, after
    pointing stdout at /dev/null so the interpreter's last flush cannot fail too."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.closed = False
        self._line = ""          # the progress line currently shown (tty) or last printed

    def _write(self, text: str) -> None:
        if self.closed:
            raise OutputClosed()
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            self.closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
            raise OutputClosed() from None

    def print(self, text: str) -> None:
        """A whole block of output; on a terminal the progress line stays below it."""
        text = printable(text)
        if self.tty and self._line:
            self._write("\r\x1b[K" + text + "\n" + self._fit(self._line))
        else:
            self._write(text + "\n")

    def progress(self, line: str) -> None:
        line = printable(line, one_line=True)
        if line == self._line:
            return
        self._line = line
        if self.tty:
            self._write("\r\x1b[K" + self._fit(line))
        else:
            self._write(line + "\n")

    def finish(self) -> None:
        if self.tty and self._line:
            self._write("\n")
            self._line = ""

    def _fit(self, line: str) -> str:
        width = shutil.get_terminal_size((100, 24)).columns
        return line if len(line) < width else line[: max(10, width - 2)] + "…"


def shown_notice(params: dict[str, Any]) -> str:
    """A notice as a person reads it: its fields as JSON, then its text blocks as text (a
    result framed as data shows as the fenced block it is, not as an escaped string)."""
    head = {k: v for k, v in params.items() if k != "payload"}
    payload = params.get("payload")
    content = payload.get("content") if isinstance(payload, dict) else None
    texts = [b["text"] for b in content or [] if isinstance(b, dict) and isinstance(b.get("text"), str)]
    if not texts:
        return json.dumps(params, indent=1)
    return json.dumps(head, indent=1) + "".join("\n" + t for t in texts)


POLL_S = 1.0
NOTICE_GRACE_S = 10.0


async def watch(status: Callable[[], Awaitable[dict[str, Any] | None]],
                notices: AsyncIterable[dict[str, Any]], run_id: str, out: Output) -> None:
    """Show progress (from `status()`, every POLL_S) until the run's end notice arrives,
    printing every notice accepted meanwhile. If the run has ended but its notice does not
    come within NOTICE_GRACE_S (say the host's notices are held), stop anyway."""
    end_id = f"{run_id}:end"
    ended = trio.Event()

    async def show() -> None:
        st = await status()
        if st and st.get("runId"):
            out.progress(progress_line(st))
            if st.get("status") in TERMINAL:
                ended.set()

    async def poll() -> None:
        while True:
            await show()
            await trio.sleep(POLL_S)

    async def grace() -> None:
        await ended.wait()
        await trio.sleep(NOTICE_GRACE_S)
        n.cancel_scope.cancel()

    async with trio.open_nursery() as n:
        n.start_soon(poll)
        n.start_soon(grace)
        async for params in notices:
            out.print(shown_notice(params))
            if params.get("eventId") == end_id:
                break
        n.cancel_scope.cancel()
    await show()            # the final state, not the last poll's
    out.finish()


TERMINAL = ("completed", "failed", "cancelled", "interrupted")
