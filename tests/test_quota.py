"""Spend quotas against the real daemon process (issue 24 #3), with the fake claude CLI
charging what the prompt says (`pay:USD:GATE`): several runs started at once are admitted
only while their budgets fit the window (the rest refused with what is left and when the
window resets); while they run, `usage` and /spend.json show them reserved; once they
end, spent; a run (and a resume) that no longer fits is refused; after a restart the
window is rebuilt from the agent records on disk.

The window's own clock logic (the boundary at 00:00Z, month ends) is tested with an
injected clock in test_quota_unit.py; here the day is today's."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from swarmbase.client import HostClient, connect

from .clidaemon import CliDaemon, cli_daemon, fake_cli_config

LIMIT = 1.0
BUDGET = 0.3        # three fit in $1.00 at once, a fourth does not


def next_midnights() -> set[str]:
    """The day window's reset, computed before and after: a test running across 00:00Z
    must accept either."""
    today = dt.datetime.now(dt.timezone.utc).date()
    return {f"{d + dt.timedelta(days=1)}T00:00:00Z" for d in (today, dt.datetime.now(dt.timezone.utc).date())}


def day_window(quota: list[dict[str, Any]]) -> dict[str, Any]:
    return next(w for w in quota if w["window"] == "day")


async def usage_quota(h: HostClient) -> list[dict[str, Any]]:
    got = await h.tool("usage", {})
    assert json.loads(got["content"][0]["text"])["quota"] == got["structuredContent"]["quota"]
    return got["structuredContent"]["quota"]


async def spend_json(d: CliDaemon) -> dict[str, Any]:
    base = d.ws.removesuffix("/mcpl").replace("ws://", "http://")
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        r = await c.get("/spend.json", headers={"Host": base.split("//")[1]})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.mark.timeout(300)
async def test_quota_windows_refuse_runs_that_cannot_fit(tmp_path: Path) -> None:
    path, tokens = fake_cli_config(tmp_path, sandbox="none", perRunConcurrency=2,
                                   caller_extra={"usdPerDay": LIMIT, "usdPerMonth": 50, "runUsdMax": 5})
    gate = tmp_path / "gate"
    gate.write_text("")
    script = f"return await agent('pay:0.25:{gate}', {{maxUsd: {BUDGET}}})"
    with trio.fail_after(240):
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as h:
            await h.handshake()
            answers: list[dict[str, Any]] = []

            async def start() -> None:
                answers.append(await h.tool("run", {"script": script, "budgetUsd": BUDGET}))
            async with trio.open_nursery() as n:          # five at once
                for _ in range(5):
                    n.start_soon(start)
            admitted = [a["structuredContent"]["runId"] for a in answers if not a.get("isError")]
            refused = [a["content"][0]["text"] for a in answers if a.get("isError")]
            assert len(admitted) == 3 and len(admitted) * BUDGET <= LIMIT
            assert len(refused) == 2
            for text in refused:
                m = re.search(r"this caller's daily spend quota cannot fit the run: its budget is \$0\.3000 and "
                              r"\$0\.1000 is left of usdPerDay \$1\.0000 \(\$0\.0000 spent, \$0\.9000 reserved by "
                              r"running runs\); the window resets at (\S+) \(UTC\)", text)
                assert m and m.group(1) in next_midnights(), text

            # While they run: reserved, and the same on /spend.json.
            day = day_window(await usage_quota(h))
            assert (day["limitUsd"], day["spentUsd"], day["reservedUsd"], day["leftUsd"]) == (1.0, 0.0, 0.9, 0.1)
            assert day["resetsAt"] in next_midnights()
            page = await spend_json(d)
            assert day_window(page["quota"]["alice"])["reservedUsd"] == 0.9

            gate.unlink()
            for rid in admitted:
                await h.wait_notice(f"{rid}:end")
            day = day_window(await usage_quota(h))
            assert (day["spentUsd"], day["reservedUsd"], day["leftUsd"]) == (0.75, 0.0, 0.25)
            spent = (await h.tool("usage", {}))["structuredContent"]["totals"]["costUsd"]
            assert spent == pytest.approx(0.75) and spent <= LIMIT     # the records agree with the window

            # No longer fits: a run and a resume are refused, naming what is left.
            again = await h.tool("run", {"script": script, "budgetUsd": BUDGET})
            assert again["isError"] and "$0.2500 is left of usdPerDay" in again["content"][0]["text"]
            resumed = await h.tool("resume", {"runId": admitted[0]})
            assert resumed["isError"] and "$0.2500 is left of usdPerDay" in resumed["content"][0]["text"]
            fits = await h.tool("run", {"script": "return 1", "budgetUsd": 0.25})
            assert not fits.get("isError"), fits
            await h.wait_notice(f"{fits['structuredContent']['runId']}:end")

        # A restart rebuilds the window from the records on disk (read once, after boot, in
        # a worker thread: until then the window says "pending" and runs are refused so).
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as h:
            await h.handshake()
            while "pending" in (day := day_window(await usage_quota(h))):
                assert "still being counted" in day["pending"]
                await trio.sleep(0.05)
            assert (day["spentUsd"], day["reservedUsd"], day["leftUsd"]) == (0.75, 0.0, 0.25)
            html_base = d.ws.removesuffix("/mcpl").replace("ws://", "http://")
            async with httpx.AsyncClient(base_url=html_base, timeout=30) as c:
                page = await c.get("/spend", headers={"Host": html_base.split("//")[1]})
            assert page.status_code == 200
            row = re.search(r'<tr data-caller="alice" data-window="day">(.*?)</tr>', page.text, re.DOTALL)
            assert row and re.findall(r"\$[\d.]+", row.group(1)) == ["$1.0000", "$0.7500", "$0.0000", "$0.2500"]


@pytest.mark.timeout(300)
async def test_a_restart_after_retention_archived_a_run_still_counts_its_spend(tmp_path: Path) -> None:
    """Issue 32 #1: the quota's history read run dirs only, so an archived run's spend was
    forgotten at the next restart while `usage` (which reads the zips) still showed it."""
    path, tokens = fake_cli_config(tmp_path, sandbox="none", caller_extra={"usdPerDay": LIMIT, "runUsdMax": 5})
    script = "return await agent('pay:0.25', {maxUsd: 0.3})"
    with trio.fail_after(240):
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as h:
            await h.handshake()
            first = (await h.tool("run", {"script": script, "budgetUsd": BUDGET}))["structuredContent"]["runId"]
            await h.wait_notice(f"{first}:end")
            second = (await h.tool("run", {"script": script, "budgetUsd": BUDGET}))["structuredContent"]["runId"]
            await h.wait_notice(f"{second}:end")
        data = json.loads(path.read_text())
        data["retention"] = {"maxRuns": 1}             # the boot pass archives the older run
        path.write_text(json.dumps(data))
        archived = tmp_path / "state" / "runs-archive"
        async with cli_daemon(path):
            while not list(archived.glob(f"*-{first}.zip")):
                await trio.sleep(0.05)
        async with cli_daemon(path) as d, connect(d.ws, tokens["alice"]) as h:
            await h.handshake()
            assert (await h.tool("status", {"runId": first}))["structuredContent"]["archivedAt"]
            while "pending" in (day := day_window(await usage_quota(h))):
                await trio.sleep(0.05)
            spent = (await h.tool("usage", {}))["structuredContent"]["totals"]["costUsd"]
    assert spent == pytest.approx(0.5)
    assert (day["spentUsd"], day["leftUsd"]) == (0.5, 0.5)          # the archived run's $0.25 counts too
