"""The dashboard in a real browser: Debian's headless Chromium driven by Selenium
(installed by tests/install.sh). Missing Chromium fails these tests; it never skips them.

The daemon runs in the test's Trio loop; Selenium's blocking calls run in a thread so the
daemon keeps serving meanwhile.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
import trio

from .conftest import Env
from .test_agents import fake_daemon
from .test_dashboard import ADMIN, wait_state

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser() -> Any:
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists():
            pytest.fail(f"{exe} is missing: run bash tests/install.sh (Debian packages chromium, chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="sb-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1280,900", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    # What `tailscale serve` would add for a logged-in admin.
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Tailscale-User-Login": ADMIN}})
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    return await trio.to_thread.run_sync(fn, *args)


def wait_for(driver: Any, check: Callable[[Any], Any], timeout: float = 20) -> Any:
    """Poll `check` until truthy. Rows are re-rendered on every event, so an element
    found a moment ago may be stale: such polls are simply retried."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)).until(check)


@pytest.mark.timeout(120)
async def test_live_run_page_in_chromium(tmp_path: Path, nursery: trio.Nursery, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery, dashboard={"adminLogins": [ADMIN]})
    sup = env.services.supervisor
    gate = tmp_path / "gate"
    hold = tmp_path / "hold"
    gate.write_text("")
    hold.write_text("")
    script = (f"phase('first');\nconst a = await agent('waitfile:{gate}', {{label: 'gated'}});\n"
              f"phase('second');\nconst b = await agent('waitfile:{hold}', {{label: 'held'}});\n"
              f"return [a, b];")
    run = sup.start(env.cfg.caller("alice"), {"script": script})
    await wait_state(env, run, 1, "running")

    def open_page() -> None:
        browser.get(f"{env.url}/runs/{run.id}")
        browser.execute_script("window.__noReload = true;")
        assert "running" in browser.find_element(By.ID, "agent-1").text
        wait_for(browser, lambda d: "st-running" in d.find_element(By.ID, "bar-1").get_attribute("class"))

    await in_thread(open_page)
    gate.unlink()           # agent 1 finishes; agent 2 starts in a new phase

    def watch_live() -> None:
        wait_for(browser, lambda d: "done" in d.find_element(By.ID, "agent-1").text)
        wait_for(browser, lambda d: "st-done" in d.find_element(By.ID, "bar-1").get_attribute("class"))
        # A new row and a new timeline bar appear without a reload.
        wait_for(browser, lambda d: d.find_elements(By.ID, "agent-2") and "running" in d.find_element(By.ID, "agent-2").text)
        wait_for(browser, lambda d: "st-running" in d.find_element(By.ID, "bar-2").get_attribute("class"))
        wait_for(browser, lambda d: d.find_element(By.ID, "bar-2").size["width"] > 0)
        assert browser.execute_script("return window.__noReload === true")
        assert browser.find_element(By.CSS_SELECTOR, '#phases section[data-phase="second"]')

    await in_thread(watch_live)

    def skip_as_admin() -> None:
        wait_for(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#agent-2 button.skip").click() or True)
        wait_for(browser, lambda d: "skipped" in d.find_element(By.ID, "agent-2").text)
        wait_for(browser, lambda d: "st-skipped" in d.find_element(By.ID, "bar-2").get_attribute("class"))
        wait_for(browser, lambda d: "completed" in d.find_element(By.ID, "run-status").text)
        wait_for(browser, lambda d: "null" in d.find_element(By.ID, "result").text)
        assert browser.execute_script("return window.__noReload === true")
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard-run.png"))

    await in_thread(skip_as_admin)
    assert run.status == "completed"
    assert sup.runs[run.id].agents_done == 2
    shot = ARTIFACTS / "dashboard-run.png"
    assert shot.exists() and shot.stat().st_size > 10_000
    hold.unlink()


@pytest.mark.timeout(120)
async def test_run_list_updates_live_and_phone_width(tmp_path: Path, nursery: trio.Nursery, browser: Any) -> None:
    from selenium.webdriver.common.by import By
    env: Env = await fake_daemon(tmp_path, nursery)

    def open_list() -> None:
        browser.set_window_size(390, 844)                 # a phone
        browser.get(env.url + "/")
        browser.execute_script("window.__noReload = true;")
        wait_for(browser, lambda d: "live" in d.find_element(By.ID, "conn").get_attribute("class"))

    await in_thread(open_list)
    run = env.services.supervisor.start(env.cfg.caller("alice"), {"script": "return 1", "label": "fresh run"})

    def see_it() -> None:
        wait_for(browser, lambda d: "completed" in d.find_element(By.ID, f"run-{run.id}").text)
        wait_for(browser, lambda d: "fresh run" in d.find_element(By.ID, f"run-{run.id}").text)
        assert browser.execute_script("return window.__noReload === true")
        # Nothing wider than the screen but the scrolling table wrapper.
        assert browser.execute_script("return document.body.scrollWidth <= window.innerWidth + 1")
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "dashboard-list-phone.png"))

    await in_thread(see_it)
