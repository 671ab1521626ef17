"""fsyncs per run for the peer bench (bench/peer_workflow.py): the fsync and fdatasync calls
made in one side's cgroup during the run, counted by the kernel (`perf stat -a -G <cgroup>`
on the syscall tracepoints).

In-kernel counting, so the measured processes are not slowed as under ptrace (a first
try with `strace -f` attached to the daemon left its forked children stopped for good).
Needs perf and the tracepoints (root); without them the count is None and printed as "–".
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from bench.tree_cgroup import cgroup2_mount

EVENTS = ("syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync")
SETUP_S = 0.5              # perf opens its counters before the run starts


def total(csv: str) -> int | None:
    """The sum of the counts in `perf stat -x,` output (`count,unit,event,cgroup,...`)."""
    found = None
    for row in csv.splitlines():
        parts = row.split(",")
        if len(parts) >= 3 and parts[2] in EVENTS and parts[0].strip().isdigit():
            found = (found or 0) + int(parts[0])
    return found


@asynccontextmanager
async def counting(cgroup: Path) -> AsyncIterator[Callable[[], int | None]]:
    """Counts while the block runs; the callable gives the count once it has ended."""
    perf = shutil.which("perf")
    mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
    got: list[int | None] = [None]
    if perf is None or mount is None:
        yield lambda: None
        return
    name = str(cgroup.relative_to(mount))       # perf names a cgroup by its path in the hierarchy
    with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
        argv = [perf, "stat", "-a", "-x,", "-o", out.name, "-e", ",".join(EVENTS), "-G", ",".join([name] * len(EVENTS))]
        async with trio.open_nursery() as n:
            proc = await n.start(lambda task_status: trio.run_process(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, task_status=task_status))
            await trio.sleep(SETUP_S)
            try:
                yield lambda: got[0]
            finally:
                proc.send_signal(signal.SIGINT)       # perf writes its counts and exits
        got[0] = total(Path(out.name).read_text())
