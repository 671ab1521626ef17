"""Every dashboard page in headless Chromium, light and dark, under the daemon's own
Content-Security-Policy: each page is loaded with a `securitypolicyviolation` listener
installed before any of its own code runs, and the violations are counted (target 0). A
blocked inline <style> left /spend unstyled (black bars, invisible labels in dark mode);
that page is also checked for the shared layout and for colours that can be seen."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from swarmbase import config
from swarmbase.admin import AdminStore

from .audit_runs import AgentSpec, write_run
from .browser import ADMIN, console_errors, in_thread, wait_for
from .conftest import Env, start_daemon, write_config

# Runs in every page (CDP: before the document's own scripts, for every navigation).
COUNT_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  (e) => window.__csp.push(e.effectiveDirective + ' ' + (e.blockedURI || 'inline') + ' '
                           + e.sourceFile + ':' + e.lineNumber));
"""


def days_ago(n: int) -> float:
    d = dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=n)
    return dt.datetime(d.year, d.month, d.day, 12, tzinfo=dt.timezone.utc).timestamp()


def pages(env: Env, run_id: str) -> dict[str, str]:
    """Every HTML page the dashboard serves, with the states worth seeing (errors too)."""
    link = AdminStore(env.state).create_link(ADMIN)
    return {"list": "/", "list filtered": "/?status=completed&q=test", "bad query": "/?from=yesterday",
            "run": f"/runs/{run_id}", "agent": f"/runs/{run_id}/agents/1", "spend": "/spend",
            "spend one caller": "/spend?caller=alice", "spend bad range": "/spend?to=x", "nodes": "/nodes",
            "admin link": f"/admin/login/{link}", "used admin link": "/admin/login/not-a-link",
            "missing run": "/runs/run_000000000000", "missing page": "/no/such/page"}


@pytest.mark.timeout(240)
async def test_every_page_has_no_csp_violation_light_and_dark(tmp_path: Path, nursery: trio.Nursery,
                                                              browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    state = tmp_path / "state"
    path, tokens = write_config(state, dashboard={"adminLogins": [ADMIN]})
    run = write_run(state, [AgentSpec("a", cost=0.25, ended_at=days_ago(2)),
                            AgentSpec("b", cost=0.125, ended_at=days_ago(1), estimated=True)],
                    created_at=days_ago(2), script="// review the queue\nphase('main');\nreturn 1")
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    urls = pages(env, run.id)

    def visit(scheme: str) -> dict[str, list[str]]:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        found: dict[str, list[str]] = {}
        for name, url in urls.items():
            browser.get(env.url + url)
            wait_for(browser, lambda d: d.execute_script("return document.readyState") == "complete")
            # The browser also logs the error status of the page itself (400, 404, 410).
            errors = [e for e in console_errors(browser)
                      if not (e.startswith(env.url + url.split("?")[0]) and "Failed to load resource" in e)]
            found[name] = browser.execute_script("return window.__csp") + errors
        return found

    def check_spend(scheme: str) -> None:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                                {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        browser.get(env.url + "/spend")
        wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "figure.spend-chart rect.bar"))
        # The shared layout: the header with its links, the stylesheet applied.
        assert browser.find_element(By.CSS_SELECTOR, "header.top a.brand").get_attribute("href") == env.url + "/"
        assert browser.find_element(By.CSS_SELECTOR, "header.top a.nav").text == "spend"
        style = browser.execute_script("""
            const bar = document.querySelector('figure.spend-chart rect.bar');
            const label = document.querySelector('figure.spend-chart text');
            const body = getComputedStyle(document.body);
            return {bar: getComputedStyle(bar).fill, label: getComputedStyle(label).fill,
                    text: body.color, bg: body.backgroundColor,
                    grid: getComputedStyle(document.getElementById('spend-charts')).display};""")
        assert style["bar"] not in ("rgb(0, 0, 0)", "none"), style          # an unstyled bar is black
        assert style["label"] != style["bg"] and style["text"] != style["bg"], style
        assert style["grid"] == "grid", style                                # the page's own rules apply
        if scheme == "dark":
            assert style["bg"] != "rgb(255, 255, 255)", style
        totals = browser.find_element(By.ID, "spend-totals").text
        assert "$0.3750" in totals                                           # one money rule: $0.0001

    def control() -> list[str]:
        # The counter sees what the policy blocks: an inline <style> added by script.
        browser.get(env.url + "/")
        browser.execute_script("const s = document.createElement('style'); s.textContent = 'body{}';"
                               "document.head.append(s);")
        wait_for(browser, lambda d: d.execute_script("return window.__csp.length") > 0)
        return browser.execute_script("return window.__csp")

    def visit_all() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": COUNT_VIOLATIONS})
        return visit("light"), visit("dark")

    light, dark = await in_thread(visit_all)
    assert {name: v for name, v in light.items() if v} == {}
    assert {name: v for name, v in dark.items() if v} == {}
    assert len(light) == len(urls) == len(dark)
    blocked = await in_thread(control)
    assert any(v.startswith("style-src") for v in blocked), blocked
    await in_thread(check_spend, "light")
    await in_thread(check_spend, "dark")


@pytest.mark.timeout(60)
async def test_every_page_header_links_the_list_spend_and_nodes(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Issue 32.8: /nodes was reachable only by typing it; every page's header links it."""
    state = tmp_path / "state"
    path, tokens = write_config(state, dashboard={"adminLogins": [ADMIN]})
    run = write_run(state, [AgentSpec("a", cost=0.25, ended_at=days_ago(1))], created_at=days_ago(1))
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    found = {}
    async with httpx.AsyncClient(base_url=env.url) as c:
        for name, url in pages(env, run.id).items():
            page = (await c.get(url)).text
            header = re.search(r'<header class="top">(.*?)</header>', page, re.S)
            found[name] = re.findall(r'<a href="([^"]+)"', header.group(1)) if header else None
    assert found == {name: ["/", "/spend", "/nodes"] for name in found}
