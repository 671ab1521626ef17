"""How a run ends: why it was stopped (a `Stop`, set once, by whoever stopped it first)
and what its script came to, mapped to the status and error it is recorded with. Pure.

The reason used to be a bare string set in five places and decoded in one; now the
places that stop a run name a Stop, and this one function says what each means.
"""

from __future__ import annotations

import enum
from typing import Callable

import attrs

from ..script.bridge import ScriptOutcome


class Stop(enum.Enum):
    CANCEL = "cancel"        # a caller or an admin cancelled it
    SHUTDOWN = "shutdown"    # the daemon was stopped while it was in flight
    TIMEOUT = "timeout"      # it ran past timeoutMs (or runTimeoutMs)
    LIMIT = "limit"          # it hit a limit; the detail names it
    CRASH = "crash"          # a full disk or a daemon bug; the error says which


@attrs.frozen
class End:
    status: str
    error: str | None = None
    reason: str | None = None            # the reason in its status history
    error_line: int | None = None        # the script line the error came from
    has_result: bool = False             # completed: its result is saved (else it fails after all)


def end_of(stop: Stop | None, outcome: ScriptOutcome | None, *, error: str | None, detail: str | None,
           cancelled_by: str, timeout_ms: int | None, redact: Callable[[str], str],
           refused_worktrees: str | None = None) -> End:
    """A stop decides before the script's outcome; then a daemon-side error; then the script.
    A script that returned although every worktree agent it asked for was refused (no
    repository: `pipeline()` turns the throws into nulls) failed: its result is not the
    one its author expects (`refused_worktrees` says why)."""
    if stop is Stop.CANCEL:
        return End("cancelled", "cancelled by " + cancelled_by)
    if stop is Stop.SHUTDOWN:
        return End("interrupted", "interrupted: the daemon was stopped while the run was in flight",
                   reason="daemon shutdown")
    if stop is Stop.TIMEOUT:
        return End("failed", f"the run exceeded its time limit of {timeout_ms} ms (timeoutMs / runTimeoutMs)")
    if stop is Stop.LIMIT:
        return End("failed", detail or "the run exceeded a limit")
    if error is not None:
        return End("failed", error)
    if outcome is not None and outcome.ok and refused_worktrees is not None:
        return End("failed", refused_worktrees)
    if outcome is not None and outcome.ok:
        return End("completed", has_result=True)
    if outcome is not None:
        return End("failed", redact(outcome.error or ""), error_line=outcome.line)
    return End("failed")


def result_unsaved(why: str) -> End:
    """A completed script whose result could not be saved (a full disk)."""
    return End("failed", "the result could not be saved: " + why)


def agent_stopped_with_run(stop: Stop | None) -> str:
    """The error of an agent cut off by its run's stop (it never finished)."""
    return f"cancelled with the run ({stop.value if stop is not None else 'cancel'})"
