"""The peer bench's printout: one line per measured run as it ends, then the medians over
the rounds — the side-by-side table with SwarmBase ÷ Claude Code ratios, CPU per agent
(also the marginal cost of an agent, 40 → 200, where each side's fixed costs cancel), the
daemon's own CPU against its CLIs', and where SwarmBase's CPU went by process name."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.peer_measure import Figures

Runs = dict[tuple[str, str], list[Figures]]          # (case name, side) -> one per round
SIDES = ("swarmbase", "claude-code")


def line(f: Figures) -> str:
    r = f.requests
    own = f"  daemon {f.own_s:.2f} s, runner {f.runner_s:.2f} s" if f.own_s is not None else ""
    life = f"  agent life {f.agent_life_s:.2f} s" if f.agent_life_s is not None else ""
    replayed = f"  replayed {f.replayed}" if f.replayed else ""
    fsyncs = f"  fsyncs {f.fsyncs}" if f.fsyncs is not None else ""
    out = (f"wall {f.wall_s:7.2f} s  CPU {f.cpu_s:7.2f} s  PSS {f.pss_mb:6.0f} MB  requests {r['total']} "
           f"(main {r['main']}, agents {r['agents']}, other {r['other']}){fsyncs}{own}{life}{replayed}  "
           f"others {f.others_cores:.2f} cores, load {f.load1:.1f}")
    return out + (f"  PROBLEM: {f.problem}" if f.problem else "")


def med(figs: Sequence[Figures] | None, get: Callable[[Figures], float | None]) -> float:
    """The median over rounds (NaN when there is none)."""
    values = [v for v in map(get, figs or []) if v is not None]
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b and not (math.isnan(a) or math.isnan(b)) else "–"


WALL: Callable[[Figures], float] = lambda x: x.wall_s          # noqa: E731
CPU: Callable[[Figures], float] = lambda x: x.cpu_s            # noqa: E731
PSS: Callable[[Figures], float] = lambda x: x.pss_mb           # noqa: E731
REQUESTS: Callable[[Figures], float] = lambda x: x.requests["total"]  # noqa: E731
FSYNCS: Callable[[Figures], float | None] = lambda x: x.fsyncs          # noqa: E731


def _cell(figs: list[Figures] | None) -> str:
    if not figs:
        return "–"
    return f"{med(figs, WALL):.1f} s / {med(figs, CPU):.1f} s / {med(figs, PSS):.0f} MB / {med(figs, REQUESTS):.0f}"


def table(runs: Runs, cases: Sequence[Any]) -> None:
    print("\n## Medians (the ratio is SwarmBase ÷ Claude Code)\n")
    print("| case | SwarmBase wall / CPU / peak PSS / requests | Claude Code wall / CPU / peak PSS / requests "
          "| ratio wall / CPU / PSS / requests | others' load (cores) |")
    print("|---|---|---|---|---|")
    for case in cases:
        sb, cc = runs.get((case.name, "swarmbase")), runs.get((case.name, "claude-code"))
        if not sb and not cc:
            continue
        ratios = " / ".join(ratio(med(sb, g), med(cc, g)) for g in (WALL, CPU, PSS, REQUESTS)) if sb and cc else "–"
        load = med((sb or []) + (cc or []), lambda x: x.others_cores)
        print(f"| {case.name} (n={len(sb or cc or [])}) | {_cell(sb)} | {_cell(cc)} | {ratios} | {load:.2f} |")


def per_agent(runs: Runs, cases: Sequence[Any]) -> None:
    print("\n## CPU per agent (medians)\n")
    for case in cases:
        if case.agents and not case.resumes and (case.name, "claude-code") in runs:
            s, c = (med(runs.get((case.name, side)), CPU) for side in SIDES)
            rs, rc = (med(runs.get((case.name, side)), REQUESTS) for side in SIDES)
            fs, fc = (med(runs.get((case.name, side)), FSYNCS) for side in SIDES)
            print(f"- {case.name}: SwarmBase {s / case.agents:.3f} CPU-s, Claude Code {c / case.agents:.3f} CPU-s "
                  f"({ratio(s, c)}); requests per agent SwarmBase {rs / case.agents:.2f}, Claude Code "
                  f"{rc / case.agents:.2f} (all requests of the run, the peer's main session included); "
                  f"fsyncs per agent SwarmBase {fs / case.agents:.2f}, Claude Code {fc / case.agents:.2f}")
    if all((name, side) in runs for name in ("fanout-40", "fanout-200") for side in SIDES):
        def marginal(side: str, get: Callable[[Figures], float]) -> float:
            return (med(runs[("fanout-200", side)], get) - med(runs[("fanout-40", side)], get)) / 160
        cs, cc = marginal("swarmbase", CPU), marginal("claude-code", CPU)
        ws, wc = marginal("swarmbase", WALL), marginal("claude-code", WALL)
        print(f"- marginal (fanout-200 less fanout-40, over 160 agents: fixed costs cancel): CPU SwarmBase "
              f"{cs:.3f} s, Claude Code {cc:.3f} s ({ratio(cs, cc)}); wall SwarmBase {ws:.3f} s, Claude Code "
              f"{wc:.3f} s ({ratio(ws, wc)})")


def daemon_share(runs: Runs, cases: Sequence[Any], concurrency: int) -> None:
    print("\n## The daemon's own CPU (its process alone) against its CLIs' (medians, per agent() call)\n")
    print(f"(An agent's life is its record's start → end; a slot's time per agent is wall × {concurrency} ÷ agents:"
          " when the two are close, the slots were full and the wall is the CLIs' life.)\n")
    for case in cases:
        figs = runs.get((case.name, "swarmbase"))
        if not figs or not case.agents:
            continue
        own, runner = med(figs, lambda x: x.own_s), med(figs, lambda x: x.runner_s)
        clis = med(figs, lambda x: x.cpu_s - (x.own_s or 0.0) - x.runner_s)
        n = case.agents
        share = f"{100 * own / clis:.1f} %" if clis > 0.05 * n else "– (no CLI ran)"
        life = med(figs, lambda x: x.agent_life_s)
        slot = med(figs, WALL) * concurrency / n
        life_s = "" if math.isnan(life) else f"; an agent's life {life:.2f} s, a slot's time per agent {slot:.2f} s"
        print(f"- {case.name} ({case.profile or 'default profile'}): daemon {own / n * 1000:.1f} ms, script runners "
              f"{runner / n * 1000:.1f} ms, CLIs with their sandboxes {clis / n * 1000:.0f} ms: the daemon is "
              f"{share} of the CLIs{life_s}")


def by_process(runs: Runs, cases: Sequence[Any]) -> None:
    print("\n## Where SwarmBase's CPU went, by process name (CPU-s per agent, medians; sampled, so lower bounds)\n")
    for case in cases:
        figs = runs.get((case.name, "swarmbase"))
        if not figs or not case.agents or case.resumes:
            continue
        names = {k for x in figs for k in x.by_name}
        spent = {k: med(figs, lambda x, k=k: x.by_name.get(k, 0.0)) for k in names}   # type: ignore[misc]
        parts = [f"{k} {v / case.agents:.3f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:6]]
        print(f"- {case.name}: {', '.join(parts)} (the cgroup's total: {med(figs, CPU) / case.agents:.3f})")


def problems(runs: Runs) -> None:
    found = [(k, x.problem) for k, figs in runs.items() for x in figs if x.problem]
    if found:
        print("\n## Runs that did not end as expected (their figures are in the medians above)\n")
        for (name, side), p in found:
            print(f"- {name} on {side}: {p}")


def report(runs: Runs, cases: Sequence[Any], concurrency: int) -> None:
    table(runs, cases)
    per_agent(runs, cases)
    daemon_share(runs, cases, concurrency)
    by_process(runs, cases)
    problems(runs)
