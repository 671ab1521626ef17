"""/spend and /spend.json show the quota windows, on the real dashboard app beside the real
supervisor over records written as the daemon writes them: "pending" while the caller's
month is still being read after boot (the page still renders), then spent and left from
the records; the usage tool the same."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from swarmbase import config, daemon, usage
from swarmbase.runs import quota

from .audit_runs import AgentSpec, write_run
from .conftest import write_config


async def test_spend_shows_quota_windows_pending_then_counted(tmp_path: Path) -> None:
    state = tmp_path / "state"
    write_config(state, callers=["alice", "bob"], caller_extra={"usdPerDay": 3, "usdPerMonth": 90})
    now = time.time()
    ended = max(now - 1, quota.bounds("day", now)[0])        # today, even a second after 00:00Z
    write_run(state, [AgentSpec("a", cost=0.5, ended_at=ended), AgentSpec("b", cost=0.25, ended_at=ended),
                      AgentSpec("r", cost=9.0, ended_at=ended, replayed=True)], caller="alice", created_at=ended)
    services: Any = daemon.build_services(config.load(state / "config.json"))
    services.supervisor.recover()
    book = services.supervisor.quota
    client = daemon.make_app(services).test_client()
    host = {"Host": "127.0.0.1:7360"}

    names = book.begin_priming(services.cfg.callers)         # what boot does before it listens
    assert names == ["alice", "bob"]
    page = await client.get("/spend", headers=host)
    assert page.status_code == 200 and "still being counted" in await page.get_data(as_text=True)

    book.prime_all(names)                                    # the worker thread's part
    got = await (await client.get("/spend.json", query_string={"caller": "alice"}, headers=host)).get_json()
    day = next(w for w in got["quota"]["alice"] if w["window"] == "day")
    assert (day["limitUsd"], day["spentUsd"], day["reservedUsd"], day["leftUsd"]) == (3, 0.75, 0.0, 2.25)
    assert list(got["quota"]) == ["alice"]                   # ?caller= narrows the quotas too
    html = await (await client.get("/spend", headers=host)).get_data(as_text=True)
    row = re.search(r'<tr data-caller="alice" data-window="month">(.*?)</tr>', html, re.S)
    assert row and re.findall(r"\$[\d.]+", row.group(1)) == ["$90.0000", "$0.7500", "$0.0000", "$89.2500"]
    tool = usage.tool_handler(services.supervisor, services.cfg.caller("alice"), {})
    assert tool["quota"] == got["quota"]["alice"]
