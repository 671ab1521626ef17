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

import errno
import hashlib
import os
import re
from pathlib import Path

import attrs

from .. import fsutil, money
from ..jsonvalue import Json, JsonObject
from ..script import meta as script_meta
from ..config import PROFILES, Caller
from .agent_opts import OptionError, pinned_cwd, unknown_option
from . import journal as journal_mod
from .budget import BudgetGate, Ledger
from .journal import KeyCounter
from .live import Bridge, LiveRun, script_budget
from .records import AgentRecord
from .scope import Scope
from .workflow_files import (MAX_SOURCE_CHARS, NAME, WorkflowFileError, find_workflow, not_found_in_script,
                             read_text, saved_listing)

KNOWN = ("label", "budgetUsd", "budgetTokens", "profile")
# Script text rather than a name: what no saved workflow's name has (a call, a statement,
# an operator, a quote).
SCRIPT_LIKE = re.compile(r"[;(){}=`'\"+*/<>!]|\breturn\b|\bawait\b")


class WorkflowError(ValueError):
    """Thrown into the calling script; the message says why."""


@attrs.frozen
class WorkflowCall:
    """What workflow_begin decided in call order."""
    path: str
    key: str
    source: str
    args: Json
    label: str
    budget_usd: float | None
    budget_tokens: int | None
    profile: str


class WorkflowScope:
    """A nested workflow's Scope (scope.py): its own path, budget slice, key counter, args,
    profile and bridge; the run's shared state through `root`."""

    def __init__(self, root: LiveRun, parent: Scope, call: WorkflowCall, usd: BudgetGate, tokens: BudgetGate) -> None:
        self.root = root
        self.call = call
        self.workflow_path = call.path
        self.depth = parent.depth + 1
        self.usd = usd
        self.tokens = tokens
        self.keys = KeyCounter()
        self.args_digest = journal_mod.args_hash(call.args)
        self.profile = call.profile
        self.workflow_calls = 0
        self.bridge: Bridge | None = None

    @property
    def default_phase(self) -> str:
        """Its agents before any phase() go under the workflow's label."""
        return self.call.label

    def add_agent(self, rec: AgentRecord, phase_title: str | None = None) -> None:
        self.root.file_agent(rec, self.workflow_path, phase_title)

    def budget_view(self) -> JsonObject:
        return script_budget(self.root, self.usd, self.tokens)


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


def find_saved(state_dir: Path, caller: str, name: str) -> tuple[str, str] | None:
    """(saved name, script) of the caller's saved workflow called `name`: its file name, or
    else the meta.name it declares (Claude Code finds saved workflows by meta.name)."""
    found = find_workflow(None, saved_dir(state_dir, caller), name)
    return (found.name, found.script) if found is not None else None


def read_script_file(path: str, roots: list[str], what: str = "scriptPath") -> str:
    """A script file named by an absolute path whose directory lies under one of the
    caller's cwdRoots (realpath, so a symlinked dir out of a root is refused); the file itself
    is opened without following a symlink, must be regular and at most MAX_SOURCE_CHARS."""
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise WorkflowError(f"{what} must be an absolute path to a script file under your cwdRoots")
    try:
        real = pinned_cwd(os.path.dirname(path), roots)
    except OptionError:
        raise WorkflowError(f"{what} {path[:200]!r} is not inside this caller's cwdRoots (script files are "
                            "read only from there)") from None
    try:
        fd = os.open(os.path.join(real, os.path.basename(path)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise WorkflowError(f"{what} {path[:200]!r}: no such file") from None
    except OSError as e:
        raise WorkflowError(f"{what} {path[:200]!r} cannot be opened ({'a symbolic link' if e.errno == errno.ELOOP else e.strerror})"
                            ) from None
    with os.fdopen(fd, "rb") as f:
        try:
            return read_text(f)
        except WorkflowFileError as e:
            raise WorkflowError(f"{what} {path[:200]!r} {e}") from None


def _source(caller: Caller, source: Json, state_dir: Path, project: str | None) -> tuple[str, str | None]:
    """(script text, default label) of a workflow() source: a workflow's name, found in the
    run's project then the saved workflows (Claude Code's form; a string found nowhere that
    looks like a name is an error), {name}, {scriptPath} (under cwdRoots), or script text
    (SwarmBase's)."""
    if isinstance(source, dict) and isinstance(source.get("scriptPath"), str):
        text = read_script_file(source["scriptPath"], caller.cwdRoots, "workflow({scriptPath})")
        return text, None
    name = source.get("name") if isinstance(source, dict) else source
    if not isinstance(name, str) or not name.strip():
        raise WorkflowError("workflow() expects a workflow name (string) or {scriptPath: string}")
    saved = saved_dir(state_dir, caller.name)
    try:
        found = find_workflow(project, saved, name)
    except WorkflowFileError as e:
        raise WorkflowError(f"workflow('{name[:100]}'): {e}") from None
    if found is not None:
        return found.script, found.name
    if isinstance(source, dict) or (len(name) <= 200 and "\n" not in name and not SCRIPT_LIKE.search(name)):
        raise WorkflowError(not_found_in_script(name, project, saved))
    return name, None


def resolve(scope: Scope, source: Json, args: Json, opts: JsonObject, state_dir: Path,
            max_depth: int, max_workflows: int, workflows_so_far: int) -> WorkflowCall:
    """In call order: validate a workflow() call and give it its path and journal key."""
    if scope.depth + 1 > max_depth:
        raise WorkflowError(f"workflow(): this would be depth {scope.depth + 1}; the daemon allows "
                            f"{max_depth} (maxWorkflowDepth in the daemon config lifts it)")
    if workflows_so_far >= max_workflows:
        raise WorkflowError(f"workflow(): this run reached its cap of {max_workflows} workflows "
                            f"(maxWorkflowsPerRun in the daemon config lifts it)")
    unknown = [k for k in opts if k not in KNOWN]
    if unknown:
        raise WorkflowError(unknown_option("workflow()", unknown[0], KNOWN))
    text, default_label = _source(scope.root.caller, source, state_dir, scope.root.run.repository)
    if not text.strip():
        raise WorkflowError("workflow(): the workflow's script is empty")
    if len(text) > MAX_SOURCE_CHARS:
        raise WorkflowError(f"workflow(): the source is {len(text):,} characters; the limit is {MAX_SOURCE_CHARS:,}")
    try:
        meta = script_meta.read(text).meta
    except script_meta.MetaError as e:
        raise WorkflowError(f"workflow({(default_label or 'script')[:100]!r}): {e}") from None
    if default_label is None and meta is not None and meta.name:
        default_label = meta.name
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


async def slice_budget(parent: Scope, call: WorkflowCall) -> tuple[BudgetGate, BudgetGate, float, int]:
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
    # mode= applies to the leaf only: workflows/ itself would get the umask's 0755 and list
    # every caller's name, so it is made (and kept) private first.
    top = d.parent
    top.mkdir(parents=True, exist_ok=True, mode=0o700)   # parents: a state dir not made yet (tests, tools)
    top.chmod(0o700)
    d.mkdir(exist_ok=True, mode=0o700)
    path = d / f"{name}.js"
    fsutil.write_atomic(path, script.encode())
    return path


def listing(state_dir: Path, caller: str) -> list[JsonObject]:
    """The caller's saved workflows (workflow_files.describe says what an entry holds)."""
    return saved_listing(saved_dir(state_dir, caller))
