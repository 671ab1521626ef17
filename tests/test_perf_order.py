"""Mechanisms added for performance (issue 16) keep what they batch in order: events per
run, log lines, agent states; the running count kept incrementally matches the agents;
phases.json is rewritten less often in big runs but always written whole at the end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import trio

from swarmbase import fsutil
from swarmbase.runs import flush
from swarmbase.runs.pending import Pending

from .conftest import agent_json, fake_daemon, run_to_end

ORDER = {"queued": 0, "waiting-budget": 0, "running": 1, "done": 2}


async def test_events_log_lines_and_agent_states_keep_their_order(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=4)
    sup = env.services.supervisor
    seen: list[tuple[str, str, dict[str, Any]]] = []
    publish = sup.env.events.publish

    def recording(run_id: str, name: str, data: dict[str, Any]) -> None:
        seen.append((run_id, name, data))
        publish(run_id, name, data)
    sup.env.events.publish = recording            # type: ignore[method-assign]
    script = ("log('a'); phase('p1');\n"
              "const r = await parallel(Array.from({length: 12}, (_, i) => () => agent('noop ' + i, {maxUsd: 0.5})));\n"
              "for (let i = 0; i < 30; i++) log('line ' + i);\n"
              "phase('p2'); await agent('noop last'); log('c'); return r.length")
    run = await run_to_end(env, script, budgetUsd=5)
    assert run.status == "completed", run.error
    mine = [(name, data) for rid, name, data in seen if rid == run.id]
    # Log lines: in the order the script wrote them, on the stream and on disk.
    logged = [d["message"] for name, d in mine if name == "log"]
    on_disk = [e["message"] for e in fsutil.read_lines(sup.env.store.dir(run) / "log.jsonl")[0]]
    expect = ["a", "phase: p1", *[f"line {i}" for i in range(30)], "phase: p2", "c"]
    assert logged == expect and on_disk == expect
    # Each agent's states only move forward, and end done.
    states: dict[int, list[str]] = {}
    for name, d in mine:
        if name == "agent":
            states.setdefault(d["n"], []).append(d["state"])
    assert sorted(states) == list(range(1, 14))
    for n, st in states.items():
        ranks = [ORDER[s] for s in st]
        assert ranks == sorted(ranks) and st[-1] == "done", (n, st)
        assert agent_json(env, run, n)["state"] == "done"
    # The run's own rows: running while agents ran, completed last; nothing after it.
    runs = [d for name, d in mine if name == "run"]
    assert runs[-1]["status"] == "completed" and mine[-1][0] == "run"
    assert max(r["agents"]["running"] for r in runs) >= 1 and runs[-1]["agents"]["running"] == 0
    # The hub's buffer for the run holds its frames oldest first.
    stream = sup.env.events.get(run.id)
    assert stream is not None
    seqs = [seq for seq, _ in stream.since(stream.floor)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # The final phases.json is complete and matches what viewers were shown.
    phases = json.loads((sup.env.store.dir(run) / "phases.json").read_text())
    assert [p["title"] for p in phases] == ["p1", "p2"]
    assert sorted(a["n"] for p in phases for a in p["agents"]) == list(range(1, 14))
    assert all(a["state"] == "done" for p in phases for a in p["agents"])


async def test_the_running_count_follows_the_agents(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery, perRunConcurrency=3)
    sup = env.services.supervisor
    gate = tmp_path / "gate"
    gate.write_text("")
    run = sup.start(env.cfg.caller("alice"), {
        "script": f"return (await parallel(Array.from({{length: 5}}, (_, i) => () => agent('waitfile:{gate} ' + i))))"
                  ".length", "budgetUsd": 5})
    live = sup.live[run.id]
    with trio.fail_after(60):
        while sup.summary(run)["agents"]["running"] < 3:
            await trio.sleep(0.02)
        assert sup.summary(run)["agents"]["running"] == 3 == sum(a.state == "running" for a in live.agents.values())
        gate.unlink()
        await live.finished.wait()
    assert run.status == "completed", run.error
    assert sup.summary(run)["agents"]["running"] == 0 and live.running == 0


@attrs.define
class _Run:
    def to_json(self) -> dict[str, Any]:
        return {"id": "run_x"}


@attrs.define
class _Live:
    run: _Run
    agents: dict[int, Any]
    writes: Pending = attrs.Factory(Pending)
    views: int = 0
    chains: Any = None          # no hash chains in this fake

    def phases_view(self) -> list[dict[str, Any]]:
        self.views += 1
        return [{"title": "main", "workflow": "", "agents": [{"n": n} for n in self.agents]}]


@attrs.define
class _Store:
    root: Path

    def dir(self, run: Any) -> Path:
        return self.root


async def test_phases_json_is_rewritten_less_often_in_a_big_run_and_whole_at_the_end(
        tmp_path: Path, autojump_clock: Any) -> None:
    store = _Store(tmp_path)

    async def writes_per_second(n_agents: int) -> int:
        live = _Live(_Run(), {n: None for n in range(1, n_agents + 1)})
        for _ in range(40):                 # 10 s of flushes, a change before each
            live.writes.phases_dirty = True
            await flush.write(store, live)     # type: ignore[arg-type]
            await trio.sleep(flush.FLUSH_INTERVAL_S)
        before = live.views
        live.writes.phases_dirty = True
        await flush.write(store, live, final=True)       # type: ignore[arg-type]
        assert live.views == before + 1                 # the end is always written
        assert len(json.loads((tmp_path / "phases.json").read_text())[0]["agents"]) == n_agents
        return before

    assert await writes_per_second(150) == 40           # a run of up to 200 agents: every flush
    assert 3 <= await writes_per_second(2000) <= 5       # 2,000 agents: every 2.5 s
