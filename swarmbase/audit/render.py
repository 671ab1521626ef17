"""`python -m swarmbase audit RUN_ID [--json] [--expect-hash HASH]`: the tree, the totals
per depth, and the verdict. Exit 0 when every chain is intact (or the runs predate
chains), 1 naming the first broken file and line, 2 when the run cannot be found.

The chains make an edit evident, but whoever can rewrite every file of a run can rewrite
it consistently. `--expect-hash` checks the run against the hash of its end record kept
elsewhere (the `endHash` of its run-end notice): the end record covers the run's facts,
the last entry of every chain, its files and its link (which holds the end hash of the
run it resumed), so a rewrite anywhere in the run or in what it resumed changes it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .. import money
from . import archived
from .rundirs import RunIndex
from .tree import AgentNode, AuditTree, RunNode, WorkflowNode, build


def iso(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def usd(a: AgentNode) -> str:
    if not a.priced and a.cost_usd == 0:
        return "no price"
    return money.usd(a.cost_usd) + (" (est.)" if a.estimated else "")


def outcome(a: AgentNode) -> str:
    text = a.state + (" (replayed)" if a.replayed else "")
    if a.error:
        err = a.error if len(a.error) <= 100 else a.error[:97] + "..."
        text += f": {err}"
    return text


def _agent_line(a: AgentNode, indent: str) -> str:
    dur = f"{a.duration_s:.1f}s" if a.duration_s is not None else "-"
    return (f"{indent}#{a.n} {a.label}  {a.engine} {a.model or '(default model)'}  profile {a.profile or '-'}  "
            f"cwd {a.cwd or '(run work dir)'}  {a.tokens:,} tokens  {usd(a)}  {dur}  {outcome(a)}")


def _workflow_lines(w: WorkflowNode, indent: str, out: list[str]) -> None:
    title = "workflow (root script)" if not w.path else f"workflow {w.path}"
    out.append(f"{indent}{title}  [depth {w.depth}]")
    for a in w.agents:
        out.append(_agent_line(a, indent + "  "))
    for c in w.children:
        _workflow_lines(c, indent + "  ", out)


def _verdict_text(r: RunNode) -> str:
    v = r.verdict
    if v.brk is not None:
        return f"BROKEN at {v.brk}"
    return {"intact": "chains intact", "open": "chains whole so far (no end record)",
            "unchained": "unchained (written before hash chains)"}[v.status]


def _run_lines(r: RunNode, indent: str, out: list[str]) -> None:
    f = r.facts
    label = f" \"{f['label']}\"" if f.get("label") else ""
    spent = f.get("spentUsd")
    out.append(f"{indent}run {r.run_id}{label}  [{r.relation}]  {f.get('status')}  caller {f.get('caller')}  "
               f"created {iso(f.get('createdAt'))}  ended {iso(f.get('endedAt'))}  "
               f"spent {money.usd(spent if isinstance(spent, (int, float)) else 0)}  — {_verdict_text(r)}")
    out.append(f"{indent}  dir {r.dir}" + (f"  resumed from {f['resumedFrom']}" if f.get("resumedFrom") else ""))
    for note in r.verdict.notes:
        out.append(f"{indent}  note: {note}")
    _workflow_lines(r.root, indent + "  ", out)
    for k in r.nested:
        _run_lines(k, indent + "  ", out)


def hash_check(tree: AuditTree, idx: RunIndex, expected: str | None) -> str | None:
    """Why the audited run fails `--expect-hash` (None: it passes, or no hash was given)."""
    if expected is None:
        return None
    end = idx.runs[tree.run_id].get("end")
    actual = end.get("hash") if isinstance(end, dict) else None
    if actual is None:
        return f"{tree.run_id} has no end record, so there is no hash to check against {expected}"
    if actual != expected.strip().lower():
        return (f"{tree.run_id}'s end record hash is {actual}, not the expected {expected}: its records were "
                f"rewritten since that hash was taken (or the hash belongs to another run)")
    return None


def render_text(tree: AuditTree, expected: str | None = None, mismatch: str | None = None) -> str:
    out: list[str] = [f"audit of {tree.run_id}: {len(tree.all_runs())} run(s), oldest first"]
    for r in tree.runs:
        _run_lines(r, "", out)
    out.append("totals by depth")
    for depth, t in tree.totals_by_depth().items():
        out.append(f"  depth {depth}: {t['agents']} agents  {t['tokens']:,} tokens  {money.usd(t['costUsd'])}  "
                   f"{t['durationS']:.1f}s agent time")
    t = tree.totals()
    out.append(f"  all:     {t['agents']} agents  {t['tokens']:,} tokens  {money.usd(t['costUsd'])}  "
               f"{t['durationS']:.1f}s agent time")
    brk = tree.first_break()
    if brk is not None:
        out.append(f"BROKEN: {brk.file} line {brk.line}: {brk.reason}")
    elif mismatch is not None:
        out.append(f"BROKEN: {mismatch}")
    elif all(r.verdict.status == "unchained" for r in tree.all_runs()):
        out.append("unchained: these runs predate hash chains; nothing could be verified")
    else:
        out.append("verified: every chain is intact" + (", and the end record hash is the expected one"
                                                        if expected is not None else ""))
    return "\n".join(out) + "\n"


def render_json(tree: AuditTree, expected: str | None = None, mismatch: str | None = None) -> dict[str, Any]:
    brk = tree.first_break()
    out = {"runId": tree.run_id, "verified": brk is None and mismatch is None,
           "break": {"file": brk.file, "line": brk.line, "reason": brk.reason} if brk else None,
           "runs": [r.to_json() for r in tree.runs],
           "totalsByDepth": [{"depth": d, **t} for d, t in tree.totals_by_depth().items()],
           "totals": tree.totals()}
    if expected is not None:
        out["expectedHash"] = expected
        out["hashMismatch"] = mismatch
    return out


def audit_command(state_dir: Path, run_id: str, as_json: bool = False, out: TextIO = sys.stdout,
                  err: TextIO = sys.stderr, expect_hash: str | None = None) -> int:
    with archived.opened(RunIndex.scan(state_dir), run_id) as idx:
        return _audit(idx, run_id, as_json, out, err, expect_hash)


def _audit(idx: RunIndex, run_id: str, as_json: bool, out: TextIO, err: TextIO, expect_hash: str | None) -> int:
    state_dir = idx.state_dir
    if run_id not in idx.dirs:
        print(f"swarmbase audit: no run {run_id!r} under {state_dir / 'runs'} or {archived.root(state_dir)}",
              file=err)
        for d in idx.unreadable:
            print(f"swarmbase audit: note: {idx.rel(d / 'run.json')} cannot be read", file=err)
        return 2
    tree = build(idx, run_id)
    mismatch = hash_check(tree, idx, expect_hash)
    if as_json:
        out.write(json.dumps(render_json(tree, expect_hash, mismatch), ensure_ascii=False, indent=1) + "\n")
    else:
        out.write(render_text(tree, expect_hash, mismatch))
    return 1 if tree.first_break() is not None or mismatch is not None else 0
