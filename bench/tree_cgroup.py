"""Measuring a whole process tree: its own cgroup v2 child (CPU from the kernel's
accounting of every process that ever ran in it), and its memory as the sum of its
members' PSS, sampled.

- CPU: `cpu.stat`'s `usage_usec` of a child cgroup made for the tree. A process enters it
  before it execs (`launcher()`: `sh -c 'echo 0 > cgroup.procs; exec "$@"'`), and every
  process it starts is born there, sandboxed or not (bubblewrap's namespaces do not move a
  process out of its cgroup), so short-lived grandchildren count in full: nothing is lost
  between samples and nothing depends on who reaps whom. `usage_usec` is core cgroup v2
  accounting: it needs no controller enabled, so it works in the hybrid layout too (v1
  controllers, cgroup2 at /sys/fs/cgroup/unified, as on the bench machine).
- Memory: the sum of `Pss:` from /proc/<pid>/smaps_rollup over `cgroup.procs`, sampled by
  `TreeSampler` on a worker thread (reading one process's rollup costs ~1 ms CPU here, so
  ~20 ms a sample at 20 processes; at 4 Hz that is ~5 % of a core, charged to the bench
  process, not to the tree). PSS splits shared pages between their users, so eight CLIs
  mapping one 373 MB binary count it once, not eight times.
- Who used the CPU, approximately: the sampler also reads each member's utime+stime by
  name (comm); a process that exits between samples loses its last interval, so these
  are lower bounds, given for the split only (the total is the cgroup's).

Needs root (or a delegated cgroup) and a cgroup2 mount; `TreeCgroup.create` says why
when it cannot make one, and the bench stops there: no estimate stands in for it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import attrs
import trio

HZ = os.sysconf("SC_CLK_TCK")
PREFIX = "swarmbase-bench-"


class CgroupUnavailable(Exception):
    """No child cgroup can be made here; the message says why."""


def cgroup2_mount(mounts: str) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, from /proc/self/mounts' text."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path ("/..."), from /proc/self/cgroup's `0::` line."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cpu_usage_s(cpu_stat: str) -> float:
    """`usage_usec` of a cgroup's cpu.stat, in seconds."""
    for line in cpu_stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError("cpu.stat has no usage_usec")


def pss_kb(smaps_rollup: str) -> int:
    """The `Pss:` line of /proc/<pid>/smaps_rollup (0 for a zombie or kernel thread's empty one)."""
    for line in smaps_rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def proc_cpu(stat: str) -> tuple[str, int, float]:
    """(comm, start time in ticks, utime+stime in seconds) from /proc/<pid>/stat. The comm
    may hold spaces and parentheses: the fields after it start at the last ')'."""
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): utime, stime are fields 14, 15; starttime field 22.
    return comm, int(rest[19]), (int(rest[11]) + int(rest[12])) / HZ


