"""runs/quota.py with an injected clock: UTC window bounds (day, month, year end, leap
day), the boundary resetting a window, the reservation rule under many runs admitted at
once (never more reserved than the limit), an active run across midnight, ended runs
folded once and runs from before boot read from disk once."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import attrs
import pytest

from swarmbase import config, usage
from swarmbase.runs import quota
from swarmbase.runs.quota import QuotaBook


def at(text: str) -> float:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


@attrs.define
class Rec:                       # the AgentRecord fields the book reads
    ended_at: float | None = None
    cost_usd: float = 0.0
    replayed: bool = False


@attrs.define
class FakeRun:                   # the Run fields the book reads
    id: str
    caller: str
    budget_usd: float
    status: str = "running"

    @property
    def active(self) -> bool:
        return self.status == "running"


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def caller(**kw: Any) -> config.Caller:
    return config.Caller(name="alice", tokenSha256="a" * 64, **kw)


def book(clock: Clock, history: Any = None, read: Any = None) -> QuotaBook:
    return QuotaBook(history or (lambda c, lo, hi: []), clock=clock, read=read or (lambda d: []))


def test_window_bounds_are_utc_days_and_months() -> None:
    assert quota.bounds("day", at("2026-12-31T23:59:59")) == (at("2026-12-31T00:00:00"), at("2027-01-01T00:00:00"))
    assert quota.bounds("month", at("2026-12-31T23:59:59")) == (at("2026-12-01T00:00:00"), at("2027-01-01T00:00:00"))
    assert quota.bounds("month", at("2028-02-29T12:00:00")) == (at("2028-02-01T00:00:00"), at("2028-03-01T00:00:00"))
    assert quota.bounds("day", at("2027-01-01T00:00:00"))[0] == at("2027-01-01T00:00:00")


def test_the_boundary_resets_the_window() -> None:
    clock = Clock(at("2026-12-31T23:00:00"))
    b = book(clock)
    alice = caller(usdPerDay=10, usdPerMonth=100)
    run = FakeRun("r1", "alice", 4.0)
    agents = {1: Rec(at("2026-12-31T23:59:59"), 3.0), 2: Rec(at("2026-12-31T23:30:00"), 1.0, replayed=True)}
    b.admit(run, agents)
    day, month = b.windows(alice)
    assert (day.spent, day.reserved, day.left) == (3.0, 1.0, 6.0)       # a replay spends nothing
    assert day.view()["resetsAt"] == "2027-01-01T00:00:00Z" and month.view()["resetsAt"] == "2027-01-01T00:00:00Z"
    run.status = "completed"
    clock.t = at("2026-12-31T23:59:59.999")
    day, month = b.windows(alice)
    assert (day.spent, day.reserved, month.spent) == (3.0, 0.0, 3.0)
    clock.t = at("2027-01-01T00:00:00")
    day, month = b.windows(alice)
    assert (day.spent, month.spent, day.left, month.left) == (0.0, 0.0, 10.0, 100.0)
    assert day.view()["from"] == "2027-01-01T00:00:00Z" and day.view()["resetsAt"] == "2027-01-02T00:00:00Z"


def test_an_active_run_across_midnight_reserves_only_what_it_has_not_spent() -> None:
    clock = Clock(at("2026-12-02T00:10:00"))
    b = book(clock)
    b.admit(FakeRun("r1", "alice", 5.0), {1: Rec(at("2026-12-01T23:50:00"), 2.0), 2: Rec()})
    (day,) = b.windows(caller(usdPerDay=10))
    assert (day.spent, day.reserved, day.left) == (0.0, 3.0, 7.0)


def test_runs_admitted_at_once_never_reserve_more_than_the_limit() -> None:
    """The reservation rule under a random mix of budgets, agents ending (inside their
    caps) and runs ending: at every step spent + reserved <= limit, and spent <= limit."""
    rng = random.Random(24)
    clock = Clock(at("2026-12-02T08:00:00"))
    b = book(clock)
    alice = caller(usdPerDay=10.0)
    live: list[tuple[FakeRun, dict[int, Rec]]] = []
    admitted = refused = 0
    for i in range(400):
        clock.t += 30
        budget = rng.choice([0.5, 1.0, 2.5, 4.0])
        why = b.refusal(alice, budget)
        if why is None:
            run, agents = FakeRun(f"r{i}", "alice", budget), {}
            b.admit(run, agents)
            live.append((run, agents))
            admitted += 1
        else:
            assert "this caller's daily spend quota cannot fit the run" in why
            refused += 1
        for run, agents in live:
            spent = sum(a.cost_usd for a in agents.values())
            if run.active and rng.random() < 0.5:
                agents[len(agents) + 1] = Rec(clock.t, rng.uniform(0, run.budget_usd - spent))
            if run.active and rng.random() < 0.2:
                run.status = "completed"
        (day,) = b.windows(alice)
        assert day.spent + day.reserved <= 10.0 + 1e-9
    assert admitted > 5 and refused > 5


def test_refusal_names_what_is_left_and_the_reset() -> None:
    clock = Clock(at("2026-12-02T08:00:00"))
    b = book(clock)
    b.admit(FakeRun("r1", "alice", 0.9), {1: Rec(at("2026-12-02T07:00:00"), 0.25)})
    assert b.refusal(caller(usdPerDay=1.0), 0.3) == (
        "this caller's daily spend quota cannot fit the run: its budget is $0.3000 and $0.1000 is left of usdPerDay "
        "$1.0000 ($0.2500 spent, $0.6500 reserved by running runs); the window resets at 2026-12-03T00:00:00Z (UTC). "
        "Pass a budgetUsd that fits, or wait")
    assert b.refusal(caller(usdPerDay=1.0), 0.1) is None
    assert b.refusal(caller(), 1e6) is None            # no quota, no check


def test_history_is_read_from_disk_once_and_never_twice_with_memory(tmp_path: Path) -> None:
    clock = Clock(at("2026-12-02T08:00:00"))
    reads: list[Path] = []

    def read(d: Path) -> list[usage.Spent]:
        reads.append(d)
        return [usage.Spent(at("2026-12-01T10:00:00"), "claude", None, 2.0, 10, False, False),
                usage.Spent(at("2026-12-02T07:00:00"), "claude", None, 1.0, 10, False, False)]
    b = book(clock, history=lambda c, lo, hi: [("old", tmp_path / "old"), ("new", tmp_path / "new")], read=read)
    b.admit(FakeRun("new", "alice", 1.0, status="completed"), {})      # counted from memory: not read
    alice = caller(usdPerDay=5, usdPerMonth=50)
    for _ in range(3):
        day, month = b.windows(alice)
        assert (day.spent, month.spent) == (1.0, 3.0)
    assert reads == [tmp_path / "old"]


@pytest.mark.parametrize("bad,message", [
    ({"usdPerDay": 20, "usdPerMonth": 10}, "callers[0].usdPerDay: 20 is above usdPerMonth 10"),
    ({"usdPerDay": -1}, "callers[0].usdPerDay: must be between 0 and 1e+07, got -1"),
])
def test_config_validates_quotas(tmp_path: Path, bad: dict[str, Any], message: str) -> None:
    from .conftest import write_config
    path, _ = write_config(tmp_path, callers=["alice"], sandbox="none", caller_extra=bad)
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert str(e.value).endswith(message), str(e.value)


def test_a_caller_being_counted_is_refused_as_pending_not_admitted(tmp_path: Path) -> None:
    clock = Clock(at("2026-12-02T08:00:00"))
    spent = [usage.Spent(at("2026-12-02T07:00:00"), "claude", None, 0.9, 10, False, False)]
    b = book(clock, history=lambda c, lo, hi: [("old", tmp_path)], read=lambda d: spent)
    alice = caller(usdPerDay=1.0)
    names = b.begin_priming([alice, config.Caller(name="bob", tokenSha256="b" * 64)])
    assert names == ["alice"]                                   # bob has no quota: nothing to read
    assert b.refusal(alice, 0.05) == quota.PENDING
    assert b.view(alice) == [{"window": "day", "limitUsd": 1.0, "pending": quota.PENDING}]
    b.prime_all(names)
    assert b.refusal(alice, 0.05) is None and "$0.1000 is left" in b.refusal(alice, 0.2)


def test_tools_list_tells_a_caller_its_quota(tmp_path: Path) -> None:
    from swarmbase.mcpl import tool_docs, tools

    from .conftest import write_config
    cfg = config.load(write_config(tmp_path, callers=["alice"], sandbox="none",
                                   caller_extra={"usdPerDay": 2, "usdPerMonth": 40})[0])

    def budget_text(c: config.Caller) -> str:
        run = next(t for t in tool_docs.for_caller(tools.TOOLS, c, cfg) if t["name"] == "run")
        return run["inputSchema"]["properties"]["budgetUsd"]["description"]
    assert ("it must fit what is left of your spend quota (usdPerDay $2.0000, usdPerMonth $40.0000, UTC"
            in budget_text(cfg.callers[0]))
    assert "quota" not in budget_text(attrs.evolve(cfg.callers[0], usdPerDay=None, usdPerMonth=None))
    usage_tool = next(t for t in tool_docs.for_caller(tools.TOOLS, cfg.callers[0], cfg) if t["name"] == "usage")
    assert "resetsAt" in usage_tool["description"]
