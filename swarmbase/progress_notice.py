"""Progress notices: what a run that asked for them (`run` parameter `notify`) tells its
caller before the end notice, and the rule that keeps a chatty run from flooding a host.
Pure: no clock, no I/O (progress_feed.py applies it).

Events. `"phase"`: a phase of the root script ended, which in Claude Code's Workflow
language means the script called phase() with another title (phase('A') again later goes
back to A, and leaving it again is another end); agents started before the first phase()
make an implicit "main" phase. The last phase ends with the run, and the end notice says
so: no progress notice repeats it. `"failures"`: the run's first failed agent (a nested
workflow's agents count; skipped, cancelled and interrupted agents are not failures).
A nested workflow()'s own phases send nothing: they are steps inside one phase of the
root script (they show in `status` and on the dashboard).

Coalescing, per run:
1. the first event of each kind (the run's first phase end, its first failure) is written
   at once, whatever the window below says: that is the news a caller waits for;
2. at most one progress notice of a run waits in the outbox: while one is undelivered,
   newer events update it in place (Outbox.amend: same eventId, same place in the queue)
   rather than queue another, and it lists every event it has not delivered;
3. otherwise the outbox is written for a run's progress at most once per MIN_INTERVAL_S
   (a queue or an update); events inside the window wait, and the write when it opens
   carries them;
4. when the run ends, events still waiting for their window are written before its end
   notice is queued: into the run's progress notice if it is still undelivered (in place),
   else in one last progress notice. No event is dropped.
So a host gets the first event of each kind at once, then at most one progress notice per
run per MIN_INTERVAL_S, and one more at the end if events were waiting; an offline host
gets at most one per run (listing the run's events up to its end), then the end notice. A
chatty run costs at most one outbox write (an fsync) per 30 s, plus one per kind and one
at its end. An update that races the push of the notice it updates loses to it (the host
dedupes the eventId); the trailing notice or the end notice follows anyway.

Every script-written string in a progress notice (phase titles, labels, agent errors) is
one line, quoted and bounded (data_frame.quoted), and redacted by the caller of build().
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Iterable

import attrs

from .data_frame import one_line, quoted
from .mcpl.features import NOTIFY_SET
from .money import usd
from .runs.model import Run, iso

KINDS = ("phase", "failures")
TAG = "swarmbase:progress"
MIN_INTERVAL_S = 30.0
MAX_LINES = 8                  # lines a notice lists; older ones are counted, not shown


def event_id(run_id: str, n: int) -> str:
    return f"{run_id}:progress:{n}"


def is_progress(event_id: str) -> bool:
    return ":progress:" in event_id


@attrs.define
class RunProgress:
    """One run's progress state while it is in flight."""
    kinds: frozenset[str]
    phase: str | None = None             # the root script's current phase
    tallies: dict[str, Counter[str]] = attrs.Factory(dict)     # root phase title -> agent end states
    agents_seen: bool = False            # an agent started before any phase(): the implicit "main"
    failure_told: bool = False
    # Events not known to be delivered: the pending notice's (the first `written`), then
    # newer ones. At most maxPhasesPerRun + 1 lines, and only while the host is away.
    lines: list[str] = attrs.Factory(list)
    written: int = 0
    pending: str | None = None           # eventId of the last queued notice
    last_write: float | None = None      # when the outbox was last written for this run
    due: float | None = None             # when waiting events may be written
    count: int = 0                       # notices queued for this run
    kinds_seen: set[str] = attrs.Factory(set)    # kinds with an event so far
    urgent: bool = False                 # a waiting event is the first of its kind: no window
    events: int = 0                      # events seen (what an uncoalesced feed would send)


def wanted(notify: Iterable[str] | None) -> frozenset[str]:
    return frozenset(k for k in notify or () if k in KINDS)


def phase_line(title: str, tally: Counter[str], next_title: str) -> str:
    ended = sum(tally.values())
    parts = ", ".join(f"{n} {state}" for state, n in sorted(tally.items()))
    agents = f"{ended} agent{'s' if ended != 1 else ''} ended in it" + (f" ({parts})" if parts else "")
    return f"Phase {quoted(title)} ended: {agents}; next phase {quoted(next_title)}."


