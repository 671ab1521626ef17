"""Differential conformance against the real peer: every script of tests/peer/cases.py runs
unchanged through Claude Code's own Workflow runtime (the pinned CLI, headless) and
through a SwarmBase daemon process (its agents the same CLI), both against one
deterministic fake model; each case asserts both ended the same way with equal return
values, or — for a deliberate difference, named in the case and explained in
swarmbase/guide.md — asserts exactly what differs. Resume is checked the same way.

Cost: everything runs once, concurrently, in one module fixture: one daemon, one peer
config dir; the peer's calls are batched into PEER_BATCHES CLI processes (plus one for the
case that must run alone and three for resume: ~8 CLI starts of ~1 CPU-s, where one CLI
per script cost ~1.1 CPU-s each × 48), every SwarmBase run at once (~45 agents in all,
~0.8 CPU-s each: scripts use agents only where the case is about agents). Nothing here
skips: a missing CLI fails. Measured: 37 s wall on the 2-core machine at load ~2 (57 s at
load ~7), ~31 CPU-s counted for the test's process tree.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from .conftest import give_to_sandbox
from .peer.cases import CASES, RESUME_SCRIPT, SAVED, SCRIPT_FILE, Case
from .peer.claude_code import ClaudeCodePeer, PeerError, PeerRun, cli_present
from .peer.daemon_side import SwarmBaseDaemon, SwarmBaseRun, swarmbase_daemon
from .peer.model import DeterministicModel
from .peer.project import make_project
from .peer.realistic import REALISTIC, preview
from .peer.seeing import SeeingModel

pytestmark = pytest.mark.timeout(900)

# Every peer call of the suite is made in a few `claude -p` processes (one Workflow
# tool_use per call in one turn): a CLI start is ~1 CPU-s, a workflow in it ~0.1.
PEER_BATCHES = 3
ALL = CASES + REALISTIC
CONTROL = "review-diff"         # run again by SwarmBase in a checkout without the project's files


def _sandbox_clone(proj: Path, name: str, state: Path) -> Path:
    """The same repository for SwarmBase, owned by its sandbox user: a root daemon's
    worktree git writes it as that user, and the peer (root here) refuses a checkout it
    does not own ("its git identity could not be verified")."""
    clone = proj.with_name(name)
    subprocess.run(["git", "clone", "-q", str(proj), str(clone)], check=True, capture_output=True)
    return give_to_sandbox(clone, state, "peer")


def _prepared(case: Case, script_file: Path) -> dict[str, Any]:
    call = case.workflow_input()
    if case.name == "call-by-name":
        call.pop("script")
    if case.name == "call-by-script-path":
        call.pop("script")
        call["scriptPath"] = str(script_file)
    if "script" in call:
        call["script"] = call["script"].replace("SCRIPT_FILE", json.dumps(str(script_file)))
    return call


async def _conform(base: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}                       # "resume" -> what the resume runs gave
    pairs: dict[str, dict[str, Any]] = {}          # case name -> {"cc": ..., "sb": ...}
    prompts: dict[str, list[str]] = {}             # case name -> the prompts SwarmBase's agents got
    async with trio.open_nursery() as n:
        model = await n.start(SeeingModel().serve)
        # The project exists before the daemon starts: a resident's config names it. Its
        # workflows are in its .claude/workflows/, where both runtimes look (the clone has them).
        proj = make_project(base / "roots" / "proj", {"scripts/from-file.js": SCRIPT_FILE,
                                                      **{f".claude/workflows/{n}.js": t for n, t in SAVED.items()}})
        sb_repo = _sandbox_clone(proj, "proj-sandboxed", base / "state")
        # The control: a repository without the project's files (an agent in the wrong place).
        elsewhere = _sandbox_clone(make_project(base / "roots" / "empty-src", base={"README.md": "another project\n"}), "elsewhere", base / "state")
        async with swarmbase_daemon(base, model.url, project=sb_repo) as sb:
            peer = ClaudeCodePeer(model, base / "peer-home", proj)
            script_file = proj / "scripts" / "from-file.js"
            calls = {case.name: _prepared(case, script_file) for case in ALL}

            async def on_peer(batch: list[Case]) -> None:
                for case, run in zip(batch, await peer.run_many([calls[c.name] for c in batch])):
                    pairs.setdefault(case.name, {})["cc"] = run

            async def on_swarmbase(case: Case) -> None:
                call = calls[case.name]          # the project is the caller's default, as for the peer
                if "target" in case.needs:          # the peer has no way to set one (see the case)
                    call = {**call, "tokenTarget": 1000}
                run = await sb.run(call)
                pairs.setdefault(case.name, {})["sb"] = run
                prompts[case.name] = model.tasks_from(run.run_id) if run.run_id else []

            async def control() -> None:
                # `project` names the other checkout: an agent in the wrong place.
                out["control"] = await sb.run({**calls[CONTROL], "project": str(elsewhere)})

            together = [c for c in ALL if not c.alone]
            batches = [together[i::PEER_BATCHES] for i in range(PEER_BATCHES)] + [[c] for c in ALL if c.alone]
            async with trio.open_nursery() as m:
                for batch in batches:
                    m.start_soon(on_peer, batch)
                for case in ALL:
                    m.start_soon(on_swarmbase, case)
                m.start_soon(control)
                m.start_soon(_resume_both, peer, sb, model, out)
        n.cancel_scope.cancel()
    out["prompts"] = prompts
    return {**{name: (pair["cc"], pair["sb"]) for name, pair in pairs.items()}, **out}


async def _resume_both(peer: ClaudeCodePeer, sb: SwarmBaseDaemon, model: DeterministicModel,
                       out: dict[str, Any]) -> None:
    """A run, its resume with the same script, and a resume of an edited script (its first
    call changed), on each runtime."""
    try:
        await _resume_runs(peer, sb, model, out)
    except PeerError as e:          # reported by the resume test, not as a fixture error
        out["resume"] = e


async def _resume_runs(peer: ClaudeCodePeer, sb: SwarmBaseDaemon, model: DeterministicModel,
                       out: dict[str, Any]) -> None:
    call = {"script": RESUME_SCRIPT, "args": {"fail": False}}
    edited = {**call, "script": RESUME_SCRIPT.replace("'resume first'", "'resume first, edited'")}
    first = await peer.run(call)
    counts = [len(model.tasks_from(f"cc:{first.session_id}"))]
    again = await peer.run({**call, "resumeFromRunId": first.run_id}, resume_session=first.session_id)
    counts.append(len(model.tasks_from(f"cc:{first.session_id}")))
    changed = await peer.run({**edited, "resumeFromRunId": first.run_id}, resume_session=first.session_id)
    counts.append(len(model.tasks_from(f"cc:{first.session_id}")))
    s_first = await sb.run(call)
    s_again = await sb.run({**call, "resumeFromRunId": s_first.run_id})
    s_changed = await sb.run({**edited, "resumeFromRunId": s_first.run_id})
    out["resume"] = {
        "cc": [first, again, changed], "sb": [s_first, s_again, s_changed],
        # Agents each run started (the peer's session is shared by its three runs).
        "cc_agents": [counts[0], counts[1] - counts[0], counts[2] - counts[1]],
        "sb_agents": [len(model.tasks_from(r.run_id)) for r in (s_first, s_again, s_changed)],
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not cli_present():
        pytest.fail("the Claude Code CLI is not installed under tests/.tools: run bash tests/install.sh")
    return trio.run(_conform, tmp_path_factory.mktemp("conformance"))


def _ended(run: Any) -> str:
    return "completed" if run.status == "completed" else "failed"


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_same_result_on_both_runtimes(outcomes: dict[str, Any], case: Case) -> None:
    cc, sb = outcomes[case.name]
    if case.differs:
        assert case.check is not None, "a deliberate difference must say what differs"
        case.check(cc if isinstance(cc, PeerRun) else None, sb)
        return
    assert isinstance(cc, PeerRun), f"the peer did not run it: {cc}"
    assert _ended(sb) == _ended(cc), (cc.error, sb.error)
    assert sb.result == cc.result, (cc.logs, cc.record.get("agents") if isinstance(cc.record, dict) else None)
    if case.check is not None:
        case.check(cc, sb)


def test_failures_fail_on_both(outcomes: dict[str, Any]) -> None:
    """The cases that must fail do, on both (a case above only says they end alike)."""
    for name in ("return-function", "top-level-throw"):
        cc, sb = outcomes[name]
        assert cc.status == "failed" and sb.status == "failed", (name, cc.error, sb.error)
    assert "the script gave up" in outcomes["top-level-throw"][1].error


def test_resume_replays_and_an_edited_script_reuses_its_unchanged_calls(outcomes: dict[str, Any]) -> None:
    r = outcomes["resume"]
    assert not isinstance(r, Exception), f"the peer did not resume: {r}"
    cc, sb = r["cc"], r["sb"]
    assert [x.status for x in cc] == [x.status for x in sb] == ["completed"] * 3
    assert sb[0].result == cc[0].result and sb[1].result == cc[1].result == cc[0].result
    assert sb[2].result == cc[2].result and cc[2].result != cc[0].result
    assert r["cc_agents"][0] == r["sb_agents"][0] == 4
    # An unchanged resume runs no agent on either runtime.
    assert r["cc_agents"][1] == r["sb_agents"][1] == 0
    # Deliberate difference (guide: "Resume"): the peer's cache is positional, so editing the
    # first call re-runs every call after it; SwarmBase's is keyed by content and runs only
    # the edited call.
    assert r["cc_agents"][2] == 4
    assert r["sb_agents"][2] == 1


def _peer_agents(cc: PeerRun) -> list[dict[str, Any]]:
    return [p for p in cc.record.get("workflowProgress", []) if p.get("type") == "workflow_agent"]


def _sb_agents(sb: SwarmBaseRun) -> list[dict[str, Any]]:
    return [a for ph in sb.phases for a in ph.get("agents", [])]


@pytest.mark.parametrize("case", [c for c in REALISTIC if not c.differs], ids=[c.name for c in REALISTIC if not c.differs])
def test_same_agents_asked_the_same(outcomes: dict[str, Any], case: Case) -> None:
    """Not only the return value: as many agents, the same labels, the same prompts (as
    the peer keeps them: promptPreview, 400 characters and an ellipsis)."""
    cc, sb = outcomes[case.name]
    assert isinstance(cc, PeerRun), f"the peer did not run it: {cc}"
    assert cc.agent_count == len(_sb_agents(sb)) > 0, (cc.agent_count, _sb_agents(sb))
    assert sorted(p["label"] for p in _peer_agents(cc)) == sorted(a["label"] for a in _sb_agents(sb))
    ours = sorted(preview(p) for p in outcomes["prompts"][case.name])
    assert sorted(p["promptPreview"] for p in _peer_agents(cc)) == ours


def test_agents_see_the_project(outcomes: dict[str, Any]) -> None:
    """The fake answers from what the agents read: in the project both runtimes saw its
    files; the same script run in a checkout without them returns something else."""
    cc, sb = outcomes[CONTROL]
    assert "#missing" not in json.dumps(cc.result) and "seen: src/calc.py#" in json.dumps(cc.result), cc.result
    assert sb.result == cc.result
    control = outcomes["control"]
    assert control.status == "completed", control.error
    assert control.result != cc.result and "src/calc.py#missing" in json.dumps(control.result), control.result
