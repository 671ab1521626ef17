"""SwarmBase against its closest peer, Claude Code's own Workflow runtime (issue 23).

    python3 bench/peer_workflow.py [--rounds 3] [--cases fanout-40,resume-200] [--no-thousand]

The same Workflow scripts run on both, in one invocation, against one deterministic fake
Messages API on loopback (tests/peer/: the conformance suite's peer-driving code):

- Claude Code: `claude -p --allowedTools Workflow` (the pinned 2.1.328, headless); the
  fake's main-session reply is a tool_use of Workflow carrying the script, its agent()s
  are in-process requests. A resume is `claude -p --resume <session>` with
  `resumeFromRunId` (the peer resumes only within its session). 8 agents at once:
  CLAUDE_CODE_WORKFLOW_MAX_CONCURRENT_AGENTS=8.
- SwarmBase: one real daemon process (`python -m swarmbase`, perRunConcurrency 8) for
  the whole invocation, its claude engine the same CLI; each run is the `run` tool in
  Claude Code's call shape, timed from the call to the run's end notice and its result
  read back. Agents are one sandboxed `claude -p` each; the no-op cases use the `think`
  profile (no tools).

Cases: a trivial script (no agents: the fixed cost), 40 and 200 no-op agents in one
parallel(), a pipeline of 10 items × 3 agent stages, the resume of the round's completed
200-agent run (unchanged script: every agent replays), the case residents meet (issue 33
item 5: `default-40`, `default-200`): the script gives no profile, so each side's agent is
its default tool agent (SwarmBase's `read` profile, run inside the daemon with its tool
host as configured by default; Claude Code's general-purpose subagent), and each agent
makes one Read of the same file in the shared project; and on SwarmBase alone a 40-agent
fan-out with the `read` profile on a second daemon whose read agents are `claude -p`
(`inProcessRead: false`, in a cgroup of its own: the daemon's own CPU per CLI agent, issue
23 item 3) and the resume of a completed 1,000-agent run (made once, before the rounds:
~1,000 CLI starts, the longest part of the bench; `--no-thousand` skips it).

Each round runs every case on both runtimes one after the other, Claude Code first in odd
rounds and SwarmBase first in even ones, so a machine whose load drifts hits both alike;
the table gives the medians over the rounds and SwarmBase / Claude Code ratios.

What is measured for each run (bench/tree_cgroup.py):
- wall: the peer's `claude -p` process from start to exit (CLI start included: the trivial
  row shows that fixed cost on each side); SwarmBase's `run` call to its end notice and
  result, on a running daemon.
- CPU: the run's CPU-seconds over the whole process tree, from a cgroup v2 child per side
  (the peer's CLI; the daemon with its script runners, sandboxes and CLIs — the daemon's
  idle time during the run included).
- peak PSS: the most the side's tree held at once, summed over its processes, sampled
  every --sample-ms.
- requests: every HTTP request the fake model got during the run (main-session turns,
  agent requests, other paths).
- own: the daemon process's own CPU (utime+stime, its threads, not its children), and the
  CLIs': the tree's CPU less the daemon's and the script runners' (node, sampled).
- load: what the rest of the machine used meanwhile, in cores (all CPUs' busy time less
  both trees and the bench process itself, over the wall time), and the 1-minute loadavg.
The bench process (the fake model, the sampler, the MCPL client) is in neither tree; its
own CPU is printed at the end. Requests and fsyncs per agent are printed per case (fsyncs:
fsync + fdatasync calls in the side's cgroup, counted in the kernel by `perf stat`,
bench/peer_fsyncs.py). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.peer_measure import Figures, loadavg, measure  # noqa: E402
from bench.peer_report import line, report  # noqa: E402
from bench.tree_cgroup import CgroupUnavailable, TreeCgroup  # noqa: E402
from tests.peer.claude_code import ClaudeCodePeer, PeerError, cli_present  # noqa: E402
from tests.peer.counted_model import CountedModel  # noqa: E402
from tests.peer.daemon_side import SwarmBaseDaemon, swarmbase_daemon  # noqa: E402

CONCURRENCY = 8
RUN_TIMEOUT_S = 3600
META = "export const meta = { name: 'peer-bench', description: 'a peer bench script' }\n"
TRIVIAL = META + "return 'done';\n"
FANOUT = META + ("const r = await parallel(Array.from({length: args.n}, (_, i) => () => agent(`no-op ${i}`)));\n"
                 "return r.filter((x) => x !== null).length;\n")
READS = META + ("const r = await parallel(Array.from({length: args.n}, (_, i) => () =>\n"
                "  agent(`read ${i} [[readfile:${args.file}]]`)));\nreturn r.filter((x) => x !== null).length;\n")
READ_FILE = "notes.txt"            # in the project both sides' agents run in
PIPELINE = META + ("const r = await pipeline(Array.from({length: args.items}, (_, i) => `item ${i}`),\n"
                   "  (x) => agent(`find ${x}`), (f) => agent(`check ${f}`), (c) => agent(`report ${c}`));\n"
                   "return r.filter((x) => x !== null).length;\n")


@attrs.frozen
class Case:
    name: str
    call: dict[str, Any]            # the Workflow call, the same on both runtimes
    agents: int                     # agent() calls the script makes
    expect: Any                     # what the script returns when every agent answered
    resumes: str | None = None      # resumes the completed run of this case (same round; "thousand": the one)
    peer: bool = True               # also run on Claude Code
    profile: str | None = "think"   # SwarmBase's run profile (None: the default, as the script gives none)
    cli_read: bool = False          # on the daemon whose read agents are `claude -p`


def fanout(n: int) -> dict[str, Any]:
    return {"script": FANOUT, "args": {"n": n}}


CASES = [
    Case("trivial", {"script": TRIVIAL}, 0, "done"),
    Case("fanout-40", fanout(40), 40, 40),
    Case("fanout-200", fanout(200), 200, 200),
    Case("pipeline-10x3", {"script": PIPELINE, "args": {"items": 10}}, 30, 10),
    Case("resume-200", fanout(200), 200, 200, resumes="fanout-200"),
    Case("default-40", {"script": READS, "args": {"n": 40}}, 40, 40, profile=None),
    Case("default-200", {"script": READS, "args": {"n": 200}}, 200, 200, profile=None),
    Case("read-40", fanout(40), 40, 40, peer=False, profile="read", cli_read=True),
    Case("resume-1000", fanout(1000), 1000, 1000, resumes="thousand", peer=False),
]
THOUSAND = Case("fanout-1000", fanout(1000), 1000, 1000, peer=False)


@attrs.define
class Bench:
    model: CountedModel
    peer: ClaudeCodePeer
    sb: SwarmBaseDaemon
    sb_cli: SwarmBaseDaemon                     # read agents as `claude -p` (inProcessRead: false)
    trees: tuple[TreeCgroup, TreeCgroup, TreeCgroup]        # (peer's, SwarmBase's, the CLI-read daemon's)
    file: str                                   # what the default cases' agents Read
    sample_s: float
    figures: dict[tuple[str, str], list[Figures]] = attrs.Factory(dict)    # (case, side) -> per round

    def call_for(self, case: Case, side: str) -> dict[str, Any]:
        """The case's Workflow call (with the file to Read, for the default cases)."""
        call = {**case.call, **({"args": {**case.call["args"], "file": self.file}} if case.call is not None
                                and case.call.get("script") == READS else {})}
        if side == "swarmbase" and case.profile is not None:
            call["profile"] = case.profile
        return call

    async def on_peer(self, case: Case, source: Any) -> tuple[Any, Figures]:
        call, session = self.call_for(case, "claude-code"), None
        if case.resumes:
            call["resumeFromRunId"], session = source.run_id, source.session_id

        async def work() -> Any:
            try:
                return await self.peer.run(call, resume_session=session, timeout=RUN_TIMEOUT_S)
            except PeerError as e:
                return e
        run, fig = await measure(self.trees, self.trees[0], self.model, work, sample_s=self.sample_s)
        if isinstance(run, PeerError):
            return None, attrs.evolve(fig, problem=str(run)[:300])
        return run, attrs.evolve(fig, problem=_problem(run, case))

    async def on_swarmbase(self, case: Case, source: Any) -> tuple[Any, Figures]:
        call = self.call_for(case, "swarmbase")
        if case.resumes:
            call["resumeFromRunId"] = source.run_id
        sb, tree = (self.sb_cli, self.trees[2]) if case.cli_read else (self.sb, self.trees[1])
        run, fig = await measure(self.trees, tree, self.model,
                                 lambda: sb.run(call, timeout=RUN_TIMEOUT_S), sample_s=self.sample_s,
                                 daemon_pid=sb.pid)
        rows = [a for ph in run.phases for a in ph.get("agents", [])]
        lives = [a["durationS"] for a in rows if a.get("durationS") is not None and not a["replayed"]]
        return run, attrs.evolve(fig, problem=_problem(run, case),
                                 agent_life_s=statistics.median(lives) if lives else None,
                                 replayed=sum(1 for a in rows if a.get("replayed")))

    def keep(self, case: Case, side: str, rnd: int, fig: Figures) -> None:
        self.figures.setdefault((case.name, side), []).append(fig)
        print(f"round {rnd}  {case.name:<14} {side:<11} {line(fig)}", flush=True)


