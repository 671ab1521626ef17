"""Pure logic about a Ray cluster's nodes (from `ray.nodes()`): which nodes can take an
agent, why none can, where a path must be to be seen by them, and how a Ray failure reads
to a person. No Ray import: the daemon loads Ray only when placement uses it."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

NAME_LABEL = "swarmbase/name"


class PlacementError(Exception):
    """Ray placement cannot be used right now; the message says why."""


def node_name(node: Mapping[str, Any]) -> str:
    labels = node.get("Labels") or {}
    return str(labels.get(NAME_LABEL) or node.get("NodeManagerHostname") or node.get("NodeName") or "?")


def eligible(node: Mapping[str, Any], resource: str, labels: Mapping[str, str]) -> bool:
    """Could this node ever run an agent: it has a slot of `resource` and every label."""
    have = node.get("Labels") or {}
    return ((node.get("Resources") or {}).get(resource, 0) >= 1
            and all(have.get(k) == v for k, v in labels.items()))


def infeasible(nodes: Sequence[Mapping[str, Any]], resource: str, labels: Mapping[str, str]) -> str | None:
    """Why no alive node could ever take an agent (None: some node can, maybe later)."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(eligible(n, resource, labels) for n in alive):
        return None
    want = f"resource {resource!r}" + (f" and labels {dict(labels)}" if labels else "")
    with_resource = [n for n in alive if (n.get("Resources") or {}).get(resource, 0) >= 1]
    if with_resource:
        return (f"no alive node of the Ray cluster can take this agent: it needs {want}; "
                f"{len(with_resource)} node(s) have the resource but not the labels")
    return f"no alive node of the Ray cluster can take this agent: it needs {want} ({len(alive)} node(s) alive)"


def under(path: str, roots: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def is_run_work_dir(path: str, runs_root: str) -> bool:
    """Whether `path` is (inside) a run's private work dir: <state>/runs/<run dir>/work."""
    real = os.path.realpath(path)
    rel = os.path.relpath(real, os.path.realpath(runs_root))
    parts = rel.split(os.sep)
    return len(parts) >= 2 and parts[0] not in ("..", ".") and parts[1] == "work"


def describe_failure(exc: BaseException, node: str | None) -> str:
    """A Ray error on an agent's stream, for the agent's record."""
    kind = type(exc).__name__
    on = f" ({node})" if node else ""
    if kind == "NodeDiedError":
        return f"node lost: the Ray node running the agent died{on}"
    if kind in ("WorkerCrashedError", "LocalRayletDiedError"):
        return f"node lost: the Ray worker running the agent died{on}"
    if kind in ("OwnerDiedError", "ObjectLostError", "ObjectFetchTimedOutError", "ObjectReconstructionFailedError"):
        return f"node lost: the agent's output could not be fetched from its node{on}"
    if kind == "RayTaskError":
        cause = getattr(exc, "cause", None)
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc).strip().splitlines()[-1:]
        return f"the agent's task failed on its node{on}: {str(detail)[:300]}"
    return f"Ray: {kind}: {str(exc).strip()[:300]}"
