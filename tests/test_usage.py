"""Spend reports: the figures equal the sums of the agent records on disk, grouped by UTC
day of the agent's end, caller, engine and model; replays are not counted twice."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from swarmbase import config, daemon, money, usage
from swarmbase.prices import Tokens

from .audit_runs import AgentSpec, run_dir, write_run
from .conftest import write_config

TODAY = dt.date(2026, 3, 15)


def at(day: str, hour: int = 12) -> float:
    d = dt.date.fromisoformat(day)
    return dt.datetime(d.year, d.month, d.day, hour, tzinfo=dt.timezone.utc).timestamp()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    write_config(state, callers=["alice", "bob"])
    write_run(state, [AgentSpec("a", cost=0.10, ended_at=at("2026-03-14", 23)),
                      AgentSpec("b", cost=0.20, ended_at=at("2026-03-15", 0)),       # the next UTC day
                      AgentSpec("c", engine="codex", model="gpt-5", cost=0.0, priced=False,
                                tokens=Tokens(input=7000, output=300), ended_at=at("2026-03-15"))],
              caller="alice", created_at=at("2026-03-14", 22))
    old = write_run(state, [AgentSpec("d", cost=0.05, ended_at=at("2026-03-01"), estimated=True)],
                    caller="alice", created_at=at("2026-03-01", 11))
    write_run(state, [AgentSpec("d", replayed=True, cost=0.0, tokens=Tokens(), ended_at=at("2026-03-10")),
                      AgentSpec("e", cost=0.07, ended_at=at("2026-03-10"), state="failed")],
              caller="alice", resumed_from=old, created_at=at("2026-03-10", 11))
    write_run(state, [AgentSpec("f", cost=0.33, ended_at=at("2026-03-14")),
                      AgentSpec("g", cost=1.5, ended_at=at("2026-01-02"))],            # outside 30 days
              caller="bob", created_at=at("2026-01-02", 11))
    return state


def sum_of_records(state: Path, lo: str, hi: str, caller: str | None = None) -> dict:
    """The expected figures, read straight from every agent.json without the usage module."""
    lo_t, hi_t = at(lo, 0), at(hi, 0) + 86400
    cost, tokens, agents = 0.0, 0, 0
    for rj in (state / "runs").glob("*/run.json"):
        run = json.loads(rj.read_text())
        if caller and run["caller"] != caller:
            continue
        for aj in rj.parent.glob("agents/*/agent.json"):
            rec = json.loads(aj.read_text())
            if rec["replayed"] or not lo_t <= rec["endedAt"] < hi_t:
                continue
            cost += rec["costUsd"]
            tokens += rec["tokens"]["total"]
            agents += 1
    return {"costUsd": round(cost, 6), "tokens": tokens, "agents": agents}


def test_figures_match_the_records(state: Path) -> None:
    rep = usage.report_for_state(state, today=TODAY)
    assert (rep["from"], rep["to"]) == ("2026-02-14", "2026-03-15")
    assert rep["totals"] == sum_of_records(state, "2026-02-14", "2026-03-15")
    assert rep["totals"]["agents"] == 6            # a, b, c, d, e, f (not the replay, not g)
    rows = {(r["date"], r["caller"], r["engine"], r["model"]): r for r in rep["rows"]}
    assert rows[("2026-03-14", "alice", "claude", "claude-sonnet-5-5")]["costUsd"] == pytest.approx(0.10)
    assert rows[("2026-03-15", "alice", "claude", "claude-sonnet-5-5")]["costUsd"] == pytest.approx(0.20)
    codex = rows[("2026-03-15", "alice", "codex", "gpt-5")]
    assert codex["tokens"] == 7300 and codex["unpriced"] == 1 and codex["costUsd"] == 0
    assert rows[("2026-03-01", "alice", "claude", "claude-sonnet-5-5")]["estimated"] is True
    assert rows[("2026-03-10", "alice", "claude", "claude-sonnet-5-5")]["agents"] == 1      # e only
    assert [r["date"] for r in rep["rows"]] == sorted(r["date"] for r in rep["rows"])


@pytest.mark.parametrize("lo,hi,caller", [("2026-01-01", "2026-03-15", None), ("2026-03-15", "2026-03-15", "alice"),
                                          ("2026-01-01", "2026-12-31", "bob"), ("2025-01-01", "2025-01-31", None)])
def test_ranges_and_callers(state: Path, lo: str, hi: str, caller: str | None) -> None:
    rep = usage.report_for_state(state, lo, hi, caller)
    assert rep["totals"] == sum_of_records(state, lo, hi, caller)
    assert all(r["caller"] == caller for r in rep["rows"]) if caller else True


def test_damaged_record_is_skipped_not_fatal(state: Path) -> None:
    victim = next((state / "runs").glob("*/agents/1/agent.json"))
    victim.write_text("{torn")
    rep = usage.report_for_state(state, "2026-01-01", "2026-03-31")
    assert rep["totals"] == sum_of_records_skipping(state, victim)


def sum_of_records_skipping(state: Path, victim: Path) -> dict:
    cost, tokens, agents = 0.0, 0, 0
    for aj in (state / "runs").glob("*/agents/*/agent.json"):
        if aj == victim:
            continue
        rec = json.loads(aj.read_text())
        if not rec["replayed"]:
            cost, tokens, agents = cost + rec["costUsd"], tokens + rec["tokens"]["total"], agents + 1
    return {"costUsd": round(cost, 6), "tokens": tokens, "agents": agents}


@pytest.mark.parametrize("lo,hi,msg", [("2026-13-01", None, "calendar"), ("03/01/2026", None, "not a date"),
                                       ("2026-03-10", "2026-03-01", "after"), ("2020-01-01", "2026-01-01", "longer")])
def test_bad_ranges(state: Path, lo: str, hi: str | None, msg: str) -> None:
    with pytest.raises(usage.UsageError, match=msg):
        usage.report_for_state(state, lo, hi, today=TODAY)


def test_tool_schema() -> None:
    v = jsonschema.Draft202012Validator(usage.TOOL["inputSchema"])
    assert v.is_valid({}) and v.is_valid({"from": "2026-01-01", "to": "2026-01-31"})
    assert not v.is_valid({"from": "yesterday"}) and not v.is_valid({"caller": "bob"})


async def test_tool_handler_sees_only_its_caller(state: Path) -> None:
    """Through the real supervisor (runs loaded by recover()), as the tool will run."""
    services = daemon.build_services(config.load(state / "config.json"))
    services.supervisor.recover()
    alice = services.cfg.caller("alice")
    got = usage.tool_handler(services.supervisor, alice, {"from": "2026-01-01", "to": "2026-03-31"})
    assert got["totals"] == sum_of_records(state, "2026-01-01", "2026-03-31", "alice")
    assert {r["caller"] for r in got["rows"]} == {"alice"}
    assert got == {**usage.report_for_state(state, "2026-01-01", "2026-03-31", "alice"), "quota": []}   # none set


def test_cli_table_and_json(state: Path) -> None:
    out = io.StringIO()
    assert usage.usage_command(state, "2026-01-01", "2026-03-31", None, False, out) == 0
    table = out.getvalue()
    assert "2026-03-15  alice   codex" in table and "(1 no price)" in table and "total" in table
    # Money at the one precision ($0.0001, half up); the foot is the sum of the rows shown.
    assert money.usd(sum_of_records(state, '2026-01-01', '2026-03-31')['costUsd']) in table.splitlines()[-1]
    shown = [line.split()[-1].rstrip("~") for line in table.splitlines()[2:-1] if "no price" not in line]
    assert all(re.fullmatch(r"\$\d+\.\d{4}", amount) for amount in shown), shown
    err = io.StringIO()
    assert usage.usage_command(state, "nope", None, None, False, io.StringIO(), err) == 2
    assert "not a date" in err.getvalue()
    env = dict(os.environ, SWARMBASE_CONFIG=str(state / "config.json"))
    p = subprocess.run([sys.executable, "-m", "swarmbase", "usage", "--from", "2026-01-01", "--to", "2026-03-31",
                        "--caller", "bob", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["totals"] == sum_of_records(state, "2026-01-01", "2026-03-31", "bob")


def test_run_dirs_are_pruned_by_window(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs that ended before the window are not opened at all."""
    opened: list[Path] = []
    real = usage.agent_records
    monkeypatch.setattr(usage, "agent_records", lambda d: (opened.append(d), real(d))[1])
    rep = usage.report_for_state(state, "2026-03-14", "2026-03-15")
    assert rep["totals"] == sum_of_records(state, "2026-03-14", "2026-03-15")
    # alice's first run and bob's run (its agent f ended on the 14th); not the two runs of March 1st and 10th
    assert len(opened) == 2


