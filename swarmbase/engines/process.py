"""Running one agent CLI: its own process group, a record for the boot reaper, line
reading with an idle-output watchdog, and a group kill however it ends.

Never waits on stdout EOF alone: once the CLI printed its final event (or the leader
exited) the group gets a short grace and then SIGKILL, so a grandchild holding stdout
open cannot keep the agent alive.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import attrs
import trio

from .. import fsutil
from ..procs import LineReader, group_process

REAP_AFTER_FINAL_S = 1.0


def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: start time in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@attrs.define
class ProcResult:
    exit_code: int | None = None
    idle_timeout: bool = False
    final_seen: bool = False
    lines: int = 0


async def run_cli(argv: list[str], *, env: dict[str, str], cwd: str, stdin_path: Path, record: Path,
                  on_line: Callable[[bytes], bool], idle_timeout: float, record_extra: dict | None = None,
                  started: Callable[[int], None] | None = None) -> ProcResult:
    """Run argv until it ends; on_line returns True for the final event. Cancelling the
    caller kills the group. `record` is written (pgid + start time) before any output is read."""
    res = ProcResult()
    try:
        with open(stdin_path, "rb") as stdin:
            async with group_process(argv, env=env, cwd=cwd, stdin=stdin.fileno(),
                                     stderr=subprocess.STDOUT, grace=1.0) as proc:
                fsutil.write_json(record, {"pgid": proc.pid, "startTime": process_start_time(proc.pid),
                                           "argv0": argv[0], **(record_extra or {})})
                if started:
                    started(proc.pid)
                last = [trio.current_time()]
                async with trio.open_nursery() as nursery:
                    async def watchdog() -> None:
                        while True:
                            due = last[0] + idle_timeout
                            if trio.current_time() >= due:
                                res.idle_timeout = True
                                nursery.cancel_scope.cancel()
                                return
                            await trio.sleep(due - trio.current_time())

                    async def leader_exit() -> None:
                        await proc.wait()
                        # The leader is gone; whatever is still writing is a stray.
                        await trio.sleep(REAP_AFTER_FINAL_S)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(watchdog)
                    nursery.start_soon(leader_exit)
                    assert proc.stdout is not None
                    async for line in LineReader(proc.stdout):
                        last[0] = trio.current_time()
                        res.lines += 1
                        if on_line(line):
                            res.final_seen = True
                            with trio.move_on_after(REAP_AFTER_FINAL_S):
                                await proc.wait()
                            break
                    nursery.cancel_scope.cancel()
            res.exit_code = proc.returncode
    finally:
        try:
            os.unlink(record)
        except FileNotFoundError:
            pass
    return res


def parse_json_line(line: bytes) -> object | None:
    try:
        return json.loads(line)
    except ValueError:
        return None


def reap_recorded_groups(procs_dir: Path) -> list[int]:
    """Kill agent groups left by a daemon that died uncleanly. A record's pgid is killed
    only if that process still has the recorded start time (a reused pid never is)."""
    from ..procs import kill_group
    killed = []
    if not procs_dir.is_dir():
        return killed
    for rec in procs_dir.glob("*.json"):
        data = fsutil.read_json(rec) or {}
        pgid, start = data.get("pgid"), data.get("startTime")
        if isinstance(pgid, int) and start is not None and process_start_time(pgid) == start:
            kill_group(pgid)
            killed.append(pgid)
        rec.unlink(missing_ok=True)
    return killed
