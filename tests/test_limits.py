"""Hostile runs against the real daemon: a run cannot take the host's memory, hold the
daemon forever, flood it with phases and logs, or kill itself with malformed agent()
calls. Each limit ends that one run with a message naming it; other callers are served."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from swarmbase import config

from .conftest import Env, fake_daemon, result_of, run_to_end, start_daemon, write_config


async def limited(tmp_path: Path, nursery: trio.Nursery, **extra: Any) -> Env:
    path, tokens = write_config(tmp_path / "state", **extra)
    env = Env(state=tmp_path / "state", tokens=tokens, cfg=config.load(path))
    return await start_daemon(nursery, env)


# A failing agent() call is a cheap way to yield to the daemon between slices (no engine
# is configured here), which is what dodges the per-slice watchdog.
YIELD = "try { await agent('x'); } catch (e) {}"


async def test_array_buffer_bomb_across_slices_hits_the_memory_limit(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await limited(tmp_path, nursery, runnerMemoryMb=256)
    script = f"""
const keep = [];
for (let i = 0; i < 200; i++) {{
  keep.push(new Uint8Array(24 << 20).fill(1));
  {YIELD}
}}
return keep.length;"""
    run = await run_to_end(env, script, timeout=60)
    assert run.status == "failed"
    assert "the script exceeded its memory limit" in run.error
    # The daemon is untouched: the next run works.
    assert (await run_to_end(env, "return 1")).status == "completed"


async def test_run_wall_clock_limit(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await limited(tmp_path, nursery)
    run = await run_to_end(env, f"for (;;) {{ {YIELD} }}", timeout=60, timeoutMs=2000)
    assert run.status == "failed"
    assert "exceeded its time limit of 2000 ms" in run.error
    sup = env.services.supervisor
    with pytest.raises(Exception, match="above this caller's runTimeoutMaxMs"):
        sup.start(env.cfg.caller("alice"), {"script": "return 1", "timeoutMs": 10 ** 12})


async def test_runner_cpu_limit(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await limited(tmp_path, nursery, runnerCpuSeconds=2)
    script = f"for (;;) {{ let x = 0; for (let i = 0; i < 2e6; i++) x += i; {YIELD} }}"
    run = await run_to_end(env, script, timeout=90)
    assert run.status == "failed"
    assert "exceeded its CPU limit of 2 s (runnerCpuSeconds)" in run.error


async def test_phase_and_log_floods_are_capped_and_do_not_stall_others(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await limited(tmp_path, nursery, maxPhasesPerRun=500, maxLogBytesPerRun=200_000)
    sup = env.services.supervisor
    phases = sup.start(env.cfg.caller("alice"), {"script": "for (let i = 0; i < 5000; i++) phase('p' + i); return 1"})
    logs = sup.start(env.cfg.caller("alice"), {"script": "for (;;) { log('x'.repeat(1000)); " + YIELD + " }"})
    other = await run_to_end(env, "phase('one'); log('hello'); return 7", caller="bob")
    assert other.status == "completed"
    with trio.fail_after(60):
        for run in (phases, logs):
            if run.id in sup.live:
                await sup.live[run.id].finished.wait()
    assert phases.status == "failed" and "more than 500 phases (maxPhasesPerRun in the daemon config lifts it)" in phases.error
    assert logs.status == "failed" and "more than 200,000 bytes (maxLogBytesPerRun)" in logs.error
    on_disk = json.loads((sup.env.store.dir(phases) / "phases.json").read_text())
    assert len(on_disk) == 500
    # status reads the log's tail only, whatever its size.
    from swarmbase.mcpl import tools
    st = tools.call(sup, env.cfg.caller("alice"), {"name": "status", "arguments": {"runId": logs.id, "logLines": 3}})
    lines = st["structuredContent"]["log"]
    assert len(lines) == 3 and "maxLogBytesPerRun" in lines[-1]["message"]


@pytest.mark.parametrize("opts,message", [
    ("{ cwd: '/tmp/a\\u0000b' }", "opts.cwd must be a plain absolute path"),
    ("{ cwd: '/proc/1/cwd' }", "is not inside this caller's cwdRoots"),
    ("{ cwd: '/proc/self/root/etc' }", "is not inside this caller's cwdRoots"),
    ("{ schema: { type: 'object', description: 'x'.repeat(200000) } }", "the claude engine takes at most"),
    ("{ timeoutMs: 1e400 }", "opts.timeoutMs"),
])
async def test_malformed_agent_calls_throw_catchably(tmp_path: Path, nursery: trio.Nursery, opts: str,
                                                     message: str) -> None:
    env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, f"try {{ await agent('noop', {opts}); return 'ran'; }} catch (e) {{ return e.message; }}")
    assert run.status == "completed", run.error
    text = result_of(env, run)
    assert message in text
    assert "resolved to" not in text and "/proc/1" not in text.replace("/proc/1/cwd", "")


async def test_non_finite_run_parameters_are_refused(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A script's args that cannot cross the bridge (or a line the runner cannot parse)
    fail the run at once instead of holding its slot for ever."""
    env = await limited(tmp_path, nursery)
    run = await run_to_end(env, "return args", args={"x": float("nan"), "y": [float("inf")]}, timeout=30)
    assert run.status == "completed"
    assert result_of(env, run) == {"x": None, "y": [None]}
