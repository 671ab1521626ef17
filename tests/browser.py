"""Debian's headless Chromium driven by Selenium (installed by tests/install.sh), for the
dashboard tests; the `browser` fixture (conftest.py) is one of these. Missing Chromium
fails a test; it never skips it.

Selenium's calls block, so tests make them in a thread (`in_thread`): the daemon runs in
the test's Trio loop and must keep serving meanwhile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ADMIN = "admin@example.com"       # the login `tailscale serve` presents for the browser


@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium (its own profile dir, removed after) that sends the
    header `tailscale serve` would add for the logged-in ADMIN."""
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
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
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


def console_errors(driver: Any) -> list[str]:
    """Console errors since the last call (CSP violations and script errors are SEVERE)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "favicon" not in e["message"]]
