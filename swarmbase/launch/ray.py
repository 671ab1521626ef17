"""The Ray launcher: each agent is one Ray streaming task on a cluster node, its raw lines
streamed back, while the daemon stays the one orchestrator (idle watchdog, transcript,
verdict, costs, budgets, journal all stay here, above the launch seam).

Design log (the prototype's figures and pitfalls: shared/notes/ray.md):
- Task per agent, not an actor per node: Ray then does placement and queueing (a custom
  resource, one unit per agent, plus a label selector), and a force cancel exists.
  `max_retries=0`: an agent is not idempotent. `num_cpus=0`: the resource is the slot.
- Ray is imported only here, lazily, from a thread (`ray.init` on the main thread would
  replace the daemon's SIGTERM handler); a daemon that never places on Ray never loads it.
- An agent is `waiting-node` until the node reports the CLI started. Ray never fails a
  task no node can take (it stays pending), so the daemon checks `ray.nodes()` first and
  fails such an agent at once, and cancels one still unplaced after startTimeoutMs (which
  also covers a node whose worker cannot get a port).
- The CLI on the node runs under a guardian (node/guardian.py): Ray kills only a dead
  worker's direct children, and the CLI's own session would otherwise survive.
- Records on each node are keyed by this daemon (`owner`, from its state dir) and its life
  (`boot`); at boot and when a node joins, a task pinned to each agent node reaps what
  earlier lives left and probes the node (CLI binary, shared roots, bubblewrap).
- A force-cancelled agent (its task ignored the ordinary cancel) is followed by a task
  pinned to its node that kills what is left of it and removes its record at once: the
  killed worker's `finally` may not have run, and the next boot is no time to clean up.
- The caller's API key is in the task's arguments only, for the key door the node runs
  beside the agent (node/door.py; the CLI gets that door's bearer and URL), never in the
  CLI's env, argv, a runtime_env (Ray keeps and shows those) or a log line.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import trio

from ..config import Config
from ..identity import SandboxUser
from ..node import confine, workspace
from ..node.agent import PAYLOAD_VERSION
from . import ray_nodes
from .local import REAP_AFTER_FINAL_S
from .ray_stream import Ended, TaskStream
from .ray_nodes import PlacementError
from .ray_watch import NODES_TIMEOUT_S, NodeWatcher
from .spec import AGENT_DIR, LauncherBase, LaunchSpec, OnLine, ProcResult, Started

log = logging.getLogger("swarmbase.launch.ray")

NODES_FRESH_S = 1.0        # a node list this recent is trusted for the feasibility check
RETRY_CONNECT_S = 10.0
GCS_PATIENCE_S = 10 * 365 * 86_400
FORGET_TIMEOUT_S = 30.0   # the clean-up task after a force cancel (a node may first start a worker)
WORKSPACE_RETURN_S = 30.0  # after the final event, how long a shipped workspace may take to come back


def daemon_owner(state_dir: Path) -> str:
    """A stable id for this daemon (its state dir), kept in the state dir."""
    path = state_dir / "ray-owner"
    try:
        value = path.read_text().strip()
        if value:
            return value
    except OSError:
        pass
    value = secrets.token_hex(8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    return value


class RayLauncher(NodeWatcher, LauncherBase):
    initial_state = "waiting-node"      # until the node says the CLI started

    def __init__(self, cfg: Config, user_for: Callable[[str | None], SandboxUser | None] = lambda owner: None) -> None:
        """`user_for`: who a caller's children run as (the local launcher's: one allocation
        for both placements, so a caller has the same uid on every machine)."""
        assert cfg.placement.ray is not None
        self.cfg = cfg
        self.user_for = user_for
        self.rc = cfg.placement.ray
        self.owner = daemon_owner(cfg.state_dir)
        self.boot = time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(4)
        self.limiter = trio.CapacityLimiter(cfg.maxConcurrentAgents * 2 + 8)
        self.runs_root = str(cfg.state_dir / "runs")
        self._ray: Any = None
        self._agent_fn: Any = None
        self._check_fn: Any = None
        self._forget_fn: Any = None
        self._connect_lock = trio.Lock()
        self._nodes_call: tuple[trio.Event, dict[str, Any]] | None = None
        self.error: str | None = None
        self._error_at = 0.0
        self.nodes: list[dict[str, Any]] = []
        self.nodes_at = 0.0
        self.checks: dict[str, dict[str, Any]] = {}      # node id -> probe result (or error)
        self.free: dict[str, float] = {}                 # free agent slots: "cluster" and per node id
        self.running: dict[str, dict[str, Any]] = {}     # agent key -> where it runs
        self.spawned = 0

    # -- connecting ---------------------------------------------------------------------
    def _init(self) -> Any:
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.rc.tokenFile))
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # A Ray driver exits the whole process once the head's GCS has been unreachable
        # for this long (60 s by default): the daemon must outlive its cluster's head.
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(GCS_PATIENCE_S))
        import ray

        from ..node.agent import run_agent
        from ..node.probe import check_node
        from ..node.state import forget
        ray.init(address=self.rc.address, namespace="swarmbase", log_to_driver=False,
                 logging_level=logging.WARNING, ignore_reinit_error=True)
        self._agent_fn = ray.remote(run_agent)
        self._check_fn = ray.remote(check_node)
        self._forget_fn = ray.remote(forget)
        return ray

    async def connect(self) -> Any:
        async with self._connect_lock:
            if self._ray is not None:
                return self._ray
            if self.error and time.monotonic() - self._error_at < RETRY_CONNECT_S:
                raise PlacementError(self.error)
            try:
                self._ray = await trio.to_thread.run_sync(self._init)
            except Exception as e:  # unreachable, wrong token, version mismatch: said on every ray agent
                self.error = f"cannot connect to the Ray cluster at {self.rc.address}: {type(e).__name__}: {e}"[:500]
                self._error_at = time.monotonic()
                log.error("%s", self.error)
                raise PlacementError(self.error) from None
            self.error = None
            log.info("connected to the Ray cluster at %s (owner %s, boot %s)", self.rc.address, self.owner, self.boot)
            return self._ray

    async def refresh_nodes(self) -> list[dict[str, Any]]:
        """ray.nodes(), bounded: with the head gone it blocks until the head returns. One
        call at a time is in flight, whoever waits for it."""
        ray = await self.connect()
        if self._nodes_call is None:
            call: tuple[trio.Event, dict[str, Any]] = (trio.Event(), {})
            self._nodes_call = call

            async def ask() -> None:
                try:
                    call[1]["value"] = await trio.to_thread.run_sync(ray.nodes, abandon_on_cancel=True)
                except Exception as e:  # handed to the waiters
                    call[1]["error"] = e
                finally:
                    call[0].set()
            trio.lowlevel.spawn_system_task(ask)
        done, box = self._nodes_call
        with trio.move_on_after(NODES_TIMEOUT_S):
            await done.wait()
        if not done.is_set():
            self.error = f"the Ray cluster's head at {self.rc.address} does not answer (its GCS is down or unreachable)"
            raise PlacementError(self.error)
        self._nodes_call = None
        if "error" in box:
            self.error = f"Ray: {type(box['error']).__name__}: {box['error']}"[:500]
            raise PlacementError(self.error)
        self.error = None
        self.nodes, self.nodes_at = box["value"], time.time()
        return self.nodes

    # -- one agent ------------------------------------------------------------------------
    async def _where_to(self, spec: LaunchSpec) -> tuple[bytes | None, bool]:
        """(the shipped workspace or None, whether edits come back); PlacementError if the
        cwd cannot be reached from a node."""
        if ray_nodes.under(spec.cwd, self.rc.sharedRoots):
            return None, False
        if not ray_nodes.is_run_work_dir(spec.cwd, self.runs_root):
            raise PlacementError(f"placement ray: the agent's cwd {spec.cwd} is not under placement.ray.sharedRoots "
                                 "(a filesystem every node mounts at the same path)")
        try:
            data = await trio.to_thread.run_sync(workspace.pack, Path(spec.cwd))
        except workspace.WorkspaceTooLarge as e:
            raise PlacementError(f"placement ray: the run's work dir is too large to ship to a node ({e}); "
                                 "put it on a shared root (placement.ray.sharedRoots)") from None
        return data, spec.cwd in spec.write

    async def _feasible(self) -> None:
        """Fail at once what no alive node could ever take: Ray would keep it pending forever."""
        nodes = self.nodes if time.time() - self.nodes_at < NODES_FRESH_S else await self.refresh_nodes()
        why = ray_nodes.infeasible(nodes, self.rc.resource, self.rc.labels)
        if why is not None:
            raise PlacementError(why)

    def _payload(self, spec: LaunchSpec, return_workspace: bool) -> dict[str, Any]:
        return {"v": PAYLOAD_VERSION, "owner": self.owner, "boot": self.boot, "key": spec.key, "argv": list(spec.argv),
                "env": dict(spec.env), "cwd": spec.cwd, "files": dict(spec.files), "dirs": list(spec.dirs),
                "stdin_file": spec.stdin_file, "read": list(spec.read), "write": list(spec.write),
                "network": spec.network, "rlimits": spec.limits.rlimits(), "sandbox": self.cfg.sandbox_mode,
                "placeholder": AGENT_DIR, "return_workspace": return_workspace,
                # What the node's sandbox needs from here (node/confine.py): the caller's uid,
                # where its door may lead, and the seccomp profile.
                "user": confine.payload_user(self.user_for(spec.owner)),
                "egress": confine.payload_egress(spec.egress), "nesting": spec.nesting,
                "keyDoor": confine.payload_model_key(spec.model_key),
                # What the node checks its paths against right before the start (launch/pins.py).
                "cwd_roots": list(spec.cwd_roots), "caller_paths": list(spec.caller_paths),
                "forbidden": [str(self.cfg.state_dir), str(self.cfg.homes_dir)]}

    def _submit(self, payload: dict[str, Any], shipped: bytes | None) -> Any:
        opts: dict[str, Any] = {"num_returns": "streaming", "max_retries": 0, "num_cpus": 0,
                                "resources": {self.rc.resource: 1}, "name": f"swarmbase-agent-{payload['key']}"}
        if self.rc.labels:
            opts["label_selector"] = dict(self.rc.labels)
        return self._agent_fn.options(**opts).remote(payload, shipped)

    async def run(self, spec: LaunchSpec, on_line: OnLine, started: Started | None = None) -> ProcResult:
        res = ProcResult()
        try:
            ray = await self.connect()
            shipped, returns = await self._where_to(spec)
            await self._feasible()
            with trio.CancelScope(shield=True):   # once submitted, the task is always stopped below
                gen = await trio.to_thread.run_sync(self._submit, self._payload(spec, returns), shipped)
        except PlacementError as e:
            res.error = str(e)
            return res
        stream = TaskStream(ray, gen, self.limiter)
        ending = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.reader)
                try:
                    ending = await self._consume(spec, stream, on_line, started, res)
                finally:
                    with trio.CancelScope(shield=True):
                        await stream.stop(ended_normally=ending)
                        node_id = (self.running.get(spec.key) or {}).get("nodeId")
                        if stream.forced and node_id:
                            await self._forget(node_id, spec.key)
        finally:
            self.running.pop(spec.key, None)
        return res

    async def _forget(self, node_id: str, key: str) -> None:
        """After a force cancel: a task on the agent's node kills what is left of it and
        removes its record (bounded; failing that, the next boot's reaper does it)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        def call() -> Any:
            ref = self._forget_fn.options(
                num_cpus=0, max_retries=0, name="swarmbase-forget",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(self.owner, self.boot, key)
            return self._ray.get(ref, timeout=FORGET_TIMEOUT_S)

        try:
            with trio.move_on_after(FORGET_TIMEOUT_S + 1):
                got = await trio.to_thread.run_sync(call, limiter=self.limiter, abandon_on_cancel=True)
                log.info("agent %s: force-cancelled; its node killed %s leftover processes", key, got.get("killed"))
                return
            log.warning("agent %s: its node did not answer the clean-up after a force cancel; "
                        "the next boot's reaper removes what is left", key)
        except Exception as e:  # the node is gone (then so is the agent) or Ray is: the reaper remains
            log.warning("agent %s: clean-up after a force cancel failed: %s", key, ray_nodes.describe_failure(e, None))

    async def _consume(self, spec: LaunchSpec, stream: TaskStream, on_line: OnLine, started: Started | None,
                       res: ProcResult) -> bool:
        """Read the task's items into `res`; True when the task is ending by itself (the
        node reported the CLI's exit, or Ray ended the stream)."""
        first: Any = None
        with trio.move_on_after(self.rc.startTimeoutMs / 1000):
            first = await stream.items.receive()
        if first is None:
            res.error = (f"no node of the Ray cluster took the agent within {self.rc.startTimeoutMs} ms "
                         "(placement.ray.startTimeoutMs): every agent slot stayed busy, or a node could not "
                         "start a worker")
            return False
        return await self._after_start(spec, stream, first, on_line, started, res)

    async def _after_start(self, spec: LaunchSpec, stream: TaskStream, first: Any, on_line: OnLine,
                           started: Started | None, res: ProcResult) -> bool:
        if isinstance(first, Ended):
            res.error = ray_nodes.describe_failure(first.error, None) if first.error else "the agent's task ended at once"
            return True
        if first.get("kind") == "spawn-error":
            res.spawn_error = first.get("detail", "?")
            return True
        node = f"{first.get('name')} ({first.get('node')})"
        res.node = node
        self.spawned += 1
        self.running[spec.key] = {"nodeId": first.get("node"), "node": node, "pgid": first.get("pgid"),
                                  "startedAt": time.time(), "sandbox": first.get("sandbox")}
        if started:
            started({"node": node, "pgid": first.get("pgid"), "placement": "ray"})
        return await self._pump(spec, stream, on_line, res, node)

    async def _pump(self, spec: LaunchSpec, stream: TaskStream, on_line: OnLine, res: ProcResult, node: str) -> bool:
        """Lines into on_line under the idle watchdog, until the exit item, the idle
        timeout, or a short while after the final event."""
        last = trio.current_time()
        final_deadline = None
        while True:
            deadline = last + spec.idle_timeout if final_deadline is None else final_deadline
            with trio.move_on_at(deadline) as waited:
                item = await stream.items.receive()
            if waited.cancelled_caught:
                res.idle_timeout = final_deadline is None
                return False
            if isinstance(item, Ended):
                if item.error is not None and not res.final_seen:
                    res.error = ray_nodes.describe_failure(item.error, node)
                return True
            if isinstance(item, dict) and item.get("kind") == "exit":
                res.exit_code = item.get("code")
                await self._bring_back(spec, item, res)
                return True
            if final_deadline is not None or not isinstance(item, list):
                continue
            last = trio.current_time()
            for line in item:
                res.lines += 1
                if on_line(line):
                    res.final_seen = True
                    grace = WORKSPACE_RETURN_S if spec.cwd in spec.write else REAP_AFTER_FINAL_S
                    final_deadline = trio.current_time() + grace
                    break

    async def _bring_back(self, spec: LaunchSpec, end: dict[str, Any], res: ProcResult) -> None:
        if end.get("workspaceError"):
            log.warning("agent %s: its edits could not come back from the node: %s", spec.key, end["workspaceError"])
        if end.get("workspace") is not None:
            await trio.to_thread.run_sync(workspace.apply, Path(spec.cwd), end["workspace"], end.get("deleted") or [])