def _problem(run: Any, case: Case) -> str | None:
    """What is wrong with how the run ended (None: completed, returning what the case expects)."""
    if run.status == "completed" and run.result == case.expect:
        return None
    return f"{run.status}: {json.dumps(run.result)[:100]} {run.error or ''}"[:300]


async def rounds(b: Bench, cases: list[Case], n_rounds: int, thousand: Any) -> None:
    for rnd in range(1, n_rounds + 1):
        sides = ("claude-code", "swarmbase") if rnd % 2 else ("swarmbase", "claude-code")
        done: dict[tuple[str, str], Any] = {("thousand", "swarmbase"): thousand}
        for case in cases:
            for side in sides:
                if side == "claude-code" and not case.peer:
                    continue
                source = done.get((case.resumes, side)) if case.resumes else None
                if case.resumes and source is None:
                    print(f"round {rnd}  {case.name:<14} {side:<11} skipped: no completed {case.resumes} run")
                    continue
                run, fig = await (b.on_peer(case, source) if side == "claude-code" else b.on_swarmbase(case, source))
                b.keep(case, side, rnd, fig)
                if run is not None and fig.problem is None:
                    done[(case.name, side)] = run


async def main(args: argparse.Namespace) -> None:
    if not cli_present():
        raise SystemExit("the Claude Code CLI is not under tests/.tools: run bash tests/install.sh")
    TreeCgroup.sweep_stale()
    try:
        trees = (TreeCgroup.create("claude-code"), TreeCgroup.create("swarmbase"), TreeCgroup.create("swarmbase-cli"))
    except CgroupUnavailable as e:
        raise SystemExit(f"no cgroup for the process trees: {e}") from None
    wanted = set(args.cases.split(",")) if args.cases else None
    cases = [c for c in CASES if wanted is None or c.name in wanted]
    if not args.thousand:
        cases = [c for c in cases if c.resumes != "thousand"]
    base = Path(tempfile.mkdtemp(prefix="peer-bench-"))
    base.chmod(0o755)
    print(f"cgroups under {trees[0].path.parent}; state under {base}; loadavg at start: {loadavg()}")
    try:
        async with trio.open_nursery() as n, AsyncExitStack() as stack:
            model = await n.start(CountedModel().serve)
            # The project both sides' agents run in (SwarmBase's caller's default project, the
            # peer's cwd), holding the file the default cases Read.
            project = base / "roots" / "project"
            project.mkdir(parents=True)
            project.chmod(0o755)
            (project / READ_FILE).write_text("".join(f"line {i}: some notes to read\n" for i in range(40)))
            t0 = time.perf_counter()
            sb = await stack.enter_async_context(swarmbase_daemon(
                base, model.url, launcher=trees[1].launcher(), perRunConcurrency=CONCURRENCY, project=project,
                in_process_read=True))
            # (Not through measure(): the daemon's context must outlive any nursery opened here.)
            pss = (await trio.to_thread.run_sync(trees[1].sample))[0] / 1024
            print(f"daemon start (once, to its first MCPL handshake): wall {time.perf_counter() - t0:.2f} s, "
                  f"CPU {trees[1].cpu_s():.2f} s, PSS {pss:.0f} MB", flush=True)
            sb_cli = await stack.enter_async_context(swarmbase_daemon(
                base / "cli", model.url, launcher=trees[2].launcher(), perRunConcurrency=CONCURRENCY))
            peer = ClaudeCodePeer(model, base / "peer-home", project, max_concurrent=CONCURRENCY,
                                  launcher=trees[0].launcher())
            b = Bench(model, peer, sb, sb_cli, trees, file=str(project / READ_FILE), sample_s=args.sample_ms / 1000)
            thousand = None
            if any(c.resumes == "thousand" for c in cases):
                thousand, fig = await b.on_swarmbase(THOUSAND, None)
                print(f"once     {THOUSAND.name:<14} swarmbase   {line(fig)}", flush=True)
                if fig.problem:
                    thousand = None
            await rounds(b, cases, args.rounds, thousand)
            report(b.figures, cases, CONCURRENCY)
            n.cancel_scope.cancel()
    finally:
        for t in trees:
            t.remove()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\nloadavg at the end: {loadavg()}; the bench process's own CPU (fake model, sampler, client): "
          f"{time.process_time():.1f} s")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", help="comma-separated case names (default: all): " + ",".join(c.name for c in CASES))
    p.add_argument("--no-thousand", dest="thousand", action="store_false",
                   help="skip the 1,000-agent run and its resume")
    p.add_argument("--sample-ms", type=int, default=250, help="PSS sampling interval")
    p.add_argument("--keep", action="store_true", help="keep the state dirs (records, journals) at the end")
    trio.run(main, p.parse_args())
