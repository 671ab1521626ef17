"""The dashboard's nodes page (dashboard/nodes.py), over HTTP against the real app: what it
shows of a Ray cluster, and that it says so when Ray placement is not configured. The
page against a live cluster is in test_ray_cluster.py."""

from __future__ import annotations

from typing import Any

import httpx

from .conftest import Env

NODE_ID = "ab" * 28


class StubRay:
    def view(self) -> dict[str, Any]:
        check = {"cli": {"path": "/usr/bin/claude", "ok": True, "detail": "found"},
                 "roots": [{"path": "/mnt/swarm", "ok": False, "detail": "not the same filesystem as the daemon's"}],
                 "sandbox": "none (bubblewrap is not installed)", "swarmbase": "0.1.0",
                 "reaped": {"killed": 2}, "checkedAt": 1.0}
        return {"address": "10.0.0.5:6379", "resource": "swarmbase_agents", "labels": {"swarmbase/cli": "claude"},
                "connected": True, "error": None, "refreshedAt": 1.0, "owner": "o", "boot": "b", "free": 3.0,
                "nodes": [{"id": NODE_ID, "name": "gpu-box-<1>", "alive": True, "eligible": True, "labels": {},
                           "slots": 4.0, "free": 3.0, "check": check,
                           "running": [{"key": "run_abc123-2", "nodeId": NODE_ID, "node": "gpu-box", "pgid": 7}]},
                          {"id": "cd" * 28, "name": "head", "alive": True, "eligible": False, "labels": {},
                           "slots": 0, "free": None, "check": None, "running": []}]}


async def test_the_nodes_page_without_ray(running: Env) -> None:
    async with httpx.AsyncClient(base_url=running.url) as c:
        page = await c.get("/nodes")
        data = (await c.get("/nodes.json")).json()
    assert page.status_code == 200 and "Ray placement is not configured" in page.text
    assert data == {"configured": False}


async def test_the_nodes_page_shows_nodes_checks_and_running_agents(running: Env) -> None:
    running.services.ray = StubRay()
    async with httpx.AsyncClient(base_url=running.url) as c:
        page = (await c.get("/nodes")).text
        data = (await c.get("/nodes.json")).json()
        refused = await c.get("/nodes", headers={"Host": "evil.example"})
    assert "gpu-box-&lt;1&gt;" in page and "<1>" not in page            # escaped
    assert "takes agents" in page and "no agent slots" in page and '<td class="slots">3 / 4</td>' in page
    assert "free agent slots in the cluster: <b id=\"free-slots\">3</b>" in page
    assert "not the same filesystem as the daemon&#39;s" in page and "none (bubblewrap is not installed)" in page
    assert "reaped 2 leftover process(es)" in page
    assert '<a href="/runs/run_abc123/agents/2">run_abc123 #2</a>' in page
    assert data["nodes"][0]["running"][0]["runId"] == "run_abc123"
    assert refused.status_code == 403                                       # the app's Host check applies
