"""Retention figures: boot time and RSS of the daemon over N ended runs, as run dirs and as
archives; archive size against the dir's size; archive time per run; opening an archived
run for reading.

    python3 bench/retention.py [--runs 100000] [--sample 300] [--keep DIR]

Runs are generated with the store's own writer (Run.to_json through fsutil, no fsyncs:
tests/gen_runs.py: run.json and script.js, all boot reads of a run); the oldest `--sample`
also get what a small finished run has on disk besides (phases.json, result.json,
log.jsonl, journal.jsonl and one agent: agent.json, prompt.txt, opts.json, a 40-line
transcript), and those are the ones the daemon's own pass archives for the size and time
figures. The archived state is made by archive.archive_run itself, with os.fsync
stubbed out while it is made (fsyncs would make 100,000 archives take an hour on a shared
disk; the per-run archive time below is measured with them, on a sample, through the
daemon's own pass). Boot is `python -m swarmbase` from start to "listening" (median of --boots), beside the
same on an empty state dir (interpreter, imports, the spare runner: the floor); RSS is
VmRSS once it listens.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from swarmbase import fsutil  # noqa: E402
from swarmbase.runs import archive  # noqa: E402
from tests import gen_runs  # noqa: E402
from tests.conftest import write_config  # noqa: E402

TRANSCRIPT = "".join(json.dumps({"type": "assistant", "message": {"content": [{"type": "text", "text": f"line {i} "
                                                                              "of a short answer"}]}}) + "\n"
                     for i in range(40))


def fill(state: Path, runs: list) -> None:
    """What a small finished run has besides run.json and script.js."""
    for r in runs:
        d = state / "runs" / r.dir_name
        a = d / "agents" / "1"
        a.mkdir(parents=True)
        agent = {"n": 1, "label": "x", "engine": "claude", "state": "done", "costUsd": 0.01,
                 "tokens": {"input": 100, "output": 10}, "history": [{"state": "done", "at": "2026-05-28T00:00:00Z"}]}
        fsutil.write_json(a / "agent.json", agent, durable=False)
        fsutil.write_atomic(a / "prompt.txt", b"summarise the issue", durable=False)
        fsutil.write_json(a / "opts.json", {"model": "claude-fake", "profile": "think"}, durable=False)
        fsutil.write_atomic(a / "transcript.jsonl", TRANSCRIPT.encode(), durable=False)
        fsutil.write_json(d / "phases.json", [{"title": "work", "agents": [{"n": 1, "state": "done"}]}], durable=False)
        fsutil.write_json(d / "result.json", {"value": {"summary": "done", "n": 1}}, durable=False)
        fsutil.append_lines(d / "log.jsonl", [{"at": "2026-05-28T00:00:00Z", "level": "info", "message": "m"}] * 3,
                            durable=False)
        fsutil.append_lines(d / "journal.jsonl", [{"n": 1, "key": "k", "state": "done", "runId": r.id}], durable=False)


def archive_some(job: tuple[Path, list[str]]) -> None:
    """archive.archive_run on some run dirs, os.fsync stubbed (bench state only)."""
    state, names = job
    os.fsync = lambda fd: None                    # noqa: E731  (see the docstring)
    for name in names:
        archive.archive_run(state, state / "runs" / name, time.time())


def du(path: Path) -> int:
    """Bytes on disk (allocated blocks), as `du` counts them."""
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*")) + path.lstat().st_blocks * 512


def boot(cfg: Path) -> tuple[float, float]:
    """Seconds to "listening" and MB of RSS then, for one start of the daemon."""
    env = dict(os.environ, SWARMBASE_CONFIG=str(cfg))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    buf = b""
    assert p.stderr is not None
    while b"listening on" not in buf:
        chunk = p.stderr.read1(65536)
        if not chunk:
            raise RuntimeError(buf.decode(errors="replace")[-2000:])
        buf += chunk
    took = time.perf_counter() - t0
    rss = next(int(x.split()[1]) / 1024 for x in Path(f"/proc/{p.pid}/status").read_text().splitlines()
               if x.startswith("VmRSS:"))
    p.terminate()
    p.wait(timeout=60)
    return took, rss


def boots(cfg: Path, n: int) -> str:
    got = [boot(cfg) for _ in range(n)]
    return (f"boot {statistics.median(t for t, _ in got):.2f} s (median of {n}; "
            f"{', '.join(f'{t:.2f}' for t, _ in got)}), RSS {statistics.median(r for _, r in got):.0f} MB")


RECOVER = """
import sys, time
from pathlib import Path
from swarmbase import config
from swarmbase.notify.outbox import Outbox
from swarmbase.runs.store import RunStore
from swarmbase.runs.supervisor import Supervisor
cfg = config.load(Path(sys.argv[1]))
sup = Supervisor(cfg, RunStore(cfg.state_dir), Outbox(cfg.state_dir / "outbox.jsonl"))
rss0 = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS:"))
t0 = time.perf_counter()
sup.recover()
took = time.perf_counter() - t0
rss1 = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmRSS:"))
print(f"{took:.3f} {(rss1 - rss0) / 1024:.1f} {len(sup.runs)}")
"""


def recover_alone(cfg: Path) -> str:
    """Boot's own work (Supervisor.recover) in a fresh process: seconds and RSS it adds."""
    out = subprocess.run([sys.executable, "-c", RECOVER, str(cfg)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.split()
    return f"recover() alone {float(out[0]):.2f} s, +{float(out[1]):.0f} MB RSS for {int(out[2]):,} runs"


def set_retention(cfg: Path, retention: dict | None) -> None:
    data = json.loads(cfg.read_text())
    data.pop("retention", None)
    if retention:
        data["retention"] = retention
    cfg.write_text(json.dumps(data))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=300, help="runs archived by the daemon's own pass, timed")
    ap.add_argument("--workers", type=int, default=4, help="processes making the archived state")
    ap.add_argument("--boots", type=int, default=3, help="daemon starts per state (median)")
    ap.add_argument("--keep", type=Path, help="work in this dir and keep it")
    a = ap.parse_args()
    tmp = a.keep or Path(tempfile.mkdtemp(prefix="sb-bench-retention-"))
    state = tmp / "state"
    try:
        t0 = time.perf_counter()
        empty_cfg, _ = write_config(tmp / "empty", callers=list(gen_runs.CALLERS))
        print("empty state:  " + boots(empty_cfg, a.boots), flush=True)
        runs = gen_runs.generate(state, a.runs)
        sample = min(a.sample, a.runs)
        fill(state, runs[:sample])
        cfg, _ = write_config(state, callers=list(gen_runs.CALLERS))
        print(f"generated {a.runs:,} ended runs in {time.perf_counter() - t0:.0f} s", flush=True)
        d0 = state / "runs" / runs[0].dir_name
        d0_disk = du(d0)
        print(f"one run dir: {sum(1 for p in d0.rglob('*') if p.is_file())} files, "
              f"{sum(p.stat().st_size for p in d0.rglob('*') if p.is_file()):,} bytes of files, "
              f"{d0_disk:,} bytes on disk")
        print(f"{a.runs:,} run dirs:   " + boots(cfg, a.boots) + "; " + recover_alone(cfg), flush=True)

        # The daemon's own pass (fsyncs and all) on a sample: archive time per run.
        if sample:
            set_retention(cfg, {"maxRuns": (a.runs - sample) // len(gen_runs.CALLERS) + 1})
            env = dict(os.environ, SWARMBASE_CONFIG=str(cfg))
            p = subprocess.Popen([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE, text=True)
            assert p.stderr is not None
            try:
                for line in p.stderr:
                    m = re.search(r"retention: (\d+) archived .* in ([\d.]+) s", line)
                    if m:
                        n, took = int(m.group(1)), float(m.group(2))
                        print("daemon's pass: " + line.strip().split("retention: ", 1)[-1])
                        print(f"archive time per run (daemon pass, fsynced): {took / max(n, 1) * 1000:.1f} ms", flush=True)
                        break
            finally:
                p.terminate()
                p.wait(timeout=60)
            z = sorted(archive.root(state).glob("*.zip"))[0]
            print(f"one archive: {z.stat().st_size:,} bytes ({du(z):,} on disk) vs the dir's {d0_disk:,} on disk")

            # Opening an archived run for reading (what status/result and the dashboard do once).
            name = z.name[:-4]
            t0 = time.perf_counter()
            for _ in range(20):
                shutil.rmtree(archive.open_dir(state, name), ignore_errors=True)
                archive.open_run(state, name)
            print(f"opening an archived run: {(time.perf_counter() - t0) / 20 * 1000:.1f} ms (mean of 20, extracted)",
                  flush=True)

        # Everything but the newest archived, fsync stubbed while the state is made.
        set_retention(cfg, None)
        t0 = time.perf_counter()
        keep = {r.dir_name for r in sorted(runs, key=lambda r: r.created_at)[-len(gen_runs.CALLERS):]}
        todo = [r.dir_name for r in runs if r.dir_name not in keep and (state / "runs" / r.dir_name).is_dir()]
        with multiprocessing.Pool(a.workers) as pool:
            for _ in pool.imap_unordered(archive_some, [(state, todo[i::a.workers * 8])
                                                        for i in range(a.workers * 8)]):
                pass
        print(f"archived the rest in {time.perf_counter() - t0:.0f} s (no fsyncs, {a.workers} processes)",
              flush=True)
        print(f"disk: run dirs left {du(state / 'runs') / 1e6:.1f} MB, archive {du(archive.root(state)) / 1e6:.1f} MB "
              f"(index {(archive.root(state) / archive.INDEX).stat().st_size / 1e6:.1f} MB)")
        print(f"{a.runs - len(keep):,} archived + {len(keep)} dirs: " + boots(cfg, a.boots) + "; "
              + recover_alone(cfg))
    finally:
        if a.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
