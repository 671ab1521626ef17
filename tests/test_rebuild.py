"""runs/rebuild.py's pure functions: salvaging a torn run.json, phases from agent records,
a run record from its dir's other files (issue 25 #4, #5)."""

from __future__ import annotations

import json
from pathlib import Path

from swarmbase.runs import rebuild
from swarmbase.runs.journal import args_hash, header
from swarmbase.runs.records import AgentRecord

DIR = "20260101T000000Z-run_0123456789ab"


def agent(n: int, state: str, phase: str | None = "main", workflow: str = "", error: str | None = None,
          cost: float = 0.01) -> AgentRecord:
    return AgentRecord(n=n, dir=Path("/nowhere") / str(n), label=f"a{n}", engine="claude", model=None,
                       profile="read", state=state, phase=phase, workflow=workflow, error=error, cost_usd=cost)


def parts(**kw):
    args = {"journal_head": header("run_0123456789ab", args_hash({"x": 1}), "alice"), "agents": [],
            "script": "// a comment\nreturn 1", "result": None, "last_log": None, "log_at": None,
            "fault": "run.json unreadable", "damaged_copy": "run.json.damaged-x", "now": 1767225700.0}
    return {**args, **kw}


def test_salvage_keeps_the_whole_fields_of_a_torn_object() -> None:
    whole = json.dumps({"id": "run_1", "caller": "alice", "label": "L", "history": [{"status": "queued"}],
                        "args": {"x": [1, 2]}}).encode()
    cut = whole[:whole.index(b'"args"') + 12]
    assert rebuild.salvage_object(cut) == {"id": "run_1", "caller": "alice", "label": "L",
                                           "history": [{"status": "queued"}]}
    assert rebuild.salvage_object(whole)["args"] == {"x": [1, 2]}
    assert rebuild.salvage_object(b"\x00\xff\xfe garbage") == {}
    assert rebuild.salvage_object(b'["not", "an", "object"]') == {}
    assert rebuild.salvage_object(b'{"a": 1, 2: 3}') == {"a": 1}


def test_phases_are_the_agents_grouped_in_order() -> None:
    got = rebuild.phases_from_agents([agent(3, "done", "two"), agent(1, "done", "one"), agent(2, "failed", "one"),
                                      agent(4, "done", None, workflow="1"), agent(5, "done", None)])
    assert [(p["title"], p["workflow"], [a["n"] for a in p["agents"]]) for p in got] == [
        ("one", "", [1, 2]), ("two", "", [3]), ("workflow 1", "1", [4]), ("main", "", [5])]


def test_a_run_needs_a_caller_from_the_file_or_the_journal() -> None:
    assert rebuild.run_from_parts(DIR, {}, **parts(journal_head={"schema": "x", "args": "y"})) is None
    assert rebuild.run_from_parts("not-a-run", {"caller": "alice"}, **parts()) is None
    run = rebuild.run_from_parts(DIR, {"caller": "bob"}, **parts())
    assert run is not None and run.caller == "bob"           # the salvaged field wins
    run = rebuild.run_from_parts(DIR, {}, **parts())
    assert run is not None and (run.id, run.caller, run.dir_name) == ("run_0123456789ab", "alice", DIR)
    assert run.created_at == 1767225600.0 and run.script_comment == "a comment"


def test_how_a_rebuilt_run_ended() -> None:
    salvaged = rebuild.run_from_parts(DIR, {"status": "cancelled", "error": "by x"}, **parts(result=(True, 5.0)))
    assert (salvaged.status, salvaged.error) == ("cancelled", "by x")
    done = rebuild.run_from_parts(DIR, {"status": "running"}, **parts(result=(True, 1767225601.0)))
    assert (done.status, done.ended_at) == ("completed", 1767225601.0)
    failed = rebuild.run_from_parts(DIR, {}, **parts(result=(False, None), log_at=1767225602.0,
                                                     last_log={"message": "run failed: agent(): boom"}))
    assert (failed.status, failed.error, failed.ended_at) == ("failed", "agent(): boom", 1767225602.0)
    flight = rebuild.run_from_parts(DIR, {}, **parts(last_log={"message": "phase: two"}))
    assert flight.status == "running" and flight.history[-1]["reason"] == "rebuilt at boot from the run's files"


def test_counts_spend_and_what_was_lost() -> None:
    agents = [agent(1, "done", cost=0.5), agent(2, "failed", cost=0.25), agent(3, "interrupted"),
              agent(4, "cancelled", error="cancelled with the run (shutdown)"), agent(5, "cancelled", error="lost race")]
    run = rebuild.run_from_parts(DIR, {"label": "L", "budgetUsd": 3}, **parts(agents=agents))
    assert (run.agents_total, run.agents_done) == (5, 3)
    assert round(run.spent_usd, 6) == 0.78 and run.label == "L" and run.budget_usd == 3
    assert "args" in run.rebuilt["lost"] and "budgetUsd" not in run.rebuilt["lost"]
    assert run.rebuilt["damagedCopy"] == "run.json.damaged-x"
    assert "not recovered: args" in run.summary()["rebuilt"]
    no_args = rebuild.run_from_parts(DIR, {}, **parts(journal_head=header("run_0123456789ab", args_hash(None), "a")))
    assert "args" not in no_args.rebuilt["lost"] and no_args.args is None     # the journal says: none
    bad_types = rebuild.run_from_parts(DIR, {"budgetUsd": "lots", "keepWork": 1, "status": "weird"}, **parts())
    assert bad_types.budget_usd == 0.0 and bad_types.keep_work is False and bad_types.status == "running"
