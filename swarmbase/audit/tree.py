"""The audit walk: a run, the runs it resumed, and its nested workflows, as one tree of
workflows and agents with totals per depth, each run's chains verified.

Nested workflows are read in both shapes the core may write: inside the run (agent records
carry `workflow`: "3", "3/1", …) or as run dirs of their own whose run.json carries
`nestedIn: {runId, workflow}`. Depth is the number of workflow() calls between an agent
and the root script: the root's agents are depth 0.
"""

from __future__ import annotations

from typing import Any

import attrs

from ..jsonvalue import object_at
from .rundirs import RunIndex, agent_records, read_json
from .verify import RunVerdict, verify_run


@attrs.define
class AgentNode:
    n: int
    label: str
    engine: str
    model: str | None
    profile: str | None
    cwd: str | None              # None: the run's own work dir
    tokens: int
    token_detail: dict[str, int]
    cost_usd: float
    estimated: bool
    priced: bool
    duration_s: float | None
    state: str
    error: str | None
    replayed: bool
    workflow: str
    depth: int

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "label": self.label, "engine": self.engine, "model": self.model,
                "profile": self.profile, "cwd": self.cwd, "tokens": self.tokens, "tokenDetail": self.token_detail,
                "costUsd": self.cost_usd, "estimated": self.estimated, "priced": self.priced,
                "durationS": self.duration_s, "state": self.state, "error": self.error,
                "replayed": self.replayed, "workflow": self.workflow, "depth": self.depth}


@attrs.define
class WorkflowNode:
    path: str                    # "" is the root script
    depth: int
    agents: list[AgentNode] = attrs.Factory(list)
    children: list["WorkflowNode"] = attrs.Factory(list)

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.path, "depth": self.depth, "agents": [a.to_json() for a in self.agents],
                "children": [c.to_json() for c in self.children]}


