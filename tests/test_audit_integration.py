"""Round 2 (after the core merge): chains, spend, metrics and traces from real runs of the
real daemon (fake claude CLI, real Node runner), including a kill -9 mid-run."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from swarmbase import usage
from swarmbase.client import connect
from swarmbase.mcpl import tools

from .clidaemon import held_fan_out
from .conftest import audit, fake_daemon, run_to_end, spawns, start_cli_daemon
from .fakes.otlp import OtlpReceiver, attrs_of

SCRIPT = ("phase('fan-out');\nlog('starting');\n"
          "const xs = await parallel([1, 2, 3].map((i) => () => agent('noop ' + i, {label: 'a' + i})));\n"
          "phase('last');\nreturn [...xs, await agent('noresult', {label: 'broken'})];")


async def test_real_runs_are_chained_and_verify(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)
    sup = env.services.supervisor
    run = await run_to_end(env, SCRIPT)
    assert run.status == "completed" and run.end is not None
    code, text = audit(env.state, run.id)
    assert code == 0 and "every chain is intact" in text and "#4 broken" in text, text
    new = sup.resume(env.cfg.caller("alice"), run.id, {})
    with trio.fail_after(60):
        await sup.live[new.id].finished.wait()
    code, text = audit(env.state, new.id)
    assert code == 0 and "(replayed)" in text and run.id in text, text
    # An edit to the old run's journal is named through the new run.
    path = sup.env.store.dir(run) / "journal.jsonl"
    rows = path.read_bytes().splitlines(keepends=True)
    rows[2] = rows[2].replace(b'"noop"', b'"nope"')
    path.write_bytes(b"".join(rows))
    code, text = audit(env.state, new.id)
    assert code == 1 and f"runs/{run.dir_name}/journal.jsonl line 3" in text
    # Spend: the usage tool agrees with the records.
    got = tools.call(sup, env.cfg.caller("alice"), {"name": "usage", "arguments": {}})["structuredContent"]
    assert {k: v for k, v in got.items() if k != "quota"} == usage.report_for_state(env.state, caller="alice")
    assert got["totals"]["agents"] == 5          # 4 + the re-run failing agent (3 replayed)
    async with connect(env.ws, env.tokens["alice"]) as h:         # over MCPL, in a worker thread
        await h.handshake()
        over_ws = (await h.tool("usage", {}))["structuredContent"]
        bad = await h.tool("usage", {"from": "2026-13-01"})
    assert over_ws == got and bad["isError"] and "calendar" in bad["content"][0]["text"]


async def test_metrics_move_across_a_run(tmp_path: Path, nursery: trio.Nursery) -> None:
    env = await fake_daemon(tmp_path, nursery)

    async def scrape() -> dict:
        async with httpx.AsyncClient(base_url=env.url) as c:
            text = (await c.get("/metrics")).text
        return {(s.name, frozenset(s.labels.items())): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    before = await scrape()
    run = await run_to_end(env, SCRIPT)
    after = await scrape()
    recs = [json.loads(p.read_text()) for p in (env.services.store.dir(run) / "agents").glob("*/agent.json")]
    key = ("swarmbase_spend_usd_total", frozenset({"caller": "alice", "engine": "claude"}.items()))
    assert after[key] - before.get(key, 0) == pytest.approx(sum(r["costUsd"] for r in recs))
    ended = ("swarmbase_agents_ended_total", frozenset({"caller": "alice", "engine": "claude", "state": "done"}.items()))
    assert after[ended] - before.get(ended, 0) == 3
    status = ("swarmbase_runs_ended_total", frozenset({"caller": "alice", "status": "completed"}.items()))
    assert after[status] == 1


async def test_trace_of_a_real_run(tmp_path: Path, nursery: trio.Nursery) -> None:
    from swarmbase.daemon import serve_on_loopback
    rcv = OtlpReceiver()
    url = await nursery.start(serve_on_loopback, rcv)
    env = await fake_daemon(tmp_path, nursery, telemetry={"otlpEndpoint": url})
    run = await run_to_end(env, SCRIPT)
    tracer = next(o for o in env.services.supervisor.env.observers if type(o).__name__ == "TraceObserver")
    with trio.fail_after(30):
        assert await trio.to_thread.run_sync(tracer.force_flush)
    spans = rcv.spans()
    root = next(s for s in spans if s.name == "swarmbase.run")
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    assert attrs_of(root)["swarmbase.run_id"] == run.id and len(agents) == 4
    assert all(s.parent_span_id == root.span_id and s.trace_id == root.trace_id for s in agents)
    assert sum(attrs_of(s)["swarmbase.cost_usd"] for s in agents) == pytest.approx(run.spent_usd)
    assert [e.name for e in root.events] == ["phase", "phase"]


def finished_records(run_dir: Path) -> int:
    n = 0
    for p in run_dir.glob("agents/*/agent.json"):
        try:
            n += json.loads(p.read_text()).get("state") == "done"
        except ValueError:          # being replaced right now
            pass
    return n


@pytest.mark.timeout(180)
async def test_kill_9_mid_run_is_sealed_on_boot(tmp_path: Path) -> None:
    state, path, tokens, hold, script = held_fan_out(tmp_path, agents=6, quick=3)
    with trio.fail_after(150):
        proc, ws = await start_cli_daemon(path)
        try:
            async with connect(ws, tokens["alice"]) as h:
                await h.handshake()
                run_id = (await h.tool("run", {"script": script, "args": {"hold": str(hold)}}))["structuredContent"]["runId"]
            run_dir = next((state / "runs").glob(f"*-{run_id}"))
            # The quick agents' final records are written by the batched flush, after their
            # journal lines: wait for the records, or a kill in between counts them unfinished.
            while len(spawns(tmp_path)) < 6 or finished_records(run_dir) < 3:
                await trio.sleep(0.05)
            proc.kill()
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
        hold.unlink()
        assert audit(state, run_id)[0] == 0                 # open: no end record yet, nothing broken
        proc, ws = await start_cli_daemon(path)
        try:
            run_json = json.loads((run_dir / "run.json").read_text())
            assert run_json["status"] == "interrupted" and run_json["end"]["chains"]["journal.jsonl"]
            code, text = audit(state, run_id)
            assert code == 0 and "every chain is intact" in text, text
            # The agents that never ended were marked interrupted at boot, and sealed too.
            assert text.count("interrupted: the daemon stopped") == 3
            assert {f"agents/{n}/agent.json" for n in range(1, 7)} <= set(run_json["end"]["chains"])
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
