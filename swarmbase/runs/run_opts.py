"""A run request, resolved once against the caller's policy before anything is written:
the frozen values a new Run is made from (RunOpts), or RunRefused saying which limit
refused it. A new run and a resume go through the same step: `asked` reads the `run`
tool's parameters, `asked_again` an old run's record (what a resume carries over), and
`resolve` fills the caller's defaults and checks the limits — so a resumed run is checked
like a new one and no value travels as an untyped dict. Pure but for the realpath of a
`repository`.

The script's meta block is read here, as a pure literal without running the script
(swarmbase/script/meta.py), so a computed or misplaced meta is refused before a runner
starts or an agent spends anything."""

from __future__ import annotations

from typing import Mapping, TypeVar

import attrs

from .. import json_depth
from ..config import DEFAULT_ENGINE, PROFILES, Caller, Config
from ..jsonvalue import Json, JsonObject
from ..script import meta as script_meta
from .agent_opts import OptionError, model_allowed, pinned_cwd
from .model import Run
from .naming import leading_comment

# What a resume with the Workflow call shape may set anew (besides script and args).
RESUME_OVERRIDES = ("label", "description", "tokenTarget", "repository", "project", "notify")


T = TypeVar("T")


class RunRefused(Exception):
    """A run request the caller's policy does not allow; the message says why."""


@attrs.frozen
class Asked:
    """What a request asks for; None: the caller's default."""
    script: str
    args: Json = None
    label: str | None = None
    model: str | None = None
    effort: str | None = None
    profile: str | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    keep_work: bool | None = None
    timeout_ms: int | None = None
    budget_warn_at: float | None = None
    token_target: int | None = None
    description: str | None = None
    repository: str | None = None
    resumed_from: str | None = None
    notify: tuple[str, ...] | None = None       # progress notices asked for (progress_notice.py)


# The `run` tool's parameter for each field of Asked (script and args are read as they are).
PARAMS = {"label": "label", "model": "model", "effort": "effort", "profile": "profile",
          "budget_usd": "budgetUsd", "budget_tokens": "budgetTokens", "keep_work": "keepWork",
          "timeout_ms": "timeoutMs", "budget_warn_at": "budgetWarnAt", "token_target": "tokenTarget",
          "description": "description", "repository": "repository", "resumed_from": "resumedFrom"}
NUMBERS = {"budget_usd": float, "budget_warn_at": float, "budget_tokens": int, "timeout_ms": int}


def asked(params: Mapping[str, Json]) -> Asked:
    """The `run` tool's parameters (already checked against its JSON Schema). `project` and
    its older name `repository` are one parameter (`project` wins if both are given)."""
    if params.get("project") is not None:
        params = {**params, "repository": params["project"]}
    values: JsonObject = {}
    for field, name in PARAMS.items():
        v = params.get(name)
        if v is not None:
            values[field] = NUMBERS[field](v) if field in NUMBERS else v
    notify = params.get("notify")
    return Asked(script=params["script"], args=params.get("args"), notify=tuple(notify) if notify else None,
                 **values)


def asked_again(old: Run, script: str, args: Json, lost: set[str], params: Mapping[str, Json]) -> Asked:
    """A resume: the old run's values (but those a damaged record lost: the caller's
    defaults then), the script and args it runs with, and what the call sets anew."""
    def kept(name: str, value: T) -> T | None:
        return None if name in lost else value

    anew = asked({"script": script, **{k: params[k] for k in RESUME_OVERRIDES if k in params}})
    return Asked(script=script, args=args, resumed_from=old.id,
                 label=anew.label if anew.label is not None else kept("label", old.label),
                 model=kept("model", old.model), effort=kept("effort", old.effort),
                 profile=kept("profile", old.profile), budget_usd=kept("budgetUsd", old.budget_usd),
                 budget_tokens=kept("budgetTokens", old.budget_tokens), keep_work=kept("keepWork", old.keep_work),
                 timeout_ms=kept("timeoutMs", old.timeout_ms), budget_warn_at=kept("budgetWarnAt", old.budget_warn_at),
                 token_target=anew.token_target if anew.token_target is not None else kept("tokenTarget",
                                                                                           old.token_target),
                 description=anew.description if anew.description is not None else kept("description",
                                                                                         old.description),
                 repository=anew.repository if anew.repository is not None else kept("repository", old.repository),
                 notify=anew.notify if anew.notify is not None else (tuple(old.notify) if old.notify else None))


