"""The dashboard's pure parts: one rounding rule for money, totals that add up, the run
list's query (cursor pages, search, filters), titles, waits from state histories."""

from __future__ import annotations

import calendar
import random
import time

import attrs
import pytest

from dashboard import listing, views


def test_one_rounding_rule_and_totals_rounded_once() -> None:
    assert views.usd(0.00005) == "$0.0001" and views.usd(0.00004999) == "$0.0000"
    assert views.usd(1.23456) == "$1.2346" and views.usd(12) == "$12.0000" and views.usd(None) == "$0.0000"
    assert views.usd(float("nan")) == "$0.0000"
    rng = random.Random(7)
    rows = [views.normalize({"n": i, "costUsd": rng.random() / 30, "tokens": rng.randrange(10_000),
                             "engine": rng.choice(["claude", "codex"]), "estimated": i % 5 == 0}, f"p{i % 3}")
            for i in range(200)]
    rows.append(views.normalize({"n": 999, "costUsd": 0.0, "engine": "codex", "priced": False}, "p0"))
    for by in ("phase", "engine"):
        groups = views.totals(rows, by)
        *parts, total = groups
        exact = sum(r["costUsd"] for r in rows if r["priced"])
        # The foot is the exact sum rounded once (the header's figure), not a sum of rounded rows.
        assert total["units"] == views.usd_units(exact)
        assert all(g["units"] == views.usd_units(g["usd"]) for g in parts)
        assert sum(g["tokens"] for g in parts) == total["tokens"] == sum(r["tokens"] for r in rows)
        assert total["agents"] == 201 and total["unpriced"] == 1 and total["estimated"]
    assert views.agent_cost({"priced": False, "costUsd": 0}) == "no price"
    assert views.agent_cost({"costUsd": 0.01234, "estimated": True}) == "~$0.0123"


def test_rows_from_older_cores_get_every_field() -> None:
    row = views.normalize({"n": 1, "label": "a", "state": "done", "costUsd": 0.1, "tokens": {"total": 5}}, "main")
    for k in ("priced", "workflow", "originalDurationS", "error", "phase", "node", "branch"):
        assert k in row
    assert row["tokens"] == 5 and row["phase"] == "main" and row["workflow"] == "" and row["priced"] is True


def test_segments_titles_and_bars() -> None:
    hist = [{"state": "queued", "at": "2026-01-02T03:04:05.250Z"}, {"state": "waiting-budget", "at": "2026-01-02T03:04:06Z"},
            {"state": "running", "at": "2026-01-02T03:04:07.500Z"}, {"state": "done", "at": "bogus"}]
    base = calendar.timegm((2026, 1, 2, 3, 4, 5, 0, 0, 0))
    assert views.segments(hist) == [["queued", base + 0.25], ["waiting-budget", base + 1.0], ["running", base + 2.5]]
    assert views.run_title("running", "fan out", 3, 8, 2) == "● 3/8 running — fan out"
    assert views.run_title("failed", "fan out", 3, 8, 0) == "✗ fan out — failed"
    bar = views.budget_bar(6.0, 1.0, 5.0)
    assert bar["over"] and bar["spentPct"] + bar["reservedPct"] == pytest.approx(100)
    assert views.budget_bar(1.0, 1.0, 4.0) == {"spentPct": 25.0, "reservedPct": 25.0, "over": False}
    assert views.dur(4.25) == "4.2s" and views.dur(187) == "3m07s" and views.dur(7500) == "2h05m" and views.dur(None) == ""


@attrs.define
class FakeRun:
    id: str
    caller: str
    status: str
    created_at: float
    label: str = ""


def make_runs(n: int) -> dict[str, FakeRun]:
    rng = random.Random(1)
    runs = {}
    for i in range(n):
        rid = f"run_{i:012x}"
        runs[rid] = FakeRun(rid, rng.choice(["alice", "bob"]), rng.choice(listing.STATUSES),
                            1_700_000_000 + (i // 3) * 60.0, label=f"job {i}")   # ties in createdAt on purpose
    return runs


def test_cursor_pages_cover_every_run_once_newest_first() -> None:
    runs = make_runs(1_000)
    index = listing.RunIndex()
    index.refresh(runs)
    seen = []
    query = listing.parse({"n": "150"})
    while True:
        page, nxt = index.page(query, lambda r: r.label)
        seen += page
        if nxt is None:
            break
        query = listing.parse({"n": "150", "before": nxt})
    assert len(seen) == 1_000 and len({r.id for r in seen}) == 1_000
    assert seen == sorted(runs.values(), key=lambda r: (r.created_at, r.id), reverse=True)
    # A run added after the first page does not shift the pages after it.
    first, nxt = index.page(listing.parse({}), lambda r: r.label)
    runs["run_ffffffffffff"] = FakeRun("run_ffffffffffff", "alice", "running", 1_800_000_000)
    index.refresh(runs)
    second, _ = index.page(listing.parse({"before": nxt}), lambda r: r.label)
    assert second[0].created_at <= first[-1].created_at and second[0].id != first[-1].id


def test_search_and_filters() -> None:
    runs = make_runs(3_000)
    index = listing.RunIndex()
    index.refresh(runs)
    label = lambda r: r.label  # noqa: E731
    page, _ = index.page(listing.parse({"q": "JOB 2999"}), label)
    assert [r.id for r in page] == ["run_000000000bb7"]
    page, _ = index.page(listing.parse({"q": "000000000bb"}), label)
    assert {r.id for r in page} == {f"run_000000000bb{c}" for c in "01234567"} | {"run_0000000000bb"}
    page, _ = index.page(listing.parse({"status": "failed", "caller": "bob", "n": "200"}), label)
    assert page and all(r.status == "failed" and r.caller == "bob" for r in page)
    start = 1_700_000_000 + 100 * 60.0
    day_runs = [r for r in runs.values() if start <= r.created_at < start + 60]
    fmt = lambda t: time.strftime("%Y-%m-%dT%H:%M", time.gmtime(t))  # noqa: E731
    page, _ = index.page(listing.parse({"from": fmt(start), "to": fmt(start + 60)}), label)
    assert {r.id for r in page} == {r.id for r in day_runs}
    for bad in ({"status": "nope"}, {"from": "tomorrow"}, {"before": "garbage"}, {"n": "x"}):
        with pytest.raises(listing.QueryError):
            listing.parse(bad)
    assert listing.parse({"n": "5000"}).limit == listing.PAGE_MAX