def machine_busy_s(proc_stat: str) -> float:
    """CPU-seconds the whole machine has been busy (all CPUs; not idle, not iowait), from
    /proc/stat's first line."""
    fields = proc_stat.splitlines()[0].split()
    assert fields[0] == "cpu", fields[0]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    ticks = [int(x) for x in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / HZ


def _read(path: Path | str) -> str:
    with open(path) as f:
        return f.read()


@attrs.define
class TreeCgroup:
    path: Path

    @classmethod
    def create(cls, name: str) -> "TreeCgroup":
        mount = cgroup2_mount(_read("/proc/self/mounts"))
        if mount is None:
            raise CgroupUnavailable("no cgroup2 hierarchy is mounted (/proc/self/mounts)")
        own = own_cgroup(_read("/proc/self/cgroup"))
        if own is None:
            raise CgroupUnavailable("this process is in no cgroup v2 (/proc/self/cgroup has no 0:: line)")
        parent = mount / own.lstrip("/")
        path = parent / f"{PREFIX}{os.getpid()}-{name}"
        try:
            path.mkdir()
        except OSError as e:
            raise CgroupUnavailable(f"cannot make {path}: {e.strerror} (root, or a delegated cgroup, is needed)") \
                from None
        cg = cls(path)
        if not (path / "cpu.stat").exists():
            cg.remove()
            raise CgroupUnavailable(f"{path} has no cpu.stat (kernel older than 4.15?)")
        return cg

    @staticmethod
    def sweep_stale(name_filter: str = PREFIX) -> list[Path]:
        """Removes empty bench cgroups a killed bench left behind (not those of a live bench)."""
        mount = cgroup2_mount(_read("/proc/self/mounts"))
        own = own_cgroup(_read("/proc/self/cgroup"))
        if mount is None or own is None:
            return []
        removed = []
        for d in (mount / own.lstrip("/")).glob(f"{name_filter}*"):
            owner = d.name[len(PREFIX):].split("-", 1)[0]
            # Another bench that is still running keeps its groups, empty between runs.
            if owner.isdigit() and (int(owner) == os.getpid() or os.path.exists(f"/proc/{owner}")):
                continue
            try:
                d.rmdir()
                removed.append(d)
            except OSError:
                pass          # still has processes: left alone
        return removed

    def launcher(self) -> tuple[str, ...]:
        """A command prefix that moves itself into this cgroup, then execs the rest (the pid
        stays the same); it fails (125) rather than run the command unmeasured."""
        return ("/bin/sh", "-c", 'echo 0 > "$0" || exit 125; exec "$@"', str(self.path / "cgroup.procs"))

    def cpu_s(self) -> float:
        return cpu_usage_s(_read(self.path / "cpu.stat"))

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.path / "cgroup.procs").split()]

    def sample(self) -> tuple[int, dict[tuple[int, int], tuple[str, float]]]:
        """(PSS in kB summed over the members, {(pid, start): (comm, CPU-s so far)})."""
        total, cpu = 0, {}
        for pid in self.pids():
            try:
                total += pss_kb(_read(f"/proc/{pid}/smaps_rollup"))
                comm, start, used = proc_cpu(_read(f"/proc/{pid}/stat"))
            except (OSError, ValueError, IndexError):
                continue            # gone between the list and the read
            cpu[(pid, start)] = (comm, used)
        return total, cpu

    def remove(self, timeout: float = 10.0) -> None:
        """Kills what is left in it, waits until it is empty, removes it."""
        kill = self.path / "cgroup.kill"
        deadline = time.monotonic() + timeout
        while self.path.exists():
            try:
                pids = self.pids()
            except OSError:
                return
            if pids:
                if kill.exists():
                    kill.write_text("1")
                else:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@attrs.define
class TreeSampler:
    """Peak PSS of a tree and its members' CPU by name while it runs (`run` in a nursery,
    cancelled at the end; `sample_now` once more after)."""
    tree: TreeCgroup
    interval: float = 0.25
    peak_kb: int = 0
    samples: int = 0
    first: dict[tuple[int, int], float] = attrs.Factory(dict)     # CPU-s when first seen
    last: dict[tuple[int, int], tuple[str, float]] = attrs.Factory(dict)
    started_ticks: float = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.started_ticks = float(_read("/proc/uptime").split()[0]) * HZ
        await self.sample_now()
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.sample_now()

    async def sample_now(self) -> None:
        kb, cpu = await trio.to_thread.run_sync(self.tree.sample)
        self.samples += 1
        self.peak_kb = max(self.peak_kb, kb)
        for key, (comm, used) in cpu.items():
            # A process that was there before the run counts from when it was first seen;
            # one born during it from its start.
            self.first.setdefault(key, used if key[1] < self.started_ticks else 0.0)
            self.last[key] = (comm, used)

    def cpu_by_name(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, (comm, used) in self.last.items():
            out[comm] = out.get(comm, 0.0) + used - self.first[key]
        return out
