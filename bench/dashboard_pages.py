"""Dashboard page figures: the run list at 10,000 runs, a run page with 200 agents.

    python3 bench/dashboard_pages.py [--runs 10000] [--agents 200] [--streaming 50]

List: 10,000 generated run dirs, the daemon (`python -m swarmbase`) booted over them;
first byte and full response time of `/`, a search and a deep page over HTTP (median of
20), and in headless Chromium the navigation's first byte, DOMContentLoaded and load.

Run page: an in-process daemon (the hub must be reachable to publish live usage, as the
core will) with a run of 200 agents, 50 of them held running; server render time over
HTTP, Chromium's load and first timeline render, then the page's frame times over 10 s
while the 50 agents stream usage at 2 updates/s each plus transcript lines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import gen_runs  # noqa: E402
from tests.conftest import write_config  # noqa: E402

FRAMES_JS = """
window.__frames = []; window.__long = [];
new PerformanceObserver(l => { for (const e of l.getEntries()) window.__long.push(e.duration); })
  .observe({type: 'longtask', buffered: false});
let last = performance.now();
function f(t) { window.__frames.push(t - last); last = t; if (window.__frames.length < 100000) requestAnimationFrame(f); }
requestAnimationFrame(f);
"""


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))]


def chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--disable-background-timer-throttling",
                 "--disable-renderer-backgrounding"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=opts)


def nav_timing(driver: Any, url: str) -> dict[str, float]:
    driver.get(url)
    return driver.execute_script(
        "const n = performance.getEntriesByType('navigation')[0];"
        "const m = performance.getEntriesByName('sb-rendered')[0];"
        "return {ttfb: n.responseStart - n.requestStart, response: n.responseEnd - n.requestStart,"
        " dcl: n.domContentLoadedEventEnd - n.startTime, load: n.loadEventEnd - n.startTime,"
        " rendered: m ? m.startTime : null}")


async def timed_get(c: httpx.AsyncClient, url: str) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    async with c.stream("GET", url) as r:
        first = None
        size = 0
        async for chunk in r.aiter_raw():
            if first is None:
                first = time.perf_counter()
            size += len(chunk)
    return ((first or time.perf_counter()) - t0) * 1000, (time.perf_counter() - t0) * 1000, size


async def list_bench(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-list-"))
    state = tmp / "state"
    t0 = time.perf_counter()
    runs = gen_runs.generate(state, n)
    cfg, _ = write_config(state, callers=list(gen_runs.CALLERS))
    print(f"generated {n:,} run dirs in {time.perf_counter() - t0:.1f} s")
    env = dict(os.environ, SWARMBASE_CONFIG=str(cfg))
    proc = await trio.lowlevel.open_process([sys.executable, "-m", "swarmbase"], env=env, stderr=subprocess.PIPE)
    try:
        buf = b""
        t0 = time.perf_counter()
        while b"listening on" not in buf:
            buf += await proc.stderr.receive_some(4096)
        url = buf.split(b"listening on ", 1)[1].split(b" ", 1)[0].decode()
        print(f"daemon booted over them in {time.perf_counter() - t0:.1f} s")
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await c.get("/")                                # warm the index
            deep = sorted(runs, key=lambda r: -r.created_at)[n // 2]
            cursor = f"{deep.created_at!r}~{deep.id}"
            for name, path in (("list, first page", "/"), ("search ?q=", "/?q=nightly+build+4242"),
                               ("filter status+caller", "/?status=failed&caller=bob"),
                               (f"page at run {n // 2:,}", f"/?before={cursor}")):
                samples = [await timed_get(c, path) for _ in range(20)]
                print(f"{name:24} first byte {med([s[0] for s in samples]):6.1f} ms, full response "
                      f"{med([s[1] for s in samples]):6.1f} ms (median of 20, {samples[0][2] // 1024} KB)")
        driver = await trio.to_thread.run_sync(chromium)
        try:
            await trio.to_thread.run_sync(nav_timing, driver, url + "/")      # warm up
            timings = []
            for _ in range(5):
                timings.append(await trio.to_thread.run_sync(nav_timing, driver, url + "/"))
            print(f"Chromium, list of {n:,} runs: first byte {med([t['ttfb'] for t in timings]):.1f} ms, "
                  f"DOMContentLoaded {med([t['dcl'] for t in timings]):.1f} ms, "
                  f"load (full render) {med([t['load'] for t in timings]):.1f} ms (median of 5)")
        finally:
            await trio.to_thread.run_sync(driver.quit)
    finally:
        proc.terminate()
        await proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


async def run_page_bench(agents: int, streaming: int) -> None:
    from tests.conftest import fake_daemon
    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-runpage-"))
    async with trio.open_nursery() as nursery:
        env = await fake_daemon(tmp, nursery, perRunConcurrency=streaming, maxConcurrentAgents=streaming,
                                maxAgentsPerRun=agents)
        sup = env.services.supervisor
        gate = tmp / "gate"
        gate.write_text("")
        script = (f"phase('fan out');\nreturn (await parallel(Array.from({{length: {agents}}}, (_, i) => () => "
                  f"agent(i < {agents - streaming} ? 'noop ' + i : 'waitfile:{gate} ' + i, "
                  f"{{label: 'agent ' + i, maxUsd: 0.05}})))).length")
        run = sup.start(env.cfg.caller("alice"), {"script": script, "budgetUsd": 20})
        with trio.fail_after(300):
            while True:
                live = sup.live[run.id]
                if sum(1 for a in live.agents.values() if a.state == "running") == streaming and \
                        len(live.agents) == agents:
                    break
                await trio.sleep(0.2)
        page = f"{env.url}/runs/{run.id}"
        async with httpx.AsyncClient(timeout=60) as c:
            samples = [await timed_get(c, page) for _ in range(10)]
        print(f"run page, {agents} agents ({streaming} running): server first byte "
              f"{med([s[0] for s in samples]):.1f} ms, full response {med([s[1] for s in samples]):.1f} ms "
              f"({samples[0][2] // 1024} KB, median of 10)")
        driver = await trio.to_thread.run_sync(chromium)
        try:
            await trio.to_thread.run_sync(nav_timing, driver, page)           # warm up
            timings = [await trio.to_thread.run_sync(nav_timing, driver, page) for _ in range(5)]
            print(f"Chromium: first byte {med([t['ttfb'] for t in timings]):.1f} ms, DOMContentLoaded "
                  f"{med([t['dcl'] for t in timings]):.1f} ms, timeline drawn "
                  f"{med([t['rendered'] for t in timings]):.1f} ms, load {med([t['load'] for t in timings]):.1f} ms "
                  f"(median of 5)")
            await trio.to_thread.run_sync(driver.execute_script, FRAMES_JS)
            running = [a for a in sup.live[run.id].agents.values() if a.state == "running"]
            t_end = trio.current_time() + 10
            tick = 0
            events = 0
            while trio.current_time() < t_end:
                for rec in running:                        # 2 updates/s each, spread over the half second
                    sup.events.publish(run.id, "agent", {**rec.row(), "phase": rec.phase, "estimated": True,
                                                         "costUsd": 0.0004 * tick, "tokens": 1000 * tick})
                    sup.events.publish_agent_line(run.id, rec.n, {"type": "assistant", "message": {
                        "content": [{"type": "text", "text": f"step {tick}"}]}})
                    events += 2
                    await trio.sleep(0.5 / len(running))
                tick += 1
            frames, longs = await trio.to_thread.run_sync(
                driver.execute_script, "return [window.__frames.slice(2), window.__long]")
            cost = await trio.to_thread.run_sync(
                driver.execute_script, f"return document.querySelector('#agent-{running[0].n} .cost').textContent")
            print(f"while {streaming} agents stream ({events} events in 10 s, {tick * streaming / 10:.0f} "
                  f"agent rows/s): {len(frames)} frames, frame time median {med(frames):.1f} ms, "
                  f"p95 {pct(frames, 0.95):.1f} ms, max {max(frames):.1f} ms; {len(longs)} long tasks "
                  f"({sum(longs):.0f} ms); last cost shown {cost}")
        finally:
            await trio.to_thread.run_sync(driver.quit)
            gate.unlink()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--agents", type=int, default=200)
    p.add_argument("--streaming", type=int, default=50)
    p.add_argument("--only", choices=["list", "run"], default=None)
    a = p.parse_args()
    if a.only != "run":
        trio.run(list_bench, a.runs)
    if a.only != "list":
        trio.run(run_page_bench, a.agents, a.streaming)
