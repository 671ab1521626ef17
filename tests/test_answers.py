"""What agent() answers and what an agent is charged (runs/answers.py): pure functions."""

from __future__ import annotations

from swarmbase.engines.base import LiveUsage
from swarmbase.engines.verdict import Verdict
from swarmbase.prices import Tokens
from swarmbase.runs import answers


def test_a_killed_agent_is_charged_what_it_streamed_and_nothing_before_a_response() -> None:
    assert answers.killed_cost(LiveUsage(cost_usd=0.3, responses=0)) == 0.0
    assert answers.killed_cost(LiveUsage(cost_usd=0.3, responses=1)) == 0.3


def test_charge_prefers_the_clis_own_figures() -> None:
    streamed = LiveUsage(tokens=Tokens(input=10, output=5), cost_usd=0.02, responses=1)
    exact = Verdict(ok=True, cost_usd=0.5, tokens=Tokens(input=100, output=50), tokens_exact=True)
    assert answers.charge(exact, streamed) == (Tokens(input=100, output=50), 0.5, False)
    # No cost reported: priced from what streamed, marked estimated.
    unknown = Verdict(ok=True, cost_usd=None, tokens=Tokens(input=100, output=50), tokens_exact=True)
    assert answers.charge(unknown, streamed) == (Tokens(input=100, output=50), 0.02, True)
    # No verdict at all (killed): what streamed; with no response begun, $0 and not estimated.
    assert answers.charge(None, streamed) == (Tokens(input=10, output=5), 0.02, True)
    assert answers.charge(None, LiveUsage()) == (Tokens(), 0.0, False)


def test_a_workflow_stop_covers_its_nested_workflows_only() -> None:
    gone = {"2": "lost the race"}
    assert answers.workflow_stop(gone, "2") == ("cancelled", "cancelled: lost the race (workflow 2)")
    assert answers.workflow_stop(gone, "2/1") is not None
    assert answers.workflow_stop(gone, "21") is None and answers.workflow_stop(gone, "") is None


def test_replayed_detail_is_free_and_marked() -> None:
    assert answers.replayed(False, 3, {"x": 1}, None) == {"x": 1}
    d = answers.replayed(True, 3, {"x": 1}, "swarmbase/run_x/3")
    assert d["replayed"] and d["costUsd"] == 0.0 and d["text"] == '{"x": 1}' and d["worktree"] == "swarmbase/run_x/3"
