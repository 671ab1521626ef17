"""The Ray launcher's node watcher (a part of RayLauncher, kept apart for size): every
WATCH_S the node list is refreshed, with the free agent slots; each agent node not yet
seen this boot gets one task pinned to it that reaps what this daemon's earlier lives left
there and probes it (CLI binary, shared roots, sandbox). `view()` is what the dashboard's
nodes page shows: the watcher's last look, never a Ray call in a request."""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Any, Callable

import trio

from ..identity import SandboxUser
from ..node import confine, probe
from . import ray_nodes
from .ray_nodes import PlacementError

log = logging.getLogger("swarmbase.launch.ray")

WATCH_S = 5.0              # how often the node list is refreshed (new nodes get checked)
CHECK_TIMEOUT_S = 60.0
NODES_TIMEOUT_S = 10.0     # ray.nodes() that long without an answer: the head is gone


class NodeWatcher:
    """Mixed into RayLauncher, whose state (cfg, rc, owner, boot, nodes, checks, free,
    running, limiter) it reads and fills."""
    cfg: Any
    rc: Any
    owner: str
    boot: str
    nodes: list[dict[str, Any]]
    nodes_at: float
    checks: dict[str, dict[str, Any]]
    free: dict[str, float]
    running: dict[str, dict[str, Any]]
    limiter: trio.CapacityLimiter
    error: str | None
    _ray: Any
    _check_fn: Any
    user_for: Callable[[str | None], SandboxUser | None]

    async def refresh_nodes(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _eligible(self, node: dict[str, Any]) -> bool:
        return ray_nodes.eligible(node, self.rc.resource, self.rc.labels)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then every WATCH_S refresh the node list; each agent node not yet
        checked this boot gets the reaper and the probe."""
        nonces = self._write_probe_files()
        task_status.started()
        try:
            while True:
                try:
                    nodes = await self.refresh_nodes()
                    with trio.move_on_after(NODES_TIMEOUT_S):
                        self.free = await trio.to_thread.run_sync(self._free_slots, abandon_on_cancel=True)
                    async with trio.open_nursery() as n:
                        for node in nodes:
                            if node.get("Alive") and self._eligible(node) and node["NodeID"] not in self.checks:
                                n.start_soon(self._check, node, nonces)
                except PlacementError:
                    pass
                await trio.sleep(WATCH_S)
        finally:
            for root, name, _ in nonces:
                try:
                    os.unlink(os.path.join(root, name))
                except OSError:
                    pass

    def _write_probe_files(self) -> list[tuple[str, str, str]]:
        out = []
        for root in self.rc.sharedRoots:
            name, nonce = f".swarmbase-probe-{self.owner}-{self.boot}", secrets.token_hex(16)
            try:
                fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                with os.fdopen(fd, "w") as f:
                    f.write(nonce)
            except OSError as e:
                log.error("placement.ray.sharedRoots: cannot write a probe file in %s: %s", root, e.strerror)
            out.append((root, name, nonce))
        return out

    async def _check(self, node: dict[str, Any], nonces: list[tuple[str, str, str]]) -> None:
        ray, node_id = self._ray, node["NodeID"]
        self.checks[node_id] = {"pending": True}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        cli = self.cfg.engines.claude.bin if self.cfg.engines.claude else ""

        def call() -> Any:
            ref = self._check_fn.options(
                num_cpus=0, max_retries=0, name="swarmbase-node-check",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
                    self.owner, self.boot, cli, nonces, self.cfg.sandbox_mode,
                    confine.payload_user(self.user_for(None)))
            return ray.get(ref, timeout=CHECK_TIMEOUT_S)

        try:
            result = await trio.to_thread.run_sync(call, limiter=self.limiter, abandon_on_cancel=True)
        except Exception as e:
            result = {"error": ray_nodes.describe_failure(e, ray_nodes.node_name(node))}
            log.warning("node %s: check failed: %s", node_id, result["error"])
        else:
            if str(result.get("sandbox", "")).startswith(probe.REFUSES):
                log.warning("node %s %s", ray_nodes.node_name(node), result["sandbox"])
            reaped = result.get("reaped") or {}
            if reaped.get("killed"):
                log.warning("node %s: reaped %d leftover agent processes of an earlier daemon life",
                            ray_nodes.node_name(node), reaped["killed"])
        result["checkedAt"] = time.time()
        self.checks[node_id] = result

    def view(self) -> dict[str, Any]:
        """For the dashboard's nodes page (no Ray call: what the watcher last saw)."""
        rows = []
        for node in self.nodes:
            nid = node.get("NodeID", "")
            rows.append({"id": nid, "name": ray_nodes.node_name(node), "alive": bool(node.get("Alive")),
                         "eligible": self._eligible(node), "labels": node.get("Labels") or {},
                         "slots": (node.get("Resources") or {}).get(self.rc.resource, 0),
                         "free": self.free.get(nid), "check": self.checks.get(nid),
                         "running": [dict(a, key=k) for k, a in self.running.items() if a.get("nodeId") == nid]})
        return {"address": self.rc.address, "resource": self.rc.resource, "labels": dict(self.rc.labels),
                "connected": self._ray is not None, "error": self.error, "refreshedAt": self.nodes_at,
                "owner": self.owner, "boot": self.boot, "nodes": rows, "free": self.free.get("cluster")}

    def _free_slots(self) -> dict[str, float]:
        """Free agent slots, in the cluster ("cluster") and per node id (a private Ray
        helper: without it, the cluster's figure only)."""
        ray = self._ray
        out = {"cluster": float(ray.available_resources().get(self.rc.resource, 0))}
        try:
            from ray._private.state import available_resources_per_node
            for nid, res in available_resources_per_node().items():
                out[nid] = float(res.get(self.rc.resource, 0))
        except Exception:  # private API moved: the per-node column stays empty
            pass
        return out

