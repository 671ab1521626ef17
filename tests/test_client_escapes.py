"""`python -m swarmbase.client ... --wait` on a pseudo-terminal, against the real daemon
process, for a run whose phase title, log lines, label and result carry terminal escapes:
none of them reaches the terminal; only the client's own line rewrite does."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import trio

from swarmbase.client_progress import printable

from .clidaemon import cli_daemon
from .conftest import pty_env, write_config
from .sockets import free_port

# A window title (OSC, ended by BEL), clear screen (CSI), an 8-bit CSI (C1), a bare CR,
# and a bidi override: each would act on the user's terminal.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\rRTL\u202e"
SCRIPT = ("phase('plan ' + args.h + ' end'); log('logged ' + args.h); "
          "return {text: 'result ' + args.h};")
OWN_REWRITE = "\r\x1b[K"


def test_printable_keeps_tabs_and_newlines_and_marks_the_rest() -> None:
    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable("a\tb\nc", one_line=True) == "a b c"
    assert printable(HOSTILE) == "\ufffd]0;owned\ufffd\ufffd[2J\ufffd31m\ufffdRTL\ufffd"
    assert printable("naïve — ✓ 日本") == "naïve — ✓ 日本"          # text is text


@pytest.mark.timeout(90)
async def test_wait_on_a_terminal_shows_no_escape_a_script_wrote(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "state", callers=["alice"])
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "port": free_port()}))
    argv = [sys.executable, "-m", "swarmbase.client", "alice", "run",
            json.dumps({"script": SCRIPT, "args": {"h": HOSTILE}, "label": "label " + HOSTILE}), "--wait"]
    async with cli_daemon(path):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 300, 0, 0))   # the line fits
        os.set_blocking(master, False)
        proc = await trio.lowlevel.open_process(argv, env=pty_env(SWARMBASE_CONFIG=str(path)),
                                                stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        raw = b""
        try:
            with trio.fail_after(60):
                while True:                       # to EIO: the client has exited
                    await trio.lowlevel.wait_readable(master)
                    try:
                        chunk = os.read(master, 65536)
                    except OSError as e:
                        assert e.errno == errno.EIO, e
                        break
                    if not chunk:
                        break
                    raw += chunk
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
            os.close(master)
        assert await proc.stderr.receive_some(65536) == b""
    text = raw.decode()
    assert "phase: plan \ufffd]0;owned\ufffd\ufffd[2J\ufffd31m\ufffdRTL\ufffd end" in text   # shown, defused
    assert '"swarmbase:completed"' in text
    # The pty turns "\n" into "\r\n"; apart from that and the client's own rewrite of the
    # progress line, no control character reached the terminal.
    rest = text.replace(OWN_REWRITE, "").replace("\r\n", "\n")
    bad = sorted({hex(ord(c)) for c in rest if (ord(c) < 0x20 and c not in "\t\n") or 0x7f <= ord(c) <= 0x9f
                  or 0x202a <= ord(c) <= 0x202e})
    assert bad == [], (bad, text)
