"""The event hub: frames serialised once, bounded coalescing buffers, reload for ids it
cannot serve, ended runs' streams shrunk and evicted so memory stays flat."""

from __future__ import annotations

import json
import math

from swarmbase import events
from swarmbase.events import LIST, EventHub, agent_key


def frames_of(hub: EventHub, key: str, after: int) -> list[tuple[str, dict]]:
    s = hub.get(key)
    assert s is not None
    got = s.since(after)
    assert got is not None
    out = []
    for _, data in got:
        head, body = data.decode().split("\ndata: ")
        out.append((head.split("event: ")[1], json.loads(body)))
    return out


def run_row(run_id: str, status: str = "running", **kw: object) -> dict:
    return {"runId": run_id, "status": status, "label": run_id, "agents": {"done": 0, "total": 0}, **kw}


def test_one_serialisation_shared_by_every_viewer() -> None:
    hub = EventHub(start=0)
    hub.publish("r1", "log", {"message": "hello"})
    a = hub.get("r1").since(0)
    b = hub.get("r1").since(0)
    assert a[0][1] is b[0][1]                       # the same bytes object, not a copy
    assert a[0][1].startswith(b"id: 1\nevent: log\ndata: {") and a[0][1].endswith(b"\n\n")


def test_coalescing_keeps_the_latest_row_and_every_log_line() -> None:
    hub = EventHub(start=0)
    for i in range(100):
        hub.publish("r1", "log", {"message": f"line {i}"})
        hub.publish("r1", "run", run_row("r1", spentUsd=i))
        hub.publish_list(run_row("r1", spentUsd=i))
        hub.publish("r1", "agent", {"n": 1, "state": "running", "costUsd": i})
    got = frames_of(hub, "r1", 0)
    assert [d["message"] for name, d in got if name == "log"] == [f"line {i}" for i in range(100)]
    assert [d["spentUsd"] for name, d in got if name == "run"] == [99]
    assert [d["costUsd"] for name, d in got if name == "agent"] == [99]
    assert [d["spentUsd"] for name, d in frames_of(hub, LIST, 0)] == [99]
    # Order is publish order of what is kept.
    seqs = [seq for seq, _ in hub.get("r1").since(0)]
    assert seqs == sorted(seqs)


def test_bounded_buffers_and_reload_for_ids_too_old() -> None:
    hub = EventHub(start=1000)
    for i in range(5_000):
        hub.publish("r1", "log", {"message": "x" * 500})
    s = hub.get("r1")
    max_events, max_bytes = events.LIMITS["run"]
    assert len(s) <= max_events and s.size <= max_bytes
    assert s.since(1000) is None                    # evicted: the viewer must reload
    assert s.since(s.floor) and len(s.since(s.floor)) == len(s)
    assert s.since(hub.seq) == []


def test_nan_never_reaches_a_frame() -> None:
    hub = EventHub(start=0)
    hub.publish("r1", "agent", {"n": 1, "costUsd": math.nan, "tokens": [math.inf]})
    [(_, data)] = frames_of(hub, "r1", 0)
    assert data["costUsd"] is None and data["tokens"] == [None]


def test_agent_lines_reach_the_agent_stream_and_end_with_it() -> None:
    hub = EventHub(start=0)
    hub.render_line = lambda entry: [{"kind": "text", "title": entry["t"]}]
    hub.publish_agent_line("r1", 3, {"t": "hello"})
    hub.publish_agent_line("r1", 3, {"skip": True, "t": ""})
    s = hub.watch(agent_key("r1", 3))
    s.viewers = 1
    hub.publish("r1", "agent", {"n": 3, "state": "running", "costUsd": 0.1})
    got = frames_of(hub, agent_key("r1", 3), 0)
    assert [name for name, _ in got] == ["line", "line", "agent"]
    assert got[0][1]["items"] == [{"kind": "text", "title": "hello"}]
    # An agent that others do not watch leaves no stream behind when it ends.
    hub.publish_agent_line("r1", 4, {"t": "x"})
    hub.publish("r1", "agent", {"n": 4, "state": "done"})
    assert hub.get(agent_key("r1", 4)) is None
    # A watched one is kept, ended, for its viewer; the run's end parks everything.
    hub.publish("r1", "agent", {"n": 3, "state": "done"})
    assert hub.get(agent_key("r1", 3)).ended
    hub.publish("r1", "run", run_row("r1", "completed"))
    assert hub.get("r1").ended and "r1" not in hub.live


def test_memory_is_flat_over_two_thousand_ended_runs() -> None:
    hub = EventHub(start=0)

    def one_run(i: int) -> None:
        rid = f"run_{i:012x}"
        hub.publish(rid, "run", run_row(rid, "queued"))
        for n in range(1, 9):
            hub.publish(rid, "agent", {"n": n, "state": "running", "label": "a" * 40})
            hub.publish_agent_line(rid, n, {"type": "assistant", "text": "t" * 200})
            hub.publish(rid, "agent", {"n": n, "state": "done", "label": "a" * 40})
        for k in range(20):
            hub.publish(rid, "log", {"message": "m" * 100})
        hub.publish(rid, "run", run_row(rid, "completed"))
        hub.publish_list(run_row(rid, "completed"))

    for i in range(100):
        one_run(i)
    after_100 = hub.retained_bytes()
    for i in range(100, 2_000):
        one_run(i)
    assert len(hub.ended) <= events.KEEP_ENDED and set(hub.live) == {LIST}
    assert not hub._agents_of
    # Growth past the first hundred is only the run list's bounded buffer filling up.
    assert hub.retained_bytes() - after_100 <= events.LIMITS["list"][1]
    assert hub.retained_bytes() < 2 * 1024 * 1024


def test_a_fresh_stream_never_replays_what_it_cannot_have() -> None:
    hub = EventHub(start=0)
    hub.publish("old", "log", {"message": "x"})
    hub.publish("old", "run", run_row("old", "completed"))
    for i in range(events.KEEP_ENDED + 1):        # push "old" out of the ended set
        hub.publish(f"r{i}", "run", run_row(f"r{i}", "completed"))
    assert hub.get("old") is None
    again = hub.watch("old", ended=True)
    assert again.since(0) is None                 # its events are gone: reload
    assert again.since(hub.seq) == []             # a page rendered now is fine