def failure_line(n: int, label: str, error: str | None) -> str:
    why = f": {quoted(error, 200)}" if error else ""
    return f"First failed agent: #{n} {quoted(label, 80)}{why}."


def on_phase(state: RunProgress, title: str) -> str | None:
    """phase(title) in the root script: the line for the phase it ends, if any."""
    previous = state.phase if state.phase is not None else ("main" if state.agents_seen else None)
    state.phase = title
    if previous is None or previous == title or "phase" not in state.kinds:
        return None
    return phase_line(previous, state.tallies.get(previous, Counter()), title)


def on_agent_end(state: RunProgress, n: int, label: str, agent_state: str, phase: str | None, workflow: str,
                 error: str | None) -> str | None:
    """An agent ended: counted under its root phase; the line for the run's first failure."""
    if not workflow and phase is not None:
        state.tallies.setdefault(phase, Counter())[agent_state] += 1
    if agent_state != "failed" or state.failure_told or "failures" not in state.kinds:
        return None
    state.failure_told = True
    return failure_line(n, label, error)


def add_line(state: RunProgress, line: str, kind: str) -> None:
    state.events += 1
    state.lines.append(line)
    if kind not in state.kinds_seen:
        state.kinds_seen.add(kind)
        state.urgent = True


def decide(state: RunProgress, now: float, still_pending: bool, final: bool = False) -> str:
    """What to do with the waiting events: 'amend' the undelivered notice, 'queue' a new
    one, 'wait' until `state.due`, or 'drop' (nothing new). `final`: the run is ending,
    its end notice not queued yet: nothing waits any more."""
    if len(state.lines) <= state.written:
        return "drop"                    # nothing the pending (or delivered) notice did not say
    if final or state.urgent:
        return "amend" if still_pending else "queue"
    if state.last_write is not None and now - state.last_write < MIN_INTERVAL_S:
        state.due = state.last_write + MIN_INTERVAL_S
        return "wait"
    return "amend" if still_pending else "queue"


def written(state: RunProgress, now: float, still_pending: bool) -> None:
    """Before a write: lines of a delivered notice are not repeated; after it, every line
    is in the run's pending notice."""
    if not still_pending:
        del state.lines[:state.written]
    state.written = len(state.lines)
    state.last_write, state.due, state.urgent = now, None, False


def notice_text(run: Run, state: RunProgress, url: str | None) -> str:
    spend = usd(run.spent_usd) + (" (estimated)" if run.spent_estimated else "")
    head = (f"SwarmBase progress of run {one_line(run.display_label)} ({run.id}): {run.agents_done} of "
            f"{run.agents_total} agents done so far, {spend} of {usd(run.budget_usd)} spent. "
            f"No action needed; the end notice follows when the run ends.")
    earlier = len(state.lines) - MAX_LINES
    body = ([f"({earlier} earlier event{'s' if earlier != 1 else ''} not listed.)"]
            if earlier > 0 else []) + state.lines[-MAX_LINES:]
    return "\n".join([head, *body] + ([f"Dashboard: {url}"] if url else []))


def build(run: Run, state: RunProgress, url: str | None, redact: Callable[[str], str],
          now: float | None = None, event: str | None = None) -> dict[str, Any]:
    """The run's progress notice listing `state.lines`: under `event` (an update of that
    undelivered notice), else the run's next eventId (`state.count` moves on)."""
    if event is None:
        state.count += 1
        event = event_id(run.id, state.count)
    # suppressWake: context only, for push handlers that read it (README: hosts without a
    # gate have nothing else that can keep a progress notice from waking the agent).
    origin: dict[str, Any] = {"source": "swarmbase", "kind": "progress", "runId": run.id, "suppressWake": True}
    if url:
        origin["url"] = url
    return {
        "featureSet": NOTIFY_SET,
        "eventId": event,
        "timestamp": iso(time.time() if now is None else now),
        "origin": origin,
        "tags": [TAG],
        "payload": {"content": [{"type": "text", "text": redact(notice_text(run, state, url))}]},
    }
