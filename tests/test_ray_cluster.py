"""Agents placed on a real Ray cluster: a head (no agent slots) and one worker node (the
`swarmbase_agents` resource, token auth on), the daemon as a real process, the fake API
and the real claude CLI — all inside one network namespace holding only `lo`, since Ray
binds every interface otherwise.

Rules: the cluster is shared by the module and stopped by pid (never `ray stop`, which
kills every Ray on the machine by name); the tests run in file order and the last one
kills the worker node. Waits are bounded with fail_after; nothing asserts a duration.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import trio

from .fakes.anthropic_api import FakeAnthropic
from .ray_daemon import (KEY, Daemon, ended, marked_processes, mcpl, rows, serve_api, start_run, wait_status,
                         write_config)
from .raycluster import RayCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[RayCluster]:
    if not (Path(__file__).parent / ".tools" / "node_modules" / ".bin" / "claude").exists():
        pytest.fail("the Claude Code CLI is not installed: run bash tests/install.sh")
    c = RayCluster(root=tmp_path_factory.mktemp("ray")).start()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def daemon_state(cluster: RayCluster) -> Iterator[Daemon]:
    d = Daemon(cluster, write_config(cluster.root / "d1", cluster)).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def daemon(daemon_state: Daemon) -> Daemon:
    """The module's daemon, started again if a test killed it."""
    if not daemon_state.alive:
        daemon_state.start()
    return daemon_state


@pytest.fixture
async def api(cluster: RayCluster, nursery: trio.Nursery) -> FakeAnthropic:
    fake = FakeAnthropic()
    await nursery.start(serve_api, cluster, fake.app())
    return fake


THREE = """
const prompts = ['[[usage:1000,200]] one', '[[usage:2000,100]] two', '[[text:three]]'];
const out = await parallel(prompts.map(p => () => agent(p, {placement: PLACEMENT, detail: true})));
return out.map(r => ({ok: r.ok, text: r.text, cost: r.costUsd, tokens: r.tokens, estimated: r.estimated}));
"""


async def test_three_agents_placed_on_the_worker_settle_as_locally(
        cluster: RayCluster, daemon: Daemon, api: FakeAnthropic) -> None:
    async with mcpl(cluster, daemon.token) as host:
        ray_run = await start_run(host, THREE.replace("PLACEMENT", "'ray'"))
        local_run = await start_run(host, THREE.replace("PLACEMENT", "'local'"))
        st = await wait_status(host, ray_run, ended, timeout=120)
        local = await wait_status(host, local_run, ended, timeout=120)
        assert st["status"] == "completed", st
        assert local["status"] == "completed", local
        res = json.loads((await host.tool("result", {"runId": ray_run}))["structuredContent"]["text"])
        res_local = json.loads((await host.tool("result", {"runId": local_run}))["structuredContent"]["text"])
    assert [r["ok"] for r in res] == [True, True, True], print(json.dumps(rows(st), indent=1), daemon.stderr.decode()[-3000:])
    assert res[2]["text"] == "three"
    assert res == res_local                      # same results, same costs and tokens as local agents
    assert res[0]["cost"] > 0 and res[1]["cost"] > 0
    assert st["spentUsd"] == local["spentUsd"]
    worker_id = next(n for n in cluster_nodes(cluster) if n["Labels"].get("swarmbase/name") == "w1")["NodeID"]
    for row in rows(st):
        assert row["node"] == f"w1 ({worker_id})"          # status names the node
        assert daemon.agent(ray_run, row["n"])["node"] == row["node"]    # and so does the record
        history = [h["state"] for h in daemon.agent(ray_run, row["n"])["history"]]
        assert history[-3:] == ["waiting-node", "running", "done"], history
    for row in rows(local):
        assert row["node"] is None
    # The caller's key went to the node inside the task's arguments only.
    logs = "".join(p.read_text(errors="replace") for p in cluster.session_logs())
    assert KEY not in logs and KEY not in daemon.stderr.decode(errors="replace")


def cluster_nodes(cluster: RayCluster) -> list[dict[str, Any]]:
    import subprocess
    import sys
    probe = ("import json, ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
             "print(json.dumps(ray.nodes()))")
    out = subprocess.run(cluster.ns.argv([sys.executable, "-c", probe, cluster.address]), env=cluster.env(),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
