"""workflow(): a child script inside the same run, in its own runner process.

A workflow scope is what agent() and phase() see from inside one workflow: its own budget
slice (reserved whole from the parent's budget, so the child cannot spend past it and the
parent's other branches keep theirs), its own journal-key counter (keys carry the
workflow's path, so resume replays a whole tree), its own phases (filed under its path)
and its own runner bridge; the run's agents, slots, journal and records are shared.

Paths follow call order: the root script is "", its first workflow() call is "1", that
workflow's second call is "1/2". A finished workflow is journaled whole (kind
"workflow"), so on resume a completed subtree replays without starting its runner.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from .. import fsutil, money
from ..config import PROFILES
from . import journal as journal_mod
from .budget import BudgetGate, Ledger
from .journal import KeyCounter

if TYPE_CHECKING:
    from .live import LiveRun

# A saved workflow's file name: matched whole (fullmatch), since `$` also matches before a
# final newline and NAME.match("x\n") once let save_workflow write "x\n.js".
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
KNOWN = ("label", "budgetUsd", "budgetTokens", "profile")
MAX_SOURCE_CHARS = 1_000_000


class WorkflowError(ValueError):
    """Thrown into the calling script; the message says why."""


@attrs.frozen
class WorkflowCall:
    """What workflow_begin decided in call order."""
    path: str
    key: str
    source: str
    args: Any
    label: str
    budget_usd: float | None
    budget_tokens: int | None
    profile: str


class Scope:
    """The view of a run that a (root or nested) script has. LiveRun is the root scope."""


class WorkflowScope(Scope):
    def __init__(self, root: "LiveRun", parent: Any, call: WorkflowCall, usd: BudgetGate, tokens: BudgetGate) -> None:
        self.root = root
        self.parent = parent
        self.call = call
        self.workflow_path = call.path
        self.depth = parent.depth + 1
        self.usd = usd
        self.tokens = tokens
        self.keys = KeyCounter()
        self.args = call.args
        self.args_digest = journal_mod.args_hash(call.args)
        self.profile = call.profile
        self.workflow_calls = 0
        self.bridge: Any = None

    # The run's shared state, read (and the agent counter written) through the root.
    run = property(lambda self: self.root.run)
    caller = property(lambda self: self.root.caller)
    slots = property(lambda self: self.root.slots)
    replay = property(lambda self: self.root.replay)
    journal = property(lambda self: self.root.journal)
    journal_lock = property(lambda self: self.root.journal_lock)
    agents = property(lambda self: self.root.agents)
    agent_scopes = property(lambda self: self.root.agent_scopes)
    stop_reasons = property(lambda self: self.root.stop_reasons)
    writes = property(lambda self: self.root.writes)
    phases = property(lambda self: self.root.phases)

    @property
    def stop_reason(self) -> str | None:
        return self.root.stop_reason

    def next_agent_number(self) -> int:
        return self.root.next_agent_number()

    def add_agent(self, rec: Any) -> None:
        self.root.add_agent(rec, self.workflow_path)

    def budget_view(self) -> dict[str, Any]:
        return {**self.usd.ledger.view(), "tokens": self.tokens.ledger.view()}


def saved_dir(state_dir: Path, caller: str) -> Path:
    return state_dir / "workflows" / caller


def load_saved(state_dir: Path, caller: str, name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise WorkflowError("workflow(): a saved workflow's name is 1-64 letters, digits, '_' or '-'")
    path = saved_dir(state_dir, caller) / f"{name}.js"
    try:
        return path.read_text()
    except FileNotFoundError:
        raise WorkflowError(f"workflow(): no saved workflow named {name!r} (see the workflows tool)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise WorkflowError(f"workflow(): the saved workflow {name!r} cannot be read ({type(e).__name__})") from None


def resolve(scope: Any, source: Any, args: Any, opts: dict[str, Any], state_dir: Path,
            max_depth: int, max_workflows: int, workflows_so_far: int) -> WorkflowCall:
    """In call order: validate a workflow() call and give it its path and journal key."""
    if scope.depth + 1 > max_depth:
        raise WorkflowError(f"workflow(): this would be depth {scope.depth + 1}; the daemon allows "
                            f"{max_depth} (maxWorkflowDepth)")
    if workflows_so_far >= max_workflows:
        raise WorkflowError(f"workflow(): this run reached its cap of {max_workflows} workflows (maxWorkflowsPerRun)")
    unknown = [k for k in opts if k not in KNOWN]
    if unknown:
        raise WorkflowError(f"workflow(): unknown option {str(unknown[0])[:100]!r} (known: {', '.join(KNOWN)})")
    if isinstance(source, dict):
        name = source.get("name")
        text = load_saved(state_dir, scope.caller.name, name)
        default_label = str(name)
    else:
        text = source
        default_label = None
    if not isinstance(text, str) or not text.strip():
        raise WorkflowError("workflow(): source must be script text or {name} of a saved workflow")
    if len(text) > MAX_SOURCE_CHARS:
        raise WorkflowError(f"workflow(): the source is {len(text):,} characters; the limit is {MAX_SOURCE_CHARS:,}")
    label = opts.get("label", default_label)
    if label is not None and not isinstance(label, str):
        raise WorkflowError("workflow(): opts.label must be a string")
    budget_usd = opts.get("budgetUsd")
    if budget_usd is not None and (isinstance(budget_usd, bool) or not isinstance(budget_usd, (int, float))
                                   or not 0 < budget_usd < float("inf")):
        raise WorkflowError("workflow(): opts.budgetUsd must be a number above 0")
    budget_tokens = opts.get("budgetTokens")
    if budget_tokens is not None and (isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int)
                                      or budget_tokens <= 0):
        raise WorkflowError("workflow(): opts.budgetTokens must be a whole number above 0")
    profile = opts.get("profile", scope.profile)
    if profile not in PROFILES:
        raise WorkflowError(f"workflow(): opts.profile must be one of {', '.join(PROFILES)}")
    if PROFILES.index(profile) > PROFILES.index(scope.profile):
        raise WorkflowError(f"workflow(): profile {profile!r} is above the calling script's {scope.profile!r}")
    scope.workflow_calls += 1
    path = f"{scope.workflow_path}/{scope.workflow_calls}" if scope.workflow_path else str(scope.workflow_calls)
    material = journal_mod.canonical({"kind": "workflow", "source": text, "args": journal_mod.args_hash(args),
                                      "budgetUsd": budget_usd, "budgetTokens": budget_tokens, "profile": profile})
    key = f"workflow:{path}:{hashlib.sha256(material.encode()).hexdigest()}"
    return WorkflowCall(path=path, key=key, source=text, args=args, label=(label or f"workflow {path}")[:200],
                        budget_usd=float(budget_usd) if budget_usd is not None else None,
                        budget_tokens=budget_tokens, profile=profile)


async def slice_budget(parent: Any, call: WorkflowCall) -> tuple[BudgetGate, BudgetGate, float, int]:
    """The child's gates: a slice reserved whole from the parent's, or the parent's own."""
    usd, tokens = parent.usd, parent.tokens
    got_usd, got_tokens = 0.0, 0
    if call.budget_usd is not None:
        got = parent.usd.try_now(call.budget_usd)
        if got is None or got + 1e-9 < call.budget_usd:
            if got:
                parent.usd.settle(got, 0.0)
            raise WorkflowError(f"workflow(): its budgetUsd {money.usd(call.budget_usd)} is more than the calling "
                                f"script has left ({money.usd(parent.usd.ledger.available)})")
        got_usd = got
        usd = BudgetGate(Ledger(total=got))
    if call.budget_tokens is not None:
        got_t = parent.tokens.try_now(call.budget_tokens)
        if got_t is None or got_t + 1e-9 < call.budget_tokens:
            if got_t:
                parent.tokens.settle(got_t, 0)
            if got_usd:
                parent.usd.settle(got_usd, 0.0)
            raise WorkflowError(f"workflow(): its budgetTokens {call.budget_tokens:,} are more than the calling "
                                f"script has left")
        got_tokens = int(got_t)
        tokens = BudgetGate(Ledger(total=float(got_t), minimum=parent.tokens.ledger.minimum), what="tokens")
    return usd, tokens, got_usd, got_tokens


def save(state_dir: Path, caller: str, name: str, script: str) -> Path:
    """A caller's saved workflow, written whole (the `save_workflow` tool)."""
    if not NAME.fullmatch(name):
        raise WorkflowError("name must be 1-64 letters, digits, '_' or '-'")
    d = saved_dir(state_dir, caller)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / f"{name}.js"
    fsutil.write_atomic(path, script.encode())
    return path


def listing(state_dir: Path, caller: str) -> list[dict[str, Any]]:
    """The caller's saved workflows with the first line of each (their description)."""
    d = saved_dir(state_dir, caller)
    out = []
    if d.is_dir():
        for p in sorted(d.glob("*.js")):
            try:
                text = p.read_text()
            except (OSError, UnicodeDecodeError):
                continue
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            out.append({"name": p.stem, "chars": len(text), "firstLine": first[:200]})
    return out
