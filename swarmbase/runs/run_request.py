"""A `run` request checked against the caller's policy, before anything is written: the
values a new Run is made from, or RunRefused saying which limit refused it. Pure but for
the realpath of a `repository`.

The script's meta block is read here, as a pure literal without running the script
(swarmbase/script/meta.py), so a computed or misplaced meta is refused before a runner
starts or an agent spends anything."""

from __future__ import annotations

from typing import Any

import attrs

from .. import json_depth
from ..script import meta as script_meta
from ..config import PROFILES, Caller, Config
from .agent_opts import OptionError, model_allowed, pinned_cwd


class RunRefused(Exception):
    """A run request the caller's policy does not allow; the message says why."""


@attrs.frozen
class RunPlan:
    profile: str
    budget_usd: float
    budget_tokens: int
    timeout_ms: int
    model: str | None
    meta: script_meta.Meta | None
    repository: str | None


def plan(caller: Caller, params: dict[str, Any], cfg: Config) -> RunPlan:
    # Least privilege unless asked: read (or think, if that is all the caller may use).
    profile = params.get("profile") or PROFILES[min(PROFILES.index("read"), PROFILES.index(caller.maxProfile))]
    if PROFILES.index(profile) > PROFILES.index(caller.maxProfile):
        raise RunRefused(f"profile {profile!r} is above this caller's maxProfile {caller.maxProfile!r}")
    if json_depth.deeper_than(params.get("args"), json_depth.MAX_DEPTH):
        raise RunRefused(f"args: nested deeper than {json_depth.MAX_DEPTH} levels (the limit)")
    budget_usd = float(params.get("budgetUsd", caller.runUsdDefault))
    if budget_usd > caller.runUsdMax:
        raise RunRefused(f"budgetUsd {budget_usd:g} is above this caller's runUsdMax {caller.runUsdMax:g}")
    budget_tokens = int(params.get("budgetTokens", caller.runTokensDefault))
    if budget_tokens > caller.runTokensMax:
        raise RunRefused(f"budgetTokens {budget_tokens} is above this caller's runTokensMax {caller.runTokensMax}")
    timeout_ms = int(params.get("timeoutMs", min(cfg.runTimeoutMs, caller.runTimeoutMaxMs)))
    if timeout_ms > caller.runTimeoutMaxMs:
        raise RunRefused(f"timeoutMs {timeout_ms} is above this caller's runTimeoutMaxMs {caller.runTimeoutMaxMs}")
    try:
        meta = script_meta.read(params["script"]).meta
    except script_meta.MetaError as e:
        raise RunRefused(f"the script was not started: {e}") from None
    repository = params.get("repository")
    if repository is not None:
        try:
            repository = pinned_cwd(repository, caller.cwdRoots)
        except OptionError as e:
            raise RunRefused(str(e).replace("agent(): opts.cwd", "repository")) from None
    model = params.get("model")
    if model is not None and not model_allowed(model, caller.models.claude):
        raise RunRefused(f"model {model!r} is not allowed for this caller "
                         f"(allowed: {', '.join(caller.models.claude or [])})")
    return RunPlan(profile=profile, budget_usd=budget_usd, budget_tokens=budget_tokens, timeout_ms=timeout_ms,
                   model=model, meta=meta, repository=repository)
