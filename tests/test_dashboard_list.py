"""The run list at 10,000 runs (generated run dirs, a daemon booted over them): cursor
pages newest first that cover every run once, search by label / runId / caller, filters,
and labels for runs that have none."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from swarmbase import config

from . import gen_runs
from .conftest import Env, start_daemon, write_config

N = 10_000
ROW = re.compile(r'<tr id="run-(run_[0-9a-f]+)" data-created="([0-9.]+)"')


async def list_daemon(tmp_path: Path, nursery: trio.Nursery) -> tuple[Env, list[Any]]:
    state = tmp_path / "state"
    runs = gen_runs.generate(state, N)
    path, tokens = write_config(state, callers=list(gen_runs.CALLERS))
    env = Env(state=state, tokens=tokens, cfg=config.load(path))
    await start_daemon(nursery, env)
    return env, runs


def rows(html: str) -> list[str]:
    return [m.group(1) for m in ROW.finditer(html)]


def next_link(html: str) -> str | None:
    m = re.search(r'<a href="([^"]+)" id="next-page"', html)
    return m.group(1).replace("&amp;", "&") if m else None


@pytest.mark.timeout(240)
async def test_ten_thousand_runs_paged_searched_filtered(tmp_path: Path, nursery: trio.Nursery) -> None:
    env, runs = await list_daemon(tmp_path, nursery)
    newest_first = [r.id for r in sorted(runs, key=lambda r: r.created_at, reverse=True)]
    async with httpx.AsyncClient(base_url=env.url, timeout=60) as c:
        # Every page: 150 rows, newest first; following "next" covers every run exactly once.
        seen: list[str] = []
        url: str | None = "/"
        pages = 0
        while url:
            html = (await c.get(url)).text
            got = rows(html)
            assert len(got) == 150 or next_link(html) is None
            seen += got
            url = next_link(html)
            pages += 1
        assert seen == newest_first and pages == -(-N // 150)
        first = (await c.get("/")).text
        assert "10,000 in all" in first
        # Labels: the label, else meta.name, else the script's leading comment; never a wall of ids.
        for i in (N - 1, N - 2, N - 3):
            assert f">{gen_runs.expected_label(runs[i], i)}</a>" in first

        async def search(**params: str) -> list[str]:
            found, url = [], "/?" + str(httpx.QueryParams(params))
            while url:
                html = (await c.get(url)).text
                found += rows(html)
                url = next_link(html)
            return found

        assert await search(q="nightly build 4242") == [runs[4242].id]
        assert await search(q="REVIEW BATCH 4243") == [runs[4243].id]
        assert await search(q=runs[777].id[4:]) == [runs[777].id]
        carol = await search(caller="carol", status="failed")
        assert carol == [r.id for r in sorted(runs, key=lambda r: -r.created_at)
                         if r.caller == "carol" and r.status == "failed"] and len(carol) > 300
        assert await search(q="carol") == [r.id for r in sorted(runs, key=lambda r: -r.created_at) if r.caller == "carol"]
        # Dates (UTC): ?from= inclusive, ?to= a day means through that day.
        import time
        day = time.strftime("%Y-%m-%d", time.gmtime(gen_runs.T0 + 86_400 * 3))
        on_day = await search(**{"from": day, "to": day})
        start = gen_runs.T0 // 86_400 * 86_400 + 86_400 * 3
        assert on_day == [r.id for r in sorted(runs, key=lambda r: -r.created_at) if start <= r.created_at < start + 86_400]
        assert len(on_day) == 1_440
        assert await search(q="no such run anywhere") == []
        assert "no runs match" in (await c.get("/", params={"q": "no such run anywhere"})).text
