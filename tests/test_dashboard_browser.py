"""The dashboard in a real browser: Debian's headless Chromium driven by Selenium
(installed by tests/install.sh). Missing Chromium fails these tests; it never skips them.

The daemon runs in the test's Trio loop; Selenium's blocking calls run in a thread so the
daemon keeps serving meanwhile (tests/browser.py). Live usage and transcript lines are published through the
hub from the test (hub.publish / hub.publish_agent_line), as the core will once it streams
them. Every page is checked for console errors (a CSP violation is one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from swarmbase import config
from swarmbase.admin import AdminStore
from swarmbase.runs.live import publish_row

from . import gen_runs
from .browser import ADMIN, console_errors, in_thread, wait_for
from .conftest import Env, fake_daemon, run_to_end, start_daemon, wait_state, write_config

def sign_in(driver: Any, env: Env) -> None:
    """The admin-link flow in the browser: open the link, press the button."""
    from selenium.webdriver.common.by import By
    link = AdminStore(env.state).create_link(ADMIN)
    driver.get(f"{env.url}/admin/login/{link}")
    driver.find_element(By.CSS_SELECTOR, "form button").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "runs"))


def held_row(env: Env, run: Any, n: int, **change: Any) -> None:
    """Publish a running agent's live usage the way the core will (the contract's `agent` event)."""
    rec = env.services.supervisor.live[run.id].agents[n]
    env.services.supervisor.env.events.publish(run.id, "agent", {**rec.row(), "phase": rec.phase, **change})


@pytest.mark.timeout(180)
async def test_live_run_page_in_chromium(tmp_path: Path, nursery: trio.Nursery, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery, dashboard={"adminLogins": [ADMIN]})
    sup = env.services.supervisor
    g1, g2 = tmp_path / "g1", tmp_path / "g2"
    g1.write_text("")
    g2.write_text("")
    script = ("export const meta = {name: 'live page'};\nphase('warm');\nawait agent('noop', {label: 'first'});\n"
              "phase('idle');\nphase('work');\n"
              f"const r = await parallel([() => agent('waitfile:{g1}', {{label: 'held-a'}}),\n"
              f"  () => agent('waitfile:{g2}', {{label: 'held-b'}})]);\nreturn r;")
    run = sup.start(env.cfg.caller("alice"), {"script": script, "args": {"ticket": 42}})
    await wait_state(env, run, 3, "running")
    await wait_state(env, run, 2, "running")

    def open_page() -> None:
        sign_in(browser, env)
        browser.get(f"{env.url}/runs/{run.id}")
        browser.execute_script("window.__noReload = true;")
        wait_for(browser, lambda d: "live" in d.find_element(By.ID, "conn").get_attribute("class"))
        # The axis has ticks, labelled relative to the start, wall time on hover.
        ticks = browser.find_elements(By.CSS_SELECTOR, "#timeline .tl-tick")
        assert len(ticks) >= 2 and ticks[0].text.startswith("+") and ticks[0].get_attribute("title")
        assert browser.find_element(By.CSS_SELECTOR, "#timeline .tl-now").is_displayed()   # live: a "now" cursor
        # Bars in start order, top first.
        order = browser.execute_script(
            "return [...document.querySelectorAll('#timeline .tl-row')].map(r => [r.dataset.n, Number(r.dataset.start)])")
        assert order[0][0] == "1" and [s for _, s in order] == sorted(s for _, s in order)
        assert {n for n, _ in order} == {"1", "2", "3"}
        # Waiting is drawn apart from running: agent 1 has a queued span and a done span.
        kinds = browser.execute_script(
            "return [...document.querySelectorAll('#bar-1 .seg')].map(s => s.className)")
        assert kinds[-1] == "seg s-done" and any("s-queued" in k for k in kinds)
        # The title carries status; the script is highlighted; the args are shown; empty phase collapsed.
        assert browser.title.startswith("● 1/3 running — live page")
        assert browser.find_elements(By.CSS_SELECTOR, "#script .ln .k-api")
        assert '"ticket": 42' in browser.find_element(By.ID, "args").text
        assert browser.find_element(By.CSS_SELECTOR, 'details.empty-phase[data-phase="idle"]')
        assert not console_errors(browser)

    await in_thread(open_page)
    held_row(env, run, 2, costUsd=0.01234, tokens=5_000, estimated=True)

    def cost_changes() -> None:
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-2 .cost").text == "~$0.0123")
        assert browser.find_element(By.CSS_SELECTOR, "#agent-2 .tokens").text == "5,000"

    await in_thread(cost_changes)
    held_row(env, run, 2, costUsd=0.05, tokens=9_000, estimated=True)
    held_row(env, run, 3, costUsd=0.0, tokens=1_000, estimated=False, priced=False, engine="codex")

    def cost_changes_again() -> None:
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-2 .cost").text == "~$0.0500")
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-3 .cost").text == "no price")
        # The totals add the amounts shown, per phase and per engine.
        wait_for(browser, lambda d: "~$0.0600" in d.find_element(By.ID, "by-phase").text)
        assert "+1 no price" in browser.find_element(By.ID, "by-phase").text
        assert "codex" in browser.find_element(By.ID, "by-engine").text
        dur = browser.find_element(By.CSS_SELECTOR, "#agent-2 .adur").text
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-2 .adur").text != dur)   # ticking
        # Hovering a bar says what it is.
        from selenium.webdriver.common.action_chains import ActionChains
        ActionChains(browser).move_to_element(browser.find_element(By.ID, "tl-2")).perform()
        tip = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#timeline .tl-tip"))
        wait_for(browser, lambda d: tip.is_displayed())
        assert "held-a" in tip.text and "state: running" in tip.text and "~$0.0500" in tip.text
        # Drag across the axis to zoom, double-click to reset.
        axis = browser.find_element(By.CSS_SELECTOR, "#timeline .tl-axis")
        ActionChains(browser).move_to_element_with_offset(axis, -200, 0).click_and_hold() \
            .move_by_offset(150, 0).release().perform()
        wait_for(browser, lambda d: "zoomed to" in d.find_element(By.CSS_SELECTOR, "#timeline .tl-zoom").text)
        assert browser.execute_script("return window.__noReload === true")
        browser.save_screenshot(str(tmp_path / "dashboard-run.png"))

    await in_thread(cost_changes_again)
    # Rows only the merged core produces yet (replays with their original duration, budget
    # waits, nested workflows), and an overspent run, published as the core will.
    t = run.created_at
    base = {"engine": "claude", "model": None, "costUsd": 0.0, "estimated": False, "priced": True, "tokens": 0,
            "phase": "work", "error": None}
    hub = sup.env.events
    hub.publish(run.id, "agent", {**base, "n": 90, "label": "replayed-one", "state": "done", "replayed": True,
                                  "queuedAt": t, "startedAt": t, "endedAt": t, "durationS": 0.0,
                                  "originalDurationS": 2.0})
    hub.publish(run.id, "agent", {**base, "n": 91, "label": "budget-wait", "state": "queued", "queuedAt": t + 0.2})
    hub.publish(run.id, "agent", {**base, "n": 91, "label": "budget-wait", "state": "waiting-budget",
                                  "queuedAt": t + 0.2})
    hub.publish(run.id, "agent", {**base, "n": 92, "label": "nested", "state": "running", "workflow": "3",
                                  "queuedAt": t + 0.3, "startedAt": t + 0.4})
    hub.publish(run.id, "run", {**run.summary(), "caller": "alice", "createdAtEpoch": t, "endedAtEpoch": None,
                                "spentUsd": 6.0, "reservedUsd": 0.5, "budgetUsd": 5.0})

    def other_rows() -> None:
        browser.find_element(By.CSS_SELECTOR, "#timeline .tl-head button").click()      # reset the zoom
        seg = wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#bar-90 .seg.replayed"))
        track = browser.find_element(By.ID, "bar-90").size["width"]
        span = browser.execute_script("return [...document.querySelectorAll('#timeline .tl-tick')].length")
        assert span >= 2 and seg.size["width"] > track * 0.05       # 2 s of a ~10 s axis, not a sliver
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#bar-91 .seg.s-waiting-budget"))
        assert browser.find_elements(By.CSS_SELECTOR, "#bar-91 .seg.s-queued")       # queued, then budget
        assert "waiting-budget" in browser.find_element(By.ID, "agent-91").text
        # Nested workflows get their own collapsible lane.
        lane = browser.find_element(By.CSS_SELECTOR, '#timeline .tl-lane[data-workflow="3"]')
        assert "workflow 3" in lane.text and lane.find_element(By.ID, "tl-92")
        lane.find_element(By.CSS_SELECTOR, ".tl-lane-head button").click()
        assert not browser.find_element(By.ID, "tl-92").is_displayed()
        # Overspend is highlighted.
        wait_for(browser, lambda d: d.find_element(By.ID, "overspent").is_displayed())
        assert "over" in browser.find_element(By.ID, "usd-meter").get_attribute("class")
        assert "spent $6.0000 · reserved $0.5000 · budget $5.0000" in browser.find_element(By.ID, "usd-figures").text
        assert not console_errors(browser)

    await in_thread(other_rows)
    shot = tmp_path / "dashboard-run.png"
    assert shot.exists() and shot.stat().st_size > 10_000

    def open_agent_page() -> int:
        browser.get(f"{env.url}/runs/{run.id}/agents/2")
        browser.execute_script("window.__noReload = true;")
        wait_for(browser, lambda d: "live" in d.find_element(By.ID, "conn").get_attribute("class"))
        return len(browser.find_elements(By.CSS_SELECTOR, "#transcript .ti"))

    before = await in_thread(open_agent_page)
    for i in range(3):
        hub.publish_agent_line(run.id, 2, {"type": "assistant", "message": {
            "content": [{"type": "text", "text": f"streamed hello {i}"}]}})
    held_row(env, run, 2, costUsd=0.07, tokens=12_345, estimated=True)

    def transcript_grows() -> None:
        wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#transcript .ti")) == before + 3)
        assert "streamed hello 2" in browser.find_element(By.ID, "transcript").text
        wait_for(browser, lambda d: d.find_element(By.ID, "agent-cost").text == "~$0.0700")
        assert browser.find_element(By.ID, "agent-tokens").text == "12,345"
        assert browser.title.startswith("● held-a — running")

    await in_thread(transcript_grows)
    g1.unlink()                       # agent 2 finishes: its state and final usage arrive live

    def finishes() -> None:
        wait_for(browser, lambda d: d.find_element(By.ID, "agent-state").text == "done")
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, '#usage [data-k="input"]').text not in ("", "0"))
        assert browser.execute_script("return window.__noReload === true")
        assert not console_errors(browser)

    await in_thread(finishes)
    raw = json.loads((env.services.store.dir(run) / "agents" / "2" / "agent.json").read_text())

    def skip_as_admin() -> None:
        assert browser.find_element(By.CSS_SELECTOR, '#usage [data-k="input"]').text == f"{raw['tokens']['input']:,}"
        browser.get(f"{env.url}/runs/{run.id}")
        browser.execute_script("window.__noReload = true;")
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-3 button.skip").click() or True)
        wait_for(browser, lambda d: "skipped" in d.find_element(By.ID, "agent-3").text)
        wait_for(browser, lambda d: "completed" in d.find_element(By.ID, "run-status").text)
        wait_for(browser, lambda d: d.title.startswith("✓ live page — completed"))
        assert not browser.find_element(By.CSS_SELECTOR, "#timeline .tl-now").is_displayed()
        assert browser.execute_script("return window.__noReload === true")
        # Why an agent ended, in its row without a click. (Live `agent` events carry `error`
        # once the core's rows do; the page shows it from the record meanwhile.)
        browser.refresh()
        assert "skipped by an admin" in browser.find_element(By.ID, "agent-3").text

    await in_thread(skip_as_admin)
    g2.unlink()
    assert run.status == "completed"


@pytest.mark.timeout(240)
async def test_run_list_pages_search_and_keys(tmp_path: Path, nursery: trio.Nursery, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    state = tmp_path / "state"
    runs = gen_runs.generate(state, 10_000)
    path, tokens = write_config(state, callers=list(gen_runs.CALLERS))
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    newest = sorted(runs, key=lambda r: -r.created_at)

    def page_ids(d: Any) -> list[str]:
        return d.execute_script("return [...document.querySelectorAll('#runs tr[data-created]')].map(r => r.id.slice(4))")

    def browse() -> None:
        browser.get(env.url + "/")
        assert page_ids(browser) == [r.id for r in newest[:150]]
        when = browser.find_element(By.CSS_SELECTOR, f"#run-{newest[0].id} .when")
        assert when.text and "UTC" not in when.text and when.get_attribute("title")    # relative, wall time on hover
        browser.find_element(By.ID, "next-page").click()
        wait_for(browser, lambda d: page_ids(d)[:1] == [newest[150].id])
        assert page_ids(browser) == [r.id for r in newest[150:300]]
        # Search by label, from the search box.
        box = browser.find_element(By.ID, "q")
        box.clear()
        box.send_keys("nightly build 4242", Keys.ENTER)
        wait_for(browser, lambda d: page_ids(d) == [runs[4242].id])
        # Keys: / focuses search; j selects, Enter opens.
        browser.get(env.url + "/?caller=bob&status=failed")
        ids = page_ids(browser)
        assert ids and all(r.caller == "bob" and r.status == "failed" for r in runs if r.id in ids)
        body = browser.find_element(By.TAG_NAME, "body")
        body.send_keys("j")
        body.send_keys("j")
        assert "selected" in browser.find_element(By.ID, f"run-{ids[1]}").get_attribute("class")
        body.send_keys(Keys.ENTER)
        wait_for(browser, lambda d: d.current_url.endswith(f"/runs/{ids[1]}"))
        browser.back()
        wait_for(browser, lambda d: d.find_element(By.ID, "q"))
        browser.find_element(By.TAG_NAME, "body").send_keys("/")
        assert browser.switch_to.active_element.get_attribute("id") == "q"
        assert not console_errors(browser)

    await in_thread(browse)


@pytest.mark.timeout(240)
async def test_clicking_through_twelve_run_pages_never_stalls(tmp_path: Path, nursery: trio.Nursery,
                                                              browser: Any) -> None:
    """Browsers keep six HTTP/1.1 connections per origin; a page left in the back/forward
    cache with its stream open used to hold one, and every sixth page stalled ~60 s. One
    stream per tab: the server never holds more than the current page's (and the list's)."""
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery)
    sup = env.services.supervisor
    gate = tmp_path / "gate"
    gate.write_text("")
    runs = [sup.start(env.cfg.caller("alice"), {"script": f"return await agent('waitfile:{gate}')", "label": f"r{i}"})
            for i in range(2)]                    # two live runs (their pages stream events)
    for i in range(2, 12):
        runs.append(await run_to_end(env, "return 1", label=f"r{i}"))
    streams: list[int] = []

    async def count_streams() -> int:
        async with httpx.AsyncClient(base_url=env.url) as c:
            return (await c.get("/streams")).json()["streams"]

    def visit(i: int) -> None:
        if i == 0:
            browser.get(env.url + "/")
        else:
            browser.find_element(By.CSS_SELECTOR, "p.crumbs a[href='/']").click()
        wait_for(browser, lambda d: d.find_element(By.ID, f"run-{runs[i].id}"))
        browser.find_element(By.CSS_SELECTOR, f"#run-{runs[i].id} a").click()
        wait_for(browser, lambda d: d.current_url.endswith(f"/runs/{runs[i].id}"))
        wait_for(browser, lambda d: "live" in d.find_element(By.ID, "conn").get_attribute("class"), timeout=30)

    for i in range(12):
        await in_thread(visit, i)
        streams.append(await count_streams())
    gate.unlink()
    # The current page's stream, and at most one more closing as it was left.
    assert max(streams) <= 2, streams
    assert not await in_thread(console_errors, browser)


@pytest.mark.timeout(120)
async def test_run_list_updates_live_dark_and_phone_width(tmp_path: Path, nursery: trio.Nursery,
                                                          browser: Any) -> None:
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery)

    def open_list() -> None:
        browser.set_window_size(390, 844)                 # a phone
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        browser.get(env.url + "/")
        browser.execute_script("window.__noReload = true;")
        wait_for(browser, lambda d: "live" in d.find_element(By.ID, "conn").get_attribute("class"))
        # Dark theme follows the OS.
        bg = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert sum(int(x) for x in bg[bg.index("(") + 1:bg.index(")")].split(",")[:3]) < 150, bg

    await in_thread(open_list)
    run = env.services.supervisor.start(env.cfg.caller("alice"), {"script": "return 1", "label": "fresh run"})

    def see_it() -> None:
        wait_for(browser, lambda d: "completed" in d.find_element(By.ID, f"run-{run.id}").text)
        wait_for(browser, lambda d: "fresh run" in d.find_element(By.ID, f"run-{run.id}").text)
        assert browser.execute_script("return window.__noReload === true")
        # Nothing wider than the screen but the scrolling table wrapper.
        assert browser.execute_script("return document.body.scrollWidth <= window.innerWidth + 1")
        browser.save_screenshot(str(tmp_path / "dashboard-list-phone-dark.png"))
        assert not console_errors(browser)

    await in_thread(see_it)
    assert (tmp_path / "dashboard-list-phone-dark.png").stat().st_size > 5_000


@pytest.mark.timeout(120)
async def test_failed_run_marks_its_line(tmp_path: Path, nursery: trio.Nursery, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery)
    run = await run_to_end(env, "// a comment\nconst s = `multi\nline`;\nthrow new Error('boom: ' + s);\nreturn 1;")
    assert run.status == "failed" and run.error_line == 4

    def look() -> None:
        browser.get(f"{env.url}/runs/{run.id}")
        err = browser.find_element(By.CSS_SELECTOR, "#script .ln.err")
        assert err.get_attribute("data-n") == "4" and "throw" in err.text
        assert len(browser.find_elements(By.CSS_SELECTOR, "#script .ln")) == 5
        assert browser.find_element(By.CSS_SELECTOR, "#L1 .k-com").text == "// a comment"
        assert "line`" in browser.find_element(By.ID, "L3").text           # a template literal across lines
        assert browser.title.startswith("✗ ") and "failed" in browser.title
        assert "(script line 4)" in browser.find_element(By.ID, "run-error").text
        assert not console_errors(browser)

    await in_thread(look)



@pytest.mark.timeout(120)
async def test_archived_badge_shows_whole_in_the_run_list(tmp_path: Path, nursery: trio.Nursery,
                                                          browser: Any) -> None:
    """Retention archives the older run (maxRuns 1, a pass every 3 s); its row carries two
    badges, status and "archived", and the status column shows both whole, server-rendered
    and re-rendered live by list.js."""
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery, retention={"maxRuns": 1, "intervalMinutes": 0.05})
    old = await run_to_end(env, "return 1", label="old run")
    await run_to_end(env, "return 2", label="newer run")
    with trio.fail_after(60):
        while old.archived_at is None:
            await trio.sleep(0.05)

    def clipped(d: Any) -> list[str]:
        """The badges of the old run's row not shown whole inside their cell."""
        return d.execute_script(
            "const row = document.getElementById(arguments[0]);"
            "return [...row.querySelectorAll('.badge')].filter(b => {"
            "  const c = b.closest('td').getBoundingClientRect(), r = b.getBoundingClientRect();"
            "  return r.left < c.left || r.right > c.right + 0.5 || b.scrollWidth > b.clientWidth;"
            "}).map(b => b.textContent)", f"run-{old.id}")

    def look() -> None:
        for status in ("", "archived"):
            browser.get(env.url + "/" + (f"?status={status}" if status else ""))
            row = wait_for(browser, lambda d: d.find_element(By.ID, f"run-{old.id}"))
            assert [b.text for b in row.find_elements(By.CSS_SELECTOR, ".badge")] == ["completed", "archived"]
            assert clipped(browser) == [], status
        assert not console_errors(browser)

    await in_thread(look)
    # The live re-render (list.js rowFor) of the same row: its row event redraws it.
    await in_thread(browser.execute_script, "document.getElementById(arguments[0]).dataset.mark = 'server'",
                    f"run-{old.id}")
    publish_row(env.services.supervisor.env, old, None)

    def look_live() -> None:
        wait_for(browser, lambda d: not d.find_element(By.ID, f"run-{old.id}").get_attribute("data-mark"))
        assert clipped(browser) == []

    await in_thread(look_live)
