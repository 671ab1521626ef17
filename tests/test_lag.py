"""The event-loop lag probe (swarmbase/lag.py) and where the daemon serves its figures."""

from __future__ import annotations

import time

import httpx
import trio
import trio.testing

from swarmbase.lag import LagProbe

from .conftest import Env, start_daemon


def test_figures_over_the_window() -> None:
    p = LagProbe(window=100)
    assert p.figures() == {"samples": 0, "p50Ms": None, "p99Ms": None, "maxMs": None}
    p.samples.extend([0.001] * 98 + [0.2, 0.5])
    assert p.figures() == {"samples": 100, "p50Ms": 1.0, "p99Ms": 200.0, "maxMs": 500.0}
    p.samples.extend([0.002] * 100)                 # the window moves on: old lag is forgotten
    assert p.figures()["maxMs"] == 2.0


async def test_it_ticks_fast_only_while_the_daemon_is_busy(autojump_clock: trio.testing.MockClock) -> None:
    busy = [False]
    p = LagProbe(busy=lambda: busy[0])
    async with trio.open_nursery() as n:
        n.start_soon(p.run)
        await trio.sleep(10)
        idle = len(p.samples)
        busy[0] = True
        await trio.sleep(10)
        n.cancel_scope.cancel()
    assert 9 <= idle <= 11                                  # one a second while idle
    assert len(p.samples) - idle >= 90                      # one every 100 ms while busy


async def test_a_step_that_holds_the_loop_shows_as_lag() -> None:
    p = LagProbe(tick=0.005)
    async with trio.open_nursery() as n:
        n.start_soon(p.run)
        while len(p.samples) < 3:
            await trio.sleep(0.005)
        time.sleep(0.15)                            # a blocking call on the loop (what the probe is for)
        before = len(p.samples)
        while len(p.samples) == before:
            await trio.sleep(0.005)
        n.cancel_scope.cancel()
    assert p.figures()["maxMs"] >= 140              # it can only be later than that, never earlier


async def test_the_daemon_serves_its_lag(env: Env, nursery: trio.Nursery) -> None:
    env = await start_daemon(nursery, env)
    with trio.fail_after(20):
        while not env.services.lag.samples:
            await trio.sleep(0.01)
        async with httpx.AsyncClient(base_url=env.url) as c:
            lag = (await c.get("/streams", headers={"Host": "127.0.0.1"})).json()["loopLag"]
    assert lag["samples"] >= 1 and lag["p99Ms"] >= lag["p50Ms"] >= 0
