"""Runs that survive: journal and resume, kill -9 and restart, offline notices, torn files."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config
from swarmbase.client import connect
from swarmbase.runs import journal
from swarmbase.runs.model import Run
from swarmbase.runs.store import RunStore

from .clidaemon import held_fan_out
from .conftest import (Env, agent_json, fake_daemon, pid_alive, process_records, result_of, run_to_end, spawns,
                       start_cli_daemon, start_daemon, write_config)


def end_notices(h: Any) -> list[str]:
    """Run-end notices received and not yet read (budget warnings are not run ends)."""
    out = []
    while True:
        try:
            n = h.notices.receive_nowait()
        except trio.WouldBlock:
            return out
        if n["eventId"].endswith(":end"):
            out.append(n["eventId"])


def journal_lines(env: Env, run: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (env.services.store.dir(run) / "journal.jsonl").read_text().splitlines()]


async def resume_to_end(env: Env, run: Any, timeout: float = 60, **params: Any) -> Run:
    sup = env.services.supervisor
    new = sup.resume(env.cfg.caller(run.caller), run.id, params)
    with trio.fail_after(timeout):
        if new.id in sup.live:
            await sup.live[new.id].finished.wait()
    return new


FANOUT = """
export const meta = { name: "fan-out" };
return await parallel(args.delays.map((d, i) => () => agent("sleep:" + d + " item " + i, { label: "a" + i })));
"""


async def test_parallel_fanout_of_30_finishing_shuffled_replays_30_of_30(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=30, maxConcurrentAgents=30)
    # Later items finish first: completion order is the reverse of call order.
    delays = [round(0.6 - i * 0.02, 2) for i in range(30)]
    first = await run_to_end(env, FANOUT, args={"delays": delays})
    assert first.status == "completed", first.error
    ends = sorted(range(1, 31), key=lambda n: agent_json(env, first, n)["endedAt"])
    assert ends != list(range(1, 31))             # they did not finish in call order
    before = len(spawns(tmp_path))
    second = await resume_to_end(env, first)
    assert second.status == "completed" and second.resumed_from == first.id
    assert len(spawns(tmp_path)) == before        # zero processes
    assert result_of(env, second) == result_of(env, first)
    recs = [agent_json(env, second, n) for n in range(1, 31)]
    assert all(r["replayed"] and r["state"] == "done" and r["costUsd"] == 0 for r in recs)
    assert second.spent_usd == 0
    # A resume of the resume still replays everything: the journal was copied forward.
    third = await resume_to_end(env, second)
    assert len(spawns(tmp_path)) == before
    assert sum(agent_json(env, third, n)["replayed"] for n in range(1, 31)) == 30


async def test_resume_with_changed_args_replays_nothing_that_depends_on_them(tmp_path: Path,
                                                                             nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    script = "const a = await agent('noop fixed');\nconst b = await agent('noop about ' + args.topic);\nreturn [a, b];"
    first = await run_to_end(env, script, args={"topic": "trio"})
    before = len(spawns(tmp_path))
    second = await resume_to_end(env, first, args={"topic": "anyio"})
    assert second.args == {"topic": "anyio"}
    # The args hash is part of every key: nothing stale replays.
    assert [agent_json(env, second, n)["replayed"] for n in (1, 2)] == [False, False]
    assert len(spawns(tmp_path)) == before + 2
    # Back to the old args: both replay from the journal carried forward.
    third = await resume_to_end(env, second, args={"topic": "trio"})
    assert [agent_json(env, third, n)["replayed"] for n in (1, 2)] == [True, True]
    assert len(spawns(tmp_path)) == before + 2


async def test_failed_skipped_and_identical_calls(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    script = """
const same = [await agent('noop twin'), await agent('noop twin')];
const bad = await agent('noresult');
return { same, bad };"""
    first = await run_to_end(env, script)
    assert result_of(env, first) == {"same": ["noop", "noop"], "bad": None}
    keys = [e["key"] for e in journal_lines(env, first)[1:]]
    assert keys[0].rsplit(":", 1)[0] == keys[1].rsplit(":", 1)[0] and keys[0] != keys[1]   # occurrence index
    assert journal_lines(env, first)[0]["v"] == journal.VERSION
    before = len(spawns(tmp_path))
    second = await resume_to_end(env, first)
    assert [agent_json(env, second, n)["replayed"] for n in (1, 2, 3)] == [True, True, False]
    assert len(spawns(tmp_path)) == before + 1     # only the failed agent runs again


async def test_torn_journal_line_is_skipped_and_reported(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    first = await run_to_end(env, "return [await agent('noop a'), await agent('noop b'), await agent('noop c')]")
    path = env.services.store.dir(first) / "journal.jsonl"
    raw = path.read_bytes()
    path.write_bytes(raw[: raw.rstrip(b"\n").rfind(b"\n") + 1] + b'{"key": "torn-by-a-cra')   # the last entry torn
    before = len(spawns(tmp_path))
    second = await resume_to_end(env, first)
    assert [agent_json(env, second, n)["replayed"] for n in (1, 2, 3)] == [True, True, False]
    assert len(spawns(tmp_path)) == before + 1
    log = [e["message"] for e in env.services.store.recent_log(second, 50)]
    assert any("1 torn journal line(s)" in m for m in log)


async def test_journal_of_unknown_version_refuses_resume(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    first = await run_to_end(env, "return await agent('noop')")
    path = env.services.store.dir(first) / "journal.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "v": 99})
    path.write_text("\n".join(lines) + "\n")
    from swarmbase.runs.supervisor import RunRefused
    with pytest.raises(RunRefused, match="schema version 99 is not supported"):
        env.services.supervisor.resume(env.cfg.caller("alice"), first.id, {})


async def test_resume_refuses_active_and_foreign_runs(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    sup = env.services.supervisor
    hold = tmp_path / "hold"
    hold.write_text("")
    run = sup.start(env.cfg.caller("alice"), {"script": f"return await agent('waitfile:{hold}')"})
    from swarmbase.runs.supervisor import RunRefused
    with pytest.raises(RunRefused, match="still"):
        sup.resume(env.cfg.caller("alice"), run.id, {})
    hold.unlink()
    with trio.fail_after(30):
        await sup.live[run.id].finished.wait()


async def test_fifty_notices_for_an_offline_caller_arrive_once_oldest_first(tmp_path: Path,
                                                                            nursery: trio.Nursery) -> None:
    path, tokens = write_config(tmp_path / "state", callers=["alice"], caller_extra={"maxActiveRuns": 50})
    env = Env(state=tmp_path / "state", tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    sup = env.services.supervisor
    runs = [sup.start(env.cfg.caller("alice"), {"script": f"return {i}"}) for i in range(50)]
    with trio.fail_after(120):
        for r in runs:
            if r.id in sup.live:
                await sup.live[r.id].finished.wait()
        queued = [n["eventId"] for n in env.services.outbox.pending("alice")]
        assert sorted(queued) == sorted(f"{r.id}:end" for r in runs)
        async with connect(env.ws, tokens["alice"]) as h:
            await h.handshake()
            got = [(await h.notices.receive())["eventId"] for _ in range(50)]
            await trio.sleep(0.5)
            with pytest.raises(trio.WouldBlock):
                h.notices.receive_nowait()
        assert got == queued                          # oldest first, each once
        assert env.services.outbox.pending("alice") == []
        async with connect(env.ws, tokens["alice"]) as h:
            await h.handshake()
            await trio.sleep(0.5)
            with pytest.raises(trio.WouldBlock):
                h.notices.receive_nowait()


def test_resume_interrupted_on_boot(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "s", callers=["alice"], resumeInterruptedOnBoot=True)
    cfg = config.load(path)
    store = RunStore(cfg.state_dir)
    r = Run(id="run_0123456789ab", caller="alice", dir_name=RunStore.dir_name_for("run_0123456789ab", 0),
            created_at=0, status="running", args={"x": 1}, budget_usd=5)
    store.create(r, "return args.x + 1")

    async def main() -> None:
        env = Env(state=cfg.state_dir, tokens={}, cfg=cfg)
        async with trio.open_nursery() as n:
            await start_daemon(n, env)
            sup = env.services.supervisor
            assert sup.runs[r.id].status == "interrupted"
            [new] = [x for x in sup.runs.values() if x.resumed_from == r.id]
            with trio.fail_after(30):
                if new.id in sup.live:
                    await sup.live[new.id].finished.wait()
            assert new.status == "completed" and result_of(env, new) == 2
            n.cancel_scope.cancel()

    trio.run(main)


# -- kill -9 of the real daemon ---------------------------------------------------------

def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def live_pids_matching(needle: bytes) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and needle in cmdline(int(p.name))
            and pid_alive(int(p.name))]


@pytest.mark.timeout(180)
async def test_kill_9_during_a_10_agent_run_then_restart(tmp_path: Path) -> None:
    state, path, tokens, hold, script = held_fan_out(tmp_path, agents=10, quick=5)
    with trio.fail_after(150):
        proc, ws = await start_cli_daemon(path)
        try:
            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                run_id = (await h.tool("run", {"script": script, "args": {"hold": str(hold)}}))["structuredContent"]["runId"]
            run_dir = next((state / "runs").glob(f"*-{run_id}"))
            while len(spawns(tmp_path)) < 10 or len((run_dir / "journal.jsonl").read_text().splitlines()) < 6:
                await trio.sleep(0.05)
            records = [json.loads(p.read_text()) for p in process_records(state / "procs")]
            groups = [r["pgid"] for r in records]
            assert len(groups) == 6                    # 5 waiting agents + the runner
            proc.kill()                                # SIGKILL: no cleanup at all
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
        # Their parent-death signal ends the agents with the daemon; no reaper is needed.
        for _ in range(40):
            if not any(pid_alive(g) for g in groups):
                break
            await trio.sleep(0.05)
        assert not any(pid_alive(g) for g in groups)

        proc, ws = await start_cli_daemon(path)
        try:
            assert live_pids_matching(str(tmp_path / "bin" / "claude").encode()) == []
            assert process_records(state / "procs") == []
            run_json = json.loads((run_dir / "run.json").read_text())
            assert run_json["status"] == "interrupted"

            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                notice = await h.wait_notice(f"{run_id}:end")
                assert notice["tags"][-1] == "swarmbase:interrupted"
                assert notice["origin"]["endHash"] == run_json["end"]["hash"]        # sealed at boot
                await trio.sleep(0.5)
                assert end_notices(h) == [f"{run_id}:end"]     # exactly once
                hold.unlink()
                before = len(spawns(tmp_path))
                new_id = (await h.tool("resume", {"runId": run_id}))["structuredContent"]["runId"]
                done = await h.wait_notice(f"{new_id}:end")
                assert done["tags"][-1] == "swarmbase:completed"
                res = json.loads((await h.tool("result", {"runId": new_id}))["structuredContent"]["text"])
            assert res == ["noop"] * 5 + ["waited"] * 5
            # The five finished agents replayed: only the five unfinished ones spawned.
            assert len(spawns(tmp_path)) - before == 5
            new_dir = next((state / "runs").glob(f"*-{new_id}"))
            replayed = [json.loads((new_dir / "agents" / str(n) / "agent.json").read_text())["replayed"]
                        for n in range(1, 11)]
            assert replayed == [True] * 5 + [False] * 5
            async with connect(ws, tokens["alice"]) as h:      # nothing delivered twice
                await h.handshake()
                await trio.sleep(0.5)
                assert end_notices(h) == []
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()


def test_an_ended_runs_seal_and_history_stay_on_disk_until_needed(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    run = Run(id="run_0123456789ab", caller="alice", dir_name=RunStore.dir_name_for("run_0123456789ab", 0.0),
              created_at=0.0, status="running", history=[{"status": "running", "at": "t0"}])
    run.link = {"v": 1, "runId": run.id}
    run.set_status("completed", 1.0)
    run.end = {"hash": "h" * 64, "history": run.history}
    store.create(run, "return 1")
    store.save(run)
    before = run.to_json()
    run.stow_end(store.dir(run) / "run.json")
    assert not isinstance(run._end, (str, dict)) and not isinstance(run._link, (str, dict))
    assert isinstance(run._history, str)                      # packed, not dicts
    assert run.sealed and run.to_json() == before            # read back exactly, so a re-save keeps the seal
    run.resumed_as = "run_ba9876543210"
    store.save(run)
    assert json.loads((store.dir(run) / "run.json").read_text())["end"] == before["end"]
    (store.dir(run) / "run.json").write_text("{torn")
    with pytest.raises(OSError, match="cannot be read back"):
        run.to_json()                                        # never a record without its seal


async def test_agents_ending_together_share_one_journal_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A group commit (issue 33 item 4): while one line's fsync is under way, the lines of
    # agents that end meanwhile are written together by the next lock holder, one fsync for
    # all; every caller returns only once its own line is on disk.
    from types import SimpleNamespace

    from swarmbase import fsutil
    from swarmbase.runs.live import LiveRun

    path = tmp_path / "journal.jsonl"
    j = journal.Journal(path, "run_x", "d")
    syncs: list[int] = []
    real = fsutil.fsync_file

    def slow_fsync(p: Path) -> None:
        syncs.append(len(path.read_text().splitlines()))
        import time
        time.sleep(0.2)                       # the first fsync holds the lock while others arrive
        real(p)

    monkeypatch.setattr(fsutil, "fsync_file", slow_fsync)
    live = SimpleNamespace(journal=j, journal_lock=trio.Lock(), journal_waiting=[], run=SimpleNamespace(id="run_x"))
    returned: list[int] = []

    async def one(n: int) -> None:
        await LiveRun.journal_append(live, {"key": f"k{n}", "n": n, "ok": True})  # type: ignore[arg-type]
        returned.append(n)
        assert f'"k{n}"' in path.read_text()            # on disk when it returns

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            await trio.sleep(0.05)
            for n in range(1, 6):
                nursery.start_soon(one, n)
    assert sorted(returned) == list(range(6))
    assert len(syncs) == 2 and syncs == [2, 7]          # header + line 0; then lines 1-5 together
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[1]["n"] == 0 and sorted(e["n"] for e in lines[2:]) == [1, 2, 3, 4, 5]
