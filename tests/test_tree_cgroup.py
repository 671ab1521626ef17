"""The peer bench's measuring pieces (bench/tree_cgroup.py): what it reads out of cgroup and
/proc files, and one real cgroup round trip (root, as the tests run): a process started
under the launcher is counted in full, with what it left running, and removal kills that."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path

from bench.tree_cgroup import (
    HZ,
    TreeCgroup,
    cgroup2_mount,
    cpu_usage_s,
    machine_busy_s,
    own_cgroup,
    proc_cpu,
    pss_kb,
)

HYBRID_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
ROLLUP = """\
55bdc8b88000-7ffd0d1e4000 ---p 00000000 00:00 0                          [rollup]
Rss:                1752 kB
Pss:                 261 kB
Pss_Dirty:           116 kB
Pss_Anon:            116 kB
"""


def test_the_files_are_read_as_the_kernel_writes_them() -> None:
    assert cgroup2_mount(HYBRID_MOUNTS) == Path("/sys/fs/cgroup/unified")
    assert cgroup2_mount("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n") == Path("/sys/fs/cgroup")
    assert cgroup2_mount("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n") is None
    assert own_cgroup("4:memory:/x\n0::/user.slice/a.scope\n") == "/user.slice/a.scope"
    assert own_cgroup("0::/\n") == "/" and own_cgroup("1:cpu:/\n") is None
    assert cpu_usage_s("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n") == 2.5
    assert pss_kb(ROLLUP) == 261 and pss_kb("") == 0
    # A comm with spaces and parentheses does not shift the fields after it.
    stat = f"42 (a (b) c) S 1 42 42 0 -1 0 0 0 0 0 {3 * HZ} {HZ} 0 0 20 0 1 0 777 0 0"
    assert proc_cpu(stat) == ("a (b) c", 777, 4.0)
    # user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    assert machine_busy_s(f"cpu  {HZ} 0 {HZ} {50 * HZ} {7 * HZ} 0 0 0 0 0\ncpu0 1 2 3\n") == 2.0


def test_own_process_files_parse() -> None:
    comm, start, used = proc_cpu(Path("/proc/self/stat").read_text())
    assert comm.startswith("py") and start > 0 and used >= 0
    assert pss_kb(Path("/proc/self/smaps_rollup").read_text()) > 1000


def test_a_tree_is_counted_in_full_and_removed() -> None:
    tree = TreeCgroup.create("test")
    try:
        # A child that burns ~0.3 CPU-s in a grandchild it waits for, and leaves a sleeper behind.
        script = ("import subprocess, sys; subprocess.Popen(['sleep', '60']); "
                  "subprocess.run([sys.executable, '-c', 'sum(range(8_000_000))'])")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([*tree.launcher(), "python3", "-c", script], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        assert used > 0.1
        assert tree.cpu_s() >= 0.9 * used
        (sleeper,) = tree.pids()
        assert Path(f"/proc/{sleeper}/cmdline").read_bytes().startswith(b"sleep")
        kb, cpu = tree.sample()
        assert kb > 0 and [comm for comm, _ in cpu.values()] == ["sleep"]
    finally:
        tree.remove()
    assert not tree.path.exists()
    deadline = time.monotonic() + 5
    while not _gone(sleeper):
        assert time.monotonic() < deadline, "the sleeper outlived its cgroup"
        time.sleep(0.05)
    # Without its cgroup the launcher refuses to run the command at all (it would go unmeasured).
    assert subprocess.run([*tree.launcher(), "true"], check=False, stderr=subprocess.DEVNULL).returncode == 125


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_sweep_removes_a_dead_benchs_groups_and_keeps_a_live_ones() -> None:
    # A bench's groups are empty between its runs: the sweep of a second bench started
    # meanwhile must not remove them (it did, and the first bench's next read failed).
    mount = cgroup2_mount(Path("/proc/self/mounts").read_text())
    own = own_cgroup(Path("/proc/self/cgroup").read_text())
    assert mount is not None and own is not None
    live = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = mount / own.lstrip("/")
    kept, swept = base / f"swarmbase-bench-{live.pid}-test", base / f"swarmbase-bench-{dead.pid}-test"
    try:
        kept.mkdir()
        swept.mkdir()
        removed = TreeCgroup.sweep_stale()
        assert swept in removed and not swept.exists() and kept.exists()
    finally:
        live.kill()
        live.wait()
        for d in (kept, swept):
            if d.exists():
                d.rmdir()
