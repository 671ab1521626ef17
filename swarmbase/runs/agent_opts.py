"""Validating and resolving agent() options against the run and the caller. No I/O but
realpath for cwd pinning."""

from __future__ import annotations

import os
from typing import Any

import attrs
import jsonschema

from ..config import ENGINES, PROFILES, Caller, Config
from .model import Run

EFFORTS = ("low", "medium", "high", "xhigh", "max")
KNOWN = ("model", "effort", "profile", "schema", "maxUsd", "maxTokens", "cwd", "label", "timeoutMs",
         "engine", "isolation")
MAX_PROMPT_CHARS = 2_000_000


class OptionError(ValueError):
    """Thrown into the script: the message names the option and the fault."""


@attrs.frozen
class AgentOptions:
    engine: str
    model: str | None
    effort: str | None
    profile: str
    schema: dict[str, Any] | None
    max_usd: float | None
    max_tokens: int | None
    cwd: str | None            # None: the run's work dir
    label: str
    timeout_ms: int


def _type(name: str, value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise OptionError(f"agent(): opts.{name} must be {what}, got a boolean")
    if not isinstance(value, kind):
        raise OptionError(f"agent(): opts.{name} must be {what}, got {type(value).__name__}")


def pinned_cwd(path: str, roots: list[str]) -> str:
    """The realpath of `path` if it lies under one of `roots` (realpaths), else OptionError.
    Resolving first means a symlink pointing out of a root is refused."""
    if not os.path.isabs(path):
        raise OptionError(f"agent(): opts.cwd must be an absolute path, got {path!r}")
    real = os.path.realpath(path)
    for root in roots:
        if real == root or real.startswith(root.rstrip("/") + "/"):
            if not os.path.isdir(real):
                raise OptionError(f"agent(): opts.cwd {path!r} is not a directory")
            return real
    raise OptionError(f"agent(): opts.cwd {path!r} (resolved to {real}) is outside this caller's cwdRoots")


def resolve(prompt: str, opts: dict[str, Any], run: Run, caller: Caller, cfg: Config, n: int,
            default_timeout_ms: int) -> AgentOptions:
    if len(prompt) > MAX_PROMPT_CHARS:
        raise OptionError(f"agent(): the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    unknown = [k for k in opts if k not in KNOWN]
    if unknown:
        raise OptionError(f"agent(): unknown option {unknown[0]!r} (known: {', '.join(KNOWN)})")
    if "isolation" in opts:
        raise OptionError("agent(): isolation: 'worktree' (or any isolation) is not implemented")
    engine = opts.get("engine", "claude")
    if engine not in ENGINES:
        raise OptionError(f"agent(): opts.engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine not in caller.engines:
        raise OptionError(f"agent(): engine {engine!r} is not allowed for caller {caller.name!r} "
                          f"(allowed: {', '.join(caller.engines) or 'none'})")
    if getattr(cfg.engines, engine) is None:
        raise OptionError(f"agent(): engine {engine!r} is not configured on this daemon")
    model = opts.get("model")
    if model is not None:
        _type("model", model, str, "a string")
    elif engine == "claude":
        model = run.model or caller.defaultModels.claude
    else:
        model = caller.defaultModels.codex
    effort = opts.get("effort", run.effort)
    if effort is not None and effort not in EFFORTS:
        raise OptionError(f"agent(): opts.effort must be one of {', '.join(EFFORTS)}, got {effort!r}")
    profile = opts.get("profile", run.profile)
    if profile not in PROFILES:
        raise OptionError(f"agent(): opts.profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    if PROFILES.index(profile) > PROFILES.index(caller.maxProfile):
        raise OptionError(f"agent(): profile {profile!r} is above this caller's maxProfile {caller.maxProfile!r}")
    schema = opts.get("schema")
    if schema is not None:
        _type("schema", schema, dict, "a JSON Schema object")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise OptionError(f"agent(): opts.schema is not a valid JSON Schema: {e.message}") from None
    max_usd = opts.get("maxUsd")
    if max_usd is not None:
        _type("maxUsd", max_usd, (int, float), "a number")
        if max_usd <= 0:
            raise OptionError(f"agent(): opts.maxUsd must be above 0, got {max_usd}")
    max_tokens = opts.get("maxTokens")
    if max_tokens is not None:
        if engine != "codex":
            raise OptionError("agent(): opts.maxTokens applies to codex agents only")
        _type("maxTokens", max_tokens, int, "a whole number")
        if max_tokens <= 0:
            raise OptionError(f"agent(): opts.maxTokens must be above 0, got {max_tokens}")
    cwd = opts.get("cwd")
    if cwd is not None:
        _type("cwd", cwd, str, "a string")
        cwd = pinned_cwd(cwd, caller.cwdRoots)
    label = opts.get("label", f"agent {n}")
    _type("label", label, str, "a string")
    timeout_ms = opts.get("timeoutMs", default_timeout_ms)
    _type("timeoutMs", timeout_ms, int, "a whole number of milliseconds")
    if not 1_000 <= timeout_ms <= 24 * 3_600_000:
        raise OptionError(f"agent(): opts.timeoutMs must be between 1000 and 86400000, got {timeout_ms}")
    return AgentOptions(engine=engine, model=model, effort=effort, profile=profile, schema=schema,
                        max_usd=float(max_usd) if max_usd is not None else None, max_tokens=max_tokens,
                        cwd=cwd, label=label[:200], timeout_ms=timeout_ms)
