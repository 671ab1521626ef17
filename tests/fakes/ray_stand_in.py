"""A scripted stand-in for Ray (the cluster the Ray launcher talks to) and a launcher built
over it: shared by the Ray launcher's own tests and the launcher conformance check."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

from swarmbase import config
from swarmbase.launch.ray import RayLauncher
from swarmbase.launch.spec import LaunchSpec

KEY = "sk-ant-unit-canary-0123456789"


WORKER = {"NodeID": "ab" * 28, "Alive": True, "NodeManagerHostname": "host1",
          "Resources": {"swarmbase_agents": 4.0, "CPU": 2.0}, "Labels": {"swarmbase/cli": "claude",
                                                                          "swarmbase/name": "w1"}}
HEAD = {"NodeID": "cd" * 28, "Alive": True, "Resources": {"CPU": 1.0}, "Labels": {}}


class NodeDiedError(Exception):
    """Named like Ray's: the launcher reads Ray's errors by name (it never imports Ray here)."""


class TaskCancelledError(Exception):
    pass


class FakeGen:
    """A task's stream: items put in by the test; cancel ends it unless told to ignore a
    normal cancel (a task stuck outside Python)."""

    def __init__(self, ignore_cancel: bool = False) -> None:
        self.q: queue.Queue[Any] = queue.Queue()
        self.ignore_cancel = ignore_cancel
        self.cancels: list[bool] = []

    def __iter__(self) -> "FakeGen":
        return self

    def __next__(self) -> Any:
        item = self.q.get()
        if item is StopIteration:
            raise StopIteration
        return item

    def cancel(self, force: bool) -> None:
        self.cancels.append(force)
        if force or not self.ignore_cancel:
            self.q.put(TaskCancelledError("cancelled"))


class FakeRay:
    def __init__(self, gen: FakeGen, nodes: list[dict[str, Any]]) -> None:
        self.gen, self._nodes = gen, nodes
        self.submitted: list[tuple[dict[str, Any], tuple[Any, ...]]] = []

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, BaseException):
            raise ref
        return ref

    def cancel(self, gen: FakeGen, force: bool = False) -> None:
        gen.cancel(force)

    def available_resources(self) -> dict[str, float]:
        return {"swarmbase_agents": 3.0}

    # ray.remote(fn).options(**opts).remote(*args)
    def options(self, **opts: Any) -> "FakeRay":
        self._opts = opts
        return self

    def remote(self, *args: Any) -> Any:
        self.submitted.append((self._opts, args))
        if self._opts.get("name") == "swarmbase-forget":        # state.forget's answer
            return {"killed": 1, "record": True}
        return self.gen

    def forgotten(self) -> list[tuple[str, tuple[Any, ...]]]:
        """(the node it was pinned to, its arguments) of each clean-up task sent."""
        return [(o["scheduling_strategy"].node_id, a) for o, a in self.submitted if o.get("name") == "swarmbase-forget"]


def make_launcher(tmp_path: Path, gen: FakeGen, nodes: list[dict[str, Any]] | None = None,
                  **ray_cfg: Any) -> tuple[RayLauncher, FakeRay]:
    token = tmp_path / "token"
    token.write_text("t" * 32)
    token.chmod(0o600)
    (tmp_path / "shared").mkdir(exist_ok=True)
    raw = {"sandbox": "none", "placement": {"ray": {"address": "127.0.0.1:6379", "tokenFile": str(token),
                                                    "labels": {"swarmbase/cli": "claude"},
                                                    "sharedRoots": [str(tmp_path / "shared")], **ray_cfg}}}
    cfg = config.parse(json.dumps(raw), tmp_path / "config.json")
    launcher = RayLauncher(cfg)
    fake = FakeRay(gen, [HEAD, WORKER] if nodes is None else nodes)
    launcher._ray = launcher._agent_fn = launcher._forget_fn = fake
    launcher.nodes_at = 0.0
    return launcher, fake


def spec(tmp_path: Path, cwd: Path | None = None, idle: float = 300.0, key: str = "run_abc-1") -> LaunchSpec:
    cwd = cwd or tmp_path / "shared"
    return LaunchSpec(argv=("/usr/bin/claude", "-p", "--tools=Read"), env={"ANTHROPIC_API_KEY": KEY, "HOME": "@AGENT_DIR@/home"},
                      cwd=str(cwd), key=key, files={"prompt.txt": b"hello"}, stdin_file="prompt.txt",
                      read=(str(cwd),), idle_timeout=idle)


STARTED = {"kind": "started", "node": WORKER["NodeID"], "name": "w1", "pgid": 4242, "sandbox": "bwrap"}