async def test_tool_through_tools_call(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The code docs/audit-integration.md gives the lead for swarmbase/mcpl/tools.py, applied
    here to the real module: a result for the calling caller, a bad range as a tool error,
    a bad argument as -32602."""
    from swarmbase.mcpl import tools
    from swarmbase.mcpl.jsonrpc import RpcError

    def _usage(sup, caller, a):                    # the handler, as given to the lead
        try:
            return usage.tool_handler(sup, caller, a)
        except usage.UsageError as e:
            raise tools.ToolError(str(e)) from None

    monkeypatch.setattr(tools, "TOOLS", [*tools.TOOLS, usage.TOOL])
    monkeypatch.setattr(tools, "_VALIDATORS", {**tools._VALIDATORS,
                                               "usage": jsonschema.Draft202012Validator(usage.TOOL["inputSchema"])})
    monkeypatch.setattr(tools, "HANDLERS", {**tools.HANDLERS, "usage": _usage})
    services = daemon.build_services(config.load(state / "config.json"))
    services.supervisor.recover()
    bob = services.cfg.caller("bob")
    ok = tools.call(services.supervisor, bob, {"name": "usage", "arguments": {"from": "2026-01-01", "to": "2026-03-31"}})
    assert ok["structuredContent"]["totals"] == sum_of_records(state, "2026-01-01", "2026-03-31", "bob")
    bad = tools.call(services.supervisor, bob, {"name": "usage", "arguments": {"from": "2026-03-31", "to": "2026-01-01"}})
    assert bad["isError"] and "after" in bad["content"][0]["text"]
    with pytest.raises(RpcError):
        tools.call(services.supervisor, bob, {"name": "usage", "arguments": {"caller": "alice"}})


def test_ended_runs_are_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's cache: an ended run's records are read on the first report only; a run
    in flight is read every time (its agents are still ending)."""
    state = tmp_path / "state"
    ended = write_run(state, [AgentSpec("a", cost=0.5)])
    live = write_run(state, [AgentSpec("b", cost=0.25)], status="running", sealed=False)
    cache = usage.SpentCache(max_runs=10)
    reads: list[Path] = []
    real = usage.spent_in
    monkeypatch.setattr(usage, "spent_in", lambda d: (reads.append(d), real(d))[1])
    runs = [("alice", run_dir(state, ended), True), ("alice", run_dir(state, live), False)]
    today = dt.datetime.now(dt.timezone.utc).date()
    first = usage.report(runs, today - dt.timedelta(days=1), today, cache)
    second = usage.report(runs, today - dt.timedelta(days=1), today, cache)
    assert first == second and first["totals"]["costUsd"] == pytest.approx(0.75)
    assert reads == [run_dir(state, ended), run_dir(state, live), run_dir(state, live)]
    small = usage.SpentCache(max_runs=1)
    small.spent(run_dir(state, ended), True)
    small.spent(run_dir(state, live), True)
    assert list(small._runs) == [run_dir(state, live)]          # bounded: the oldest is dropped
