"""Notice params: the budget warning and the dashboard link in run-end notices."""

from __future__ import annotations

from swarmbase.notify import notices
from swarmbase.mcpl.features import NOTIFY_SET, TAG_ONTOLOGY
from swarmbase.runs.model import Run


def run(**kw: object) -> Run:
    return Run(id="run_0123456789ab", caller="alice", dir_name="d", created_at=0.0, label="nightly",
               budget_usd=5.0, **kw)  # type: ignore[arg-type]


def test_budget_warning_names_spend_budget_and_link() -> None:
    url = "https://swarm.example/runs/run_0123456789ab"
    p = notices.build_budget_warning(run(status="running"), spent=3.2, reserved=0.9, budget=5.0, url=url, now=0)
    assert p["featureSet"] == NOTIFY_SET
    assert p["eventId"] == "run_0123456789ab:budget-warning"
    assert p["origin"] == {"source": "swarmbase", "kind": "budget-warning", "runId": "run_0123456789ab", "url": url}
    assert p["tags"] == ["swarmbase:budget-warning"]
    assert all(t in TAG_ONTOLOGY["tags"] for t in p["tags"])          # every tag it carries is declared
    text = p["payload"]["content"][0]["text"]
    assert "spent $3.2000" in text and "$0.9000 reserved" in text and "$5.0000 budget (82%)" in text
    assert "nightly" in text and url in text and "cancel" in text
    assert p["timestamp"] == "1970-01-01T00:00:00.000Z"


def test_run_end_notice_carries_its_link_and_keeps_its_event_id() -> None:
    r = run(status="completed")
    url = "http://127.0.0.1:7360/runs/run_0123456789ab"
    a, b = notices.build(r, "42", url=url), notices.build(r, "42", url=url)
    assert a["eventId"] == b["eventId"] == "run_0123456789ab:end"
    assert a["origin"]["url"] == url and f"Dashboard: {url}" in a["payload"]["content"][0]["text"]
    assert "url" not in notices.build(r, "42")["origin"]
