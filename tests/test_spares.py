"""Warm spare script runners (runs/spares.py): single-use, replaced after every run and
after a crash, never handed a second script, the same sandboxed process a cold start makes.

Real daemon, real node under bubblewrap; the retry pause is checked under MockClock.
"""

from __future__ import annotations

import json
import os
import signal
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import pytest
import trio
import trio.testing

from swarmbase import config
from swarmbase.script.runner import RUNNER_ENV, runner_spec
from swarmbase.runs.runners import spare_spec
from swarmbase.runs.spares import Spare, SpareRunners, alive

from .conftest import Env, direct, run_to_end, start_daemon, write_config
from .fakes.agents import Parked


@pytest.fixture
def spare_env(tmp_path: Path) -> Env:
    path, tokens = write_config(tmp_path / "state", spareRunners=1)
    cfg = config.load(path)
    assert cfg.sandbox_mode == "bwrap"
    return Env(state=tmp_path / "state", tokens=tokens, cfg=cfg)


async def ready_spare(pool: SpareRunners, other_than: int | None = None) -> Spare:
    """Wait until a spare (other than the one with pid `other_than`) is waiting."""
    while not pool.ready or pool.ready[0].proc.pid == other_than:
        await trio.sleep(0.02)
    return pool.ready[0]


async def gone(pid: int) -> None:
    while os.path.exists(f"/proc/{pid}"):
        await trio.sleep(0.02)


async def test_a_run_takes_the_spare_and_a_new_one_replaces_it(spare_env: Env, nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, spare_env)
    pool = env.services.runners.spares
    assert pool is not None
    with trio.fail_after(60):
        first = await ready_spare(pool)
        run = await run_to_end(env, "return 6 * 7")
        assert run.status == "completed", run.error
        assert env.services.store.result_text(run) == "42"
        assert pool.handed_out == 1 and first.taken and first.used
        assert first.key.startswith("spare-")
        await gone(first.proc.pid)                       # killed with its run, like a cold runner
        assert not (env.state / "procs" / f"{first.key}.json").exists()
        second = await ready_spare(pool, other_than=first.proc.pid)
        assert second is not first and not second.taken
        # The next run gets the new spare, never the old process again.
        run2 = await run_to_end(env, "return 'again'")
        assert run2.status == "completed", run2.error
        assert pool.handed_out == 2 and second.used
        await gone(second.proc.pid)


async def test_a_spare_that_dies_waiting_is_replaced(spare_env: Env, nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, spare_env)
    pool = env.services.runners.spares
    with trio.fail_after(60):
        doomed = await ready_spare(pool)
        os.killpg(doomed.proc.pid, signal.SIGKILL)        # the sandbox and node in it
        fresh = await ready_spare(pool, other_than=doomed.proc.pid)
        assert pool.died == 1 and not doomed.used
        assert alive(fresh.proc)
        run = await run_to_end(env, "return 1")
        assert run.status == "completed", run.error
        assert fresh.used and not doomed.used


async def test_a_dead_spare_is_never_handed_out(spare_env: Env, nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, spare_env)
    pool = env.services.runners.spares
    with trio.fail_after(60):
        doomed = await ready_spare(pool)
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        while alive(doomed.proc):
            await trio.sleep(0.01)
        # Taken before its keeper noticed: refused, so a run never gets a dead runner.
        assert pool.take() is None
        assert pool.handed_out == 0
        run = await run_to_end(env, "return 'cold'")     # started cold (or on the replacement)
        assert run.status == "completed", run.error


async def test_a_cancelled_run_kills_its_spare(spare_env: Env, nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, spare_env, agents=Parked())
    sup = env.services.supervisor
    with trio.fail_after(60):
        spare = await ready_spare(env.services.runners.spares)
        record = env.state / "procs" / f"{spare.key}.json"
        assert json.loads(record.read_text())["spare"] is True
        run = sup.start(env.cfg.caller("alice"), {"script": "await agent('forever'); return 1"})
        live = sup.live[run.id]
        await sup.agents.started.wait()
        assert spare.used and alive(spare.proc)
        # Its process record now names the run it serves (same pgid for the boot reaper).
        noted = json.loads(record.read_text())
        assert noted["runId"] == run.id and noted["spare"] == "taken" and noted["pgid"] == spare.proc.pid
        sup.cancel(run)
        await live.finished.wait()
        assert run.status == "cancelled"
        # The run ends only after its runner's group is dead and reaped.
        assert not os.path.exists(f"/proc/{spare.proc.pid}")


async def test_each_run_gets_its_own_runner_and_a_spare_is_used_once(spare_env: Env,
                                                                       nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, spare_env)
    pool = env.services.runners.spares
    pids = []
    with trio.fail_after(90):
        for i in range(3):
            spare = await ready_spare(pool, other_than=pids[-1] if pids else None)
            pids.append(spare.proc.pid)
            run = await run_to_end(env, f"return {i}")
            assert run.status == "completed" and env.services.store.result_text(run) == str(i)
            assert spare.used
            with pytest.raises(RuntimeError, match="used once"):
                async with spare.use():
                    pass
    assert len(set(pids)) == 3 and pool.handed_out == 3


def test_the_runner_refuses_a_second_script() -> None:
    start = {"t": "start", "script": "return await agent('x')", "args": None, "budget": {}, "sliceMs": 1000}
    second = {**start, "script": "return 'someone else'"}
    got = direct([start, second], until=lambda m: m["t"] == "done")
    done = [m for m in got if m["t"] == "done"]
    assert done and done[0]["ok"] is False and "a second script" in done[0]["error"]
    assert not any(m.get("value") == "someone else" for m in got)


def test_a_spare_is_the_runner_a_cold_start_makes(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "state", runnerMemoryMb=300, runnerCpuSeconds=77)
    cfg = config.load(path)
    cold = runner_spec(key="run_x-runner", memory_mb=300, cpu_seconds=77, record={"runId": "run_x"})
    warm = spare_spec(cfg)("spare-1")
    assert attrs.evolve(warm, key=cold.key, record=cold.record) == cold
    assert warm.network is False and dict(warm.env) == RUNNER_ENV
    assert "runId" not in warm.record


class FailingLauncher:
    def __init__(self) -> None:
        self.attempts: list[float] = []

    @asynccontextmanager
    async def open(self, spec: Any, **kw: Any) -> AsyncIterator[Any]:
        self.attempts.append(trio.current_time())
        raise OSError(2, "No such file or directory", "node")
        yield  # pragma: no cover


async def test_a_runner_that_cannot_start_is_retried_with_a_growing_pause(autojump_clock: Any) -> None:
    launcher = FailingLauncher()
    pool = SpareRunners(launcher, lambda key: runner_spec(key=key, memory_mb=64, cpu_seconds=1, record={}))
    with trio.move_on_after(300):
        await pool.serve()
    gaps = [b - a for a, b in zip(launcher.attempts, launcher.attempts[1:])]
    assert gaps[:4] == pytest.approx([0.5, 1.0, 2.0, 4.0])
    assert max(gaps) == pytest.approx(60.0)              # capped: never a fork loop, never silent for long
    assert pool.ready == [] and pool.take() is None


def test_spare_runners_config_key(tmp_path: Path) -> None:
    path, _ = write_config(tmp_path / "state")
    assert config.load(path).spareRunners == 1
    data = json.loads(path.read_text())
    data["spareRunners"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(config.ConfigError, match="spareRunners"):
        config.load(path)
