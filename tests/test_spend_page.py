"""The dashboard's spend page and the run page's audit verdict, mounted on the real dashboard
app (make_app) beside the real supervisor; the chart drawn by the page in headless Chromium."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from dashboard.audit_view import register_audit
from dashboard.spend import register_spend
from swarmbase import config, daemon, usage

from .audit_runs import AgentSpec, lines, run_dir, write_lines, write_run
from .browser import in_thread, wait_for
from .conftest import write_config

HOST = {"Host": "127.0.0.1:7360"}


def days_ago(n: int, hour: int = 12) -> float:
    d = dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=n)
    return dt.datetime(d.year, d.month, d.day, hour, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def services(tmp_path: Path) -> Any:
    state = tmp_path / "state"
    write_config(state, callers=["alice", "bob"])
    write_run(state, [AgentSpec("a", cost=0.25, ended_at=days_ago(3)), AgentSpec("b", cost=0.5, ended_at=days_ago(1))],
              caller="alice", created_at=days_ago(3, 10))
    write_run(state, [AgentSpec("c", cost=1.25, ended_at=days_ago(2)),
                      AgentSpec("d", engine="codex", model="gpt-5", cost=0.0, priced=False, ended_at=days_ago(2))],
              caller="bob", created_at=days_ago(2, 10))
    services = daemon.build_services(config.load(state / "config.json"))
    services.supervisor.recover()
    return services


def app_for(services: Any) -> Any:
    app = daemon.make_app(services)
    register_spend(app, services)
    register_audit(app, services)
    return app


async def test_spend_page_and_json(services: Any) -> None:
    state = services.cfg.state_dir
    client = app_for(services).test_client()
    expected = usage.report_for_state(state)
    r = await client.get("/spend.json", headers=HOST)
    assert r.status_code == 200 and await r.get_json() == {**expected, "quota": {}}     # no caller has a quota
    assert expected["totals"]["costUsd"] == pytest.approx(2.0) and expected["totals"]["agents"] == 4
    page = await client.get("/spend", headers=HOST)
    html = await page.get_data(as_text=True)
    assert page.status_code == 200 and "$2.0000" in html and "no price" in html
    carried = re.search(r"data-report='([^']*)'", html).group(1)
    assert json.loads(carried.replace("&#34;", '"').replace("&amp;", "&")) == {**expected, "quota": {}}
    assert re.findall(r'(?:src|href)="(https?:)?//', html) == []            # nothing from a CDN
    only_bob = await (await client.get("/spend.json", query_string={"caller": "bob"}, headers=HOST)).get_json()
    assert only_bob["totals"]["costUsd"] == pytest.approx(1.25)
    bad = await client.get("/spend.json", query_string={"from": "2026-02-31"}, headers=HOST)
    assert bad.status_code == 400 and "calendar" in (await bad.get_json())["error"]
    assert (await client.get("/spend", query_string={"to": "x"}, headers=HOST)).status_code == 400
    js = await client.get("/spend/static/spend.js", headers=HOST)
    assert js.status_code == 200 and b"createElementNS" in await js.get_data()
    assert (await client.get("/spend/static/app.js", headers=HOST)).status_code == 404
    assert (await client.get("/spend", headers={"Host": "evil.example"})).status_code == 403


async def test_run_audit_verdict(services: Any) -> None:
    client = app_for(services).test_client()
    sup = services.supervisor
    run = next(r for r in sup.runs.values() if r.caller == "alice")
    ok = await (await client.get(f"/runs/{run.id}/audit.json", headers=HOST)).get_json()
    assert ok["status"] == "intact" and ok["break"] is None
    path = run_dir(services.cfg.state_dir, run) / "journal.jsonl"
    rows = lines(path)
    rows[1] = rows[1].replace(b'"r1"', b'"rX"')
    write_lines(path, rows)
    bad = await (await client.get(f"/runs/{run.id}/audit.json", headers=HOST)).get_json()
    assert bad["status"] == "broken" and bad["break"]["line"] == 2 and bad["break"]["file"].endswith("journal.jsonl")
    assert (await client.get("/runs/run_000000000000/audit.json", headers=HOST)).status_code == 404
    badge = await client.get("/audit/static/audit-badge.js", headers=HOST)
    assert badge.status_code == 200


@pytest.mark.timeout(120)
async def test_chart_drawn_in_chromium(services: Any, nursery: trio.Nursery, browser: Any,  # noqa: F811
                                       tmp_path: Path) -> None:
    shots = tmp_path
    from selenium.webdriver.common.by import By
    url = await nursery.start(daemon.serve_on_loopback, app_for(services))

    def look() -> None:
        browser.get(f"{url}/spend")
        wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "figure.spend-chart")) == 2)
        bars = {f.get_attribute("data-caller"): [b.get_attribute("data-date")
                                                 for b in f.find_elements(By.CSS_SELECTOR, "rect.bar")]
                for f in browser.find_elements(By.CSS_SELECTOR, "figure.spend-chart")}
        day = lambda n: (dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=n)).isoformat()  # noqa: E731
        assert bars == {"alice": [day(3), day(1)], "bob": [day(2)]}
        tall = {b.get_attribute("data-date"): float(b.get_attribute("height"))
                for b in browser.find_elements(By.CSS_SELECTOR, 'figure[data-caller="alice"] rect.bar')}
        assert tall[day(1)] > tall[day(3)]                       # $0.50 draws taller than $0.25
        browser.find_element(By.ID, "metric-tokens").click()
        wait_for(browser, lambda d: "tokens" in d.find_element(By.CSS_SELECTOR, "figure[data-caller=bob] svg")
                 .get_attribute("aria-label"))
        # bob's codex agent has tokens but no price: it shows on the tokens chart only
        assert len(browser.find_elements(By.CSS_SELECTOR, 'figure[data-caller="bob"] rect.bar')) == 1
        browser.save_screenshot(str(shots / "dashboard-spend.png"))

    await in_thread(look)
