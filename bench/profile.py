"""py-spy around a bench: record a process's stacks, then summarise them as text.

    python3 bench/profile.py summarise stacks.txt [--top 25]

Benches that start the daemon as a child take `--profile stacks.txt`: they run
`py-spy record --format raw` on the daemon while they measure (raw = one collapsed stack
per line with its sample count). The summary lists the functions holding the most
samples: self (the frame on top of the stack) and inclusive (anywhere on it), and the
share of samples where the process was idle (waiting in epoll), so a profile says both
where the CPU went and how much of the time there was any CPU to speak of.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from collections import Counter
from pathlib import Path

IDLE = ("epoll", "select", "poll (", "_epoll", "wait (threading", "acquire (", "get (queue",
        "_thread_cache.py:211", "spawn.py:47")


class Recorder:
    """py-spy record on a pid, as a context manager (a no-op without a path)."""

    def __init__(self, pid: int, path: str | None, rate: int = 250, idle: bool = False, gil: bool = True) -> None:
        self.gil = gil
        self.pid, self.path, self.rate, self.idle = pid, path, rate, idle
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Recorder":
        if self.path:
            spy = shutil.which("py-spy")
            if spy is None:
                raise SystemExit("py-spy is not installed: pip install py-spy")
            # --gil: only the thread holding the GIL is sampled, so a profile shows where the
            # daemon's Python time goes (threads blocked in fsync or fork do not hold it).
            argv = [spy, "record", "-p", str(self.pid), "-o", self.path, "--format", "raw", "-r", str(self.rate),
                    "--threads", "--nonblocking"] + (["--gil"] if self.gil else []) + (["--idle"] if self.idle else [])
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)          # SIGINT: py-spy writes its output and exits
            self.proc.wait(timeout=30)


def frames(stack: str) -> list[str]:
    return [f for f in stack.split(";") if f]


def short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py:123)"
    if " (" in frame and frame.endswith(")"):
        name, where = frame[:-1].split(" (", 1)
        return f"{name} ({where.rsplit('/', 1)[-1]})"
    return frame


def summarise(path: Path, top: int = 25) -> str:
    self_c: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        raw = frames(stack)
        fs = [short(f) for f in raw]
        if not fs:
            continue
        total += n
        if any(k in fs[-1] for k in IDLE):
            idle += n
            continue
        self_c[fs[-1]] += n
        for f in set(short(f) for f in raw if "swarmbase/" in f or "dashboard/" in f):
            incl[f] += n
    busy = total - idle
    out = [f"{total} samples, {idle} idle ({idle / max(total, 1) * 100:.0f} %), {busy} busy"]
    out.append(f"top {top} self (share of busy samples):")
    out += [f"  {c / max(busy, 1) * 100:5.1f} %  {f}" for f, c in self_c.most_common(top)]
    out.append(f"top {top} inclusive, daemon code (swarmbase/, dashboard/):")
    out += [f"  {c / max(busy, 1) * 100:5.1f} %  {f}" for f, c in incl.most_common(top)]
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarise")
    s.add_argument("path", type=Path)
    s.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    print(summarise(a.path, a.top))