@attrs.frozen
class RunOpts:
    """A run as it will start: every default filled, every limit checked."""
    asked: Asked
    profile: str
    budget_usd: float
    budget_tokens: int
    timeout_ms: int
    budget_warn_at: float
    meta: script_meta.Meta | None
    repository: str | None            # the project's path (its name in project_name, if it has one)
    project_name: str | None = None

    def new_run(self, run_id: str, caller: str, dir_name: str, now: float) -> Run:
        a = self.asked
        return Run(id=run_id, caller=caller, dir_name=dir_name, created_at=now, label=a.label, args=a.args,
                   model=a.model, effort=a.effort, profile=self.profile, budget_usd=self.budget_usd,
                   budget_tokens=self.budget_tokens, keep_work=bool(a.keep_work), resumed_from=a.resumed_from,
                   timeout_ms=self.timeout_ms, budget_warn_at=self.budget_warn_at,
                   script_comment=leading_comment(a.script), meta=self.meta.to_json() if self.meta else None,
                   token_target=a.token_target, description=a.description, repository=self.repository,
                   project_name=self.project_name,
                   notify=list(a.notify) if a.notify else None)


def resolve(caller: Caller, a: Asked, cfg: Config) -> RunOpts:
    # Least privilege unless asked: read (or think, if that is all the caller may use).
    profile = a.profile or PROFILES[min(PROFILES.index("read"), PROFILES.index(caller.maxProfile))]
    if PROFILES.index(profile) > PROFILES.index(caller.maxProfile):
        raise RunRefused(f"profile {profile!r} is above this caller's maxProfile {caller.maxProfile!r}")
    if json_depth.deeper_than(a.args, json_depth.MAX_DEPTH):
        raise RunRefused(f"args: nested deeper than {json_depth.MAX_DEPTH} levels (the limit)")
    budget_usd = a.budget_usd if a.budget_usd is not None else float(caller.runUsdDefault)
    if budget_usd > caller.runUsdMax:
        raise RunRefused(f"budgetUsd {budget_usd:g} is above this caller's runUsdMax {caller.runUsdMax:g}")
    budget_tokens = a.budget_tokens if a.budget_tokens is not None else int(caller.runTokensDefault)
    if budget_tokens > caller.runTokensMax:
        raise RunRefused(f"budgetTokens {budget_tokens} is above this caller's runTokensMax {caller.runTokensMax}")
    timeout_ms = a.timeout_ms if a.timeout_ms is not None else min(cfg.runTimeoutMs, caller.runTimeoutMaxMs)
    if timeout_ms > caller.runTimeoutMaxMs:
        raise RunRefused(f"timeoutMs {timeout_ms} is above this caller's runTimeoutMaxMs {caller.runTimeoutMaxMs}")
    try:
        meta = script_meta.read(a.script).meta
    except script_meta.MetaError as e:
        raise RunRefused(f"the script was not started: {e}") from None
    project_name, repository = project_of(caller, a.repository)
    allowed = caller.models.for_engine(DEFAULT_ENGINE)    # a run's `model` is its default engine's
    if a.model is not None and not model_allowed(a.model, allowed):
        raise RunRefused(f"model {a.model!r} is not allowed for this caller (allowed: {', '.join(allowed or [])})")
    return RunOpts(asked=a, profile=profile, budget_usd=budget_usd, budget_tokens=budget_tokens,
                   timeout_ms=timeout_ms,
                   budget_warn_at=a.budget_warn_at if a.budget_warn_at is not None else caller.budgetWarnAt,
                   meta=meta, repository=repository, project_name=project_name)


def project_of(caller: Caller, asked_for: str | None) -> tuple[str | None, str | None]:
    """(name, path) of the project a run works in: the one asked for (a name from the
    caller's `projects`, or a path under its cwdRoots), else the caller's default project;
    (None, None) for a caller with no project (its agents get the run's own work dir)."""
    if asked_for is None:
        return caller.default_project() or (None, None)
    if asked_for in caller.projects:
        return asked_for, caller.projects[asked_for]
    if not asked_for.startswith("/"):
        names = ", ".join(sorted(caller.projects)) or "none configured"
        raise RunRefused(f"project {asked_for[:100]!r} is not one of this caller's projects ({names}); "
                         "a path must be absolute and under the caller's cwdRoots")
    try:
        path = pinned_cwd(asked_for, caller.cwdRoots)
    except OptionError as e:
        raise RunRefused(str(e).replace("agent(): opts.cwd", "project")) from None
    named = [n for n, p in caller.projects.items() if p == path]
    return (named[0] if named else None), path