@attrs.define
class RunNode:
    run_id: str
    dir: str
    facts: dict[str, Any]
    relation: str                # "audited", "resumed" (an older run it resumed), "nested"
    root: WorkflowNode
    verdict: RunVerdict
    nested: list["RunNode"] = attrs.Factory(list)

    def agents(self) -> list[AgentNode]:
        out: list[AgentNode] = []
        stack = [self.root]
        while stack:
            w = stack.pop()
            out.extend(w.agents)
            stack.extend(w.children)
        return sorted(out, key=lambda a: a.n)

    def to_json(self) -> dict[str, Any]:
        return {"runId": self.run_id, "dir": self.dir, "relation": self.relation, **self.facts,
                "verification": self.verdict.to_json(), "workflows": self.root.to_json(),
                "nested": [r.to_json() for r in self.nested]}


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def token_detail(rec: dict[str, Any]) -> dict[str, int]:
    """agent.json `tokens` is an object (input/output/cacheRead/cacheWrite/total) in full
    records and a plain total in rows; read either."""
    t = rec.get("tokens")
    if isinstance(t, dict):
        d = {k: _int(t.get(k)) for k in ("input", "output", "cacheRead", "cacheWrite")}
        d["total"] = _int(t.get("total")) or sum(d.values())
        return d
    return {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": _int(t)}


def depth_of(path: str) -> int:
    return len([p for p in path.split("/") if p]) if path else 0


def agent_node(run_dir: Any, n: int, rec: dict[str, Any], base_depth: int) -> AgentNode:
    cwd = rec.get("cwd")
    if not isinstance(cwd, str):        # records before the core wrote `cwd`: the resolved options
        opts = read_json(run_dir / "agents" / str(n) / "opts.json")
        resolved = opts.get("resolved") if isinstance(opts, dict) else None
        cwd = resolved.get("cwd") if isinstance(resolved, dict) else None
    found = rec.get("workflow")
    workflow = found if isinstance(found, str) else ""
    tokens = token_detail(rec)
    cost = rec.get("costUsd")
    return AgentNode(
        n=n, label=str(rec.get("label") or f"agent {n}"), engine=str(rec.get("engine") or "?"),
        model=rec.get("model"), profile=rec.get("profile"), cwd=cwd if isinstance(cwd, str) else None,
        tokens=tokens["total"], token_detail=tokens, cost_usd=float(cost) if isinstance(cost, (int, float)) else 0.0,
        estimated=bool(rec.get("estimated")), priced=rec.get("priced", True) is not False,
        duration_s=rec.get("durationS") if isinstance(rec.get("durationS"), (int, float)) else None,
        state=str(rec.get("state") or "?"), error=rec.get("error") if isinstance(rec.get("error"), str) else None,
        replayed=bool(rec.get("replayed")), workflow=workflow, depth=base_depth + depth_of(workflow))


def workflow_tree(agents: list[AgentNode], base_depth: int) -> WorkflowNode:
    root = WorkflowNode("", base_depth)
    nodes: dict[str, WorkflowNode] = {"": root}

    def node(path: str) -> WorkflowNode:
        if path not in nodes:
            parent = node(path.rsplit("/", 1)[0] if "/" in path else "")
            nodes[path] = WorkflowNode(path, base_depth + depth_of(path))
            parent.children.append(nodes[path])
        return nodes[path]

    for a in sorted(agents, key=lambda a: a.n):
        node(a.workflow).agents.append(a)
    return root


RUN_FACTS = ("label", "caller", "status", "createdAt", "endedAt", "spentUsd", "spentEstimated", "budgetUsd",
             "agentsTotal", "agentsDone", "error", "resumedFrom")


def run_node(idx: RunIndex, run_id: str, relation: str, base_depth: int = 0,
             seen: set[str] | None = None) -> RunNode:
    seen = seen if seen is not None else set()
    seen.add(run_id)
    d = idx.dirs[run_id]
    run = idx.runs[run_id]
    agents = [agent_node(d, n, rec, base_depth) for n, rec in agent_records(d)]
    meta = object_at(run, "meta")
    facts = {k: run.get(k) for k in RUN_FACTS}
    facts["label"] = run.get("label") or meta.get("name")
    node = RunNode(run_id, idx.rel(d), facts, relation, workflow_tree(agents, base_depth), verify_run(idx, run_id))
    for kid in idx.nested_children(run_id):
        if kid in seen:
            continue
        path = idx.runs[kid]["nestedIn"].get("workflow") or ""
        node.nested.append(run_node(idx, kid, "nested", base_depth + max(1, depth_of(str(path))), seen))
    return node


@attrs.define
class AuditTree:
    run_id: str
    runs: list[RunNode]          # oldest resumed run first, the audited run last

    def all_runs(self) -> list[RunNode]:
        out: list[RunNode] = []

        def walk(r: RunNode) -> None:
            out.append(r)
            for k in r.nested:
                walk(k)

        for r in self.runs:
            walk(r)
        return out

    def first_break(self) -> Any:
        return next((r.verdict.brk for r in self.all_runs() if r.verdict.brk is not None), None)

    def totals_by_depth(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for r in self.all_runs():
            for a in r.agents():
                t = out.setdefault(a.depth, {"agents": 0, "tokens": 0, "costUsd": 0.0, "durationS": 0.0})
                t["agents"] += 1
                t["tokens"] += a.tokens
                t["costUsd"] += a.cost_usd
                t["durationS"] += a.duration_s or 0.0
        for t in out.values():
            t["costUsd"] = round(t["costUsd"], 6)
            t["durationS"] = round(t["durationS"], 3)
        return dict(sorted(out.items()))

    def totals(self) -> dict[str, Any]:
        by = self.totals_by_depth().values()
        return {"agents": sum(t["agents"] for t in by), "tokens": sum(t["tokens"] for t in by),
                "costUsd": round(sum(t["costUsd"] for t in by), 6),
                "durationS": round(sum(t["durationS"] for t in by), 3)}


def build(idx: RunIndex, run_id: str) -> AuditTree:
    """The tree for `run_id` (which must be in the index)."""
    older = list(reversed(idx.resumed_chain(run_id)))
    seen: set[str] = set()
    runs = [run_node(idx, rid, "resumed", 0, seen) for rid in older]
    runs.append(run_node(idx, run_id, "audited", 0, seen))
    return AuditTree(run_id, runs)
