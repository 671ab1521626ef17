"""Retention's rule (which runs are pruned), the archive's crash safety (every half state a
kill -9 can leave, settled at boot), the archive index, and the periodic pass's timing
under trio's MockClock."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from swarmbase import fsutil
from swarmbase.runs import archive
from swarmbase.runs.model import Run
from swarmbase.runs.retention import RetentionPass, load_archived, settle
from swarmbase.runs.retention_rules import Retention, select

from . import gen_runs

DAY = 86_400.0
NOW = gen_runs.T0 + 100 * DAY


def run(i: int, status: str = "completed", ended: float | None = None, caller: str = "alice", **kw: Any) -> Run:
    at = NOW - DAY * 2 + i if ended is None else ended
    return Run(id=f"run_{i:012x}", caller=caller, dir_name=f"d{i}", created_at=at - 10, status=status,
               ended_at=None if status in ("queued", "running") else at, **kw)


def pick(runs: list[Run], policy: Retention, journals: set[str] = set(), busy: set[str] = set()) -> list[str]:
    return [r.id for r in select(runs, policy, NOW, lambda r: r.id in busy, lambda r: r.id in journals)]


def test_days_prunes_what_ended_before_the_window_resumable_or_not() -> None:
    old, young = run(1, ended=NOW - 31 * DAY), run(2, ended=NOW - 29 * DAY)
    resumable_old = run(3, "failed", ended=NOW - 40 * DAY)
    assert pick([young, old, resumable_old], Retention(days=30), journals={resumable_old.id}) \
        == [resumable_old.id, old.id]          # oldest end first


def test_max_runs_counts_per_caller_and_keeps_resumable_runs() -> None:
    alice = [run(i) for i in range(5)] + [run(5, "failed")]          # ended one second apart
    bob = [run(10 + i, caller="bob") for i in range(2)]
    interrupted = run(20, "interrupted", ended=NOW - 3 * DAY)         # alice's oldest
    runs = alice + bob + [interrupted]
    # alice keeps her newest two (5 and 4); bob's two are his own and stay; the interrupted
    # run has a journal: still resumable, so kept.
    assert pick(runs, Retention(maxRuns=2), journals={interrupted.id}) == [r.id for r in alice[:4]]
    # Asked to, it goes too; without a journal it never was resumable.
    assert interrupted.id in pick(runs, Retention(maxRuns=2, keepResumable=False), journals={interrupted.id})
    assert interrupted.id in pick(runs, Retention(maxRuns=2))
    # Past the window it goes even when kept from the count.
    assert interrupted.id in pick(runs, Retention(maxRuns=2, days=2.5), journals={interrupted.id})
    # Once resumed, its journal lines live on in the new run: not resumable any more.
    interrupted.resumed_as = "run_0000000000aa"
    assert interrupted.id in pick(runs, Retention(maxRuns=2), journals={interrupted.id})
    # A cancelled run with a journal was stopped on purpose: not kept as resumable.
    cancelled = run(21, "cancelled", ended=NOW - 4 * DAY)
    assert cancelled.id in pick(runs + [cancelled], Retention(maxRuns=2), journals={cancelled.id})


def test_never_a_running_busy_or_archived_run() -> None:
    running, queued = run(1, "running"), run(2, "queued")
    busy, archived, ended = run(3), run(4), run(5)
    archived.archived_at = NOW - DAY
    runs = [running, queued, busy, archived, ended]
    assert pick(runs, Retention(days=0.001), busy={busy.id}) == [ended.id]
    assert pick(runs, Retention(maxRuns=1), busy={busy.id}) == []     # ended is the newest it may count


# -- the archive on disk ---------------------------------------------------------------
def make_runs(state: Path, n: int) -> list[Run]:
    runs = gen_runs.generate(state, n)
    for r in runs:                                 # an agent with a transcript, and a symlink to skip
        d = state / "runs" / r.dir_name
        (d / "agents" / "1").mkdir(parents=True)
        (d / "agents" / "1" / "transcript.jsonl").write_text('{"type":"result"}\n' * 50)
        (d / "escape").symlink_to("/etc/passwd")
    return runs


def test_archive_holds_the_files_not_symlinks_and_extracts_them_back(tmp_path: Path) -> None:
    (r,) = make_runs(tmp_path, 1)
    d = tmp_path / "runs" / r.dir_name
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in d.rglob("*") if p.is_file() and not p.is_symlink()}
    line, raw, packed = archive.archive_run(tmp_path, d, NOW)
    assert not d.exists() and line["dirName"] == r.dir_name and "history" not in line["run"]
    assert raw == sum(map(len, files.values())) and 0 < packed
    z = archive.zip_path(tmp_path, r.dir_name)
    assert sorted(zipfile.ZipFile(z).namelist()) == sorted(files)             # no "escape"
    opened = archive.open_run(tmp_path, r.dir_name)
    assert {p.relative_to(opened).as_posix(): p.read_bytes() for p in opened.rglob("*") if p.is_file()} == files
    assert archive.full_record(tmp_path, r.dir_name)["history"] == r.history


def test_an_archive_naming_a_path_outside_is_refused(tmp_path: Path) -> None:
    z = tmp_path / "evil.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("../outside", b"x")
    with pytest.raises(ValueError, match="is not a run file"):
        archive.extract(z, tmp_path / "out")
    assert not (tmp_path / "outside").exists()


def test_boot_settles_every_state_a_kill_can_leave(tmp_path: Path) -> None:
    undone, finished, pruned, index_lacking = make_runs(tmp_path, 4)
    runs_dir, arch = tmp_path / "runs", archive.root(tmp_path)
    arch.mkdir()
    # Killed while zipping: a temp zip, cut short; the run dir is whole.
    archive.write(runs_dir / undone.dir_name, archive.zip_path(tmp_path, undone.dir_name))
    tmp = arch / f".tmp-{undone.dir_name}.zip"
    tmp.write_bytes(archive.zip_path(tmp_path, undone.dir_name).read_bytes()[:100])
    archive.zip_path(tmp_path, undone.dir_name).unlink()
    # Killed after the rename, before the dir was removed (and before its index line).
    archive.write(runs_dir / finished.dir_name, archive.zip_path(tmp_path, finished.dir_name))
    # Killed while removing the renamed dir.
    archive.write(runs_dir / pruned.dir_name, archive.zip_path(tmp_path, pruned.dir_name))
    archive.append_index(tmp_path, [archive.index_line(pruned.to_json(), NOW)])
    (runs_dir / pruned.dir_name).rename(runs_dir / f".pruned-{pruned.dir_name}")
    # A whole archive whose index line was never written, and an index line whose archive is gone.
    archive.archive_run(tmp_path, runs_dir / index_lacking.dir_name, NOW)
    lines, _ = fsutil.read_lines(arch / "index.jsonl")
    fsutil.write_atomic(arch / "index.jsonl", b"".join(json.dumps(x).encode() + b"\n" for x in lines[:1]
                                                       + [{"dirName": "gone", "archivedAt": 1, "run": {}}]))
    (arch / ".open" / "someone").mkdir(parents=True)

    settle(tmp_path)
    assert (runs_dir / undone.dir_name / "run.json").is_file() and not tmp.exists()
    assert not (runs_dir / finished.dir_name).exists() and not list(runs_dir.glob(".pruned-*"))
    assert not (arch / ".open").exists()
    loaded: dict[str, Run] = {}
    assert load_archived(tmp_path, loaded) == 3
    assert sorted(loaded) == sorted(r.id for r in (finished, pruned, index_lacking))
    assert all(r.archived_at for r in loaded.values()) and loaded[finished.id].label == finished.label
    again, _ = fsutil.read_lines(arch / "index.jsonl")         # rewritten whole: one line each
    assert sorted(x["dirName"] for x in again) == sorted(r.dir_name for r in (finished, pruned, index_lacking))


# -- the periodic pass ---------------------------------------------------------------------
async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)           # no worker thread: autojump must not move the clock mid-pass


@pytest.mark.timeout(30)
async def test_the_pass_runs_at_boot_then_every_interval(tmp_path: Path, autojump_clock: Any) -> None:
    stale, fresh, kept = make_runs(tmp_path, 3)
    runs = {r.id: r for r in (stale, fresh, kept)}
    base = trio.current_time()
    start = NOW

    def now() -> float:
        return start + trio.current_time() - base
    stale.ended_at = NOW - 2 * DAY
    fresh.ended_at = NOW + 100                 # ends past the one-day window at NOW + 86,500
    kept.ended_at, kept.status = NOW - 3 * DAY, "running"
    changed: list[str] = []
    policy = Retention(days=1, intervalMinutes=60)
    p = RetentionPass(lambda: policy, tmp_path, runs, lambda r: tmp_path / "runs" / r.dir_name,
                      busy=lambda r: r.active, changed=lambda r: changed.append(r.id), now=now, in_thread=inline)
    async with trio.open_nursery() as n:
        n.start_soon(p.serve)
        await trio.sleep(1)
        assert p.passes == 1 and stale.archived_at is not None and fresh.archived_at is None
        assert changed == [stale.id] and kept.archived_at is None          # never a running run
        await trio.sleep(89_998)            # t = 89,999: passes at 0, 3,600 … 86,400
        assert p.passes == 25 and fresh.archived_at is None
        await trio.sleep(2)                 # the pass at 90,000 is the first to see it past the window
        assert p.passes == 26 and fresh.archived_at is not None and changed == [stale.id, fresh.id]
        n.cancel_scope.cancel()
    assert (tmp_path / "runs" / kept.dir_name).is_dir() and archive.zip_path(tmp_path, fresh.dir_name).is_file()



@pytest.mark.timeout(30)
async def test_a_changed_policy_applies_at_once_and_keeps_its_interval(tmp_path: Path, autojump_clock: Any) -> None:
    """Issue 32.3: a reload changes `retention` (read at each pass) and wakes the pass; off,
    it passes no more until a policy comes back."""
    runs = {r.id: r for r in make_runs(tmp_path, 3)}
    old, mid, new = sorted(runs.values(), key=lambda r: r.created_at)
    for i, r in enumerate((old, mid, new)):
        r.ended_at = NOW - 10 + i
    policy: list[Retention | None] = [None]
    p = RetentionPass(lambda: policy[0], tmp_path, runs, lambda r: tmp_path / "runs" / r.dir_name,
                      busy=lambda r: r.active, changed=lambda r: None, now=lambda: NOW, in_thread=inline)
    async with trio.open_nursery() as n:
        n.start_soon(p.serve)
        await trio.sleep(7 * 86_400)
        assert p.passes == 0                         # no policy: it only waits
        policy[0] = Retention(maxRuns=2, intervalMinutes=60)
        p.wake()
        await trio.sleep(1)
        assert p.passes == 1 and old.archived_at is not None and mid.archived_at is None
        policy[0] = Retention(maxRuns=1, intervalMinutes=10)
        p.wake()
        await trio.sleep(1)
        assert p.passes == 2 and mid.archived_at is not None and new.archived_at is None
        await trio.sleep(1_200)                      # the new interval: passes at +600 and +1,200
        assert p.passes == 4
        policy[0] = None
        p.wake()
        await trio.sleep(1)
        passes = p.passes
        await trio.sleep(30 * 86_400)
        assert p.passes == passes
        n.cancel_scope.cancel()
