"""Validating and resolving agent() options against the run and the caller, once: the
journal key, the record and the launch are all built from the one frozen result, so a
default can never differ between them. No I/O but realpath for cwd pinning."""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import os
from typing import Mapping

import attrs
import jsonschema

from ..config import DEFAULT_ENGINE, ENGINES, PLACEMENTS, PROFILES, Caller, Config
from ..defaults import NO_ENGINE_FIX
from ..engines.base import TOKEN_BUDGETED, Engine
from ..jsonvalue import Json, JsonObject
from .. import prices
from . import journal
from .model import Run
from .project_agents import NO_PROJECT_AGENTS, AgentFile, AgentFileError, ProjectAgents, profile_within

EFFORTS = ("low", "medium", "high", "xhigh", "max")
# Claude Code's options first (label, phase, schema, model, effort, isolation, agentType),
# then SwarmBase's own.
KNOWN = ("label", "phase", "schema", "model", "effort", "isolation", "agentType",
         "profile", "maxUsd", "maxTokens", "cwd", "timeoutMs", "engine", "base", "detail", "schemaRetries",
         "placement", "disallowedTools")
# Tools per profile, for `disallowedTools`: a profile whose every own tool is disallowed runs
# as the profile below it (a write agent without Edit, Write and Bash is a read agent).
PROFILE_OWN_TOOLS = {"read": ("Read", "Grep", "Glob"), "write": ("Edit", "Write", "Bash")}
# Claude Code's built-in agent types a headless session offers (2.1.328). The read-only
# ones get at most the read profile here.
AGENT_TYPES = {"general-purpose": None, "Explore": "read", "Plan": "read"}
MAX_PROMPT_CHARS = 2_000_000
# Schema nudges an agent gets unless it says: none for claude, whose CLI (and the in-daemon
# think path, which copies it) already corrects a wrong answer inside the conversation, so
# a nudge repeated that whole conversation and a never-valid agent cost twice the peer's
# requests; one for codex, whose turn has no correction of its own (issue 33).
DEFAULT_SCHEMA_RETRIES = {"claude": 0, "codex": 1}
REFUSED_CWD_PREFIXES = ("/proc", "/sys", "/dev")


class OptionError(ValueError):
    """Thrown into the script: the message names the option and the fault."""


@attrs.frozen
class AgentOptions:
    engine: str
    model: str | None
    effort: str | None
    profile: str
    schema: JsonObject | None
    max_usd: float | None
    max_tokens: int | None
    cwd: str | None            # None: the run's work dir
    label: str
    timeout_ms: int
    isolation: str | None = None
    base: str | None = None
    detail: bool = False
    schema_retries: int = 0
    placement: str = "local"   # where the CLI runs; not part of the journal key
    phase: str | None = None   # the progress group it is filed under; not part of the key
    agent_type: str | None = None
    # Options Claude Code's runtime takes that SwarmBase ignores (each said once in the run log,
    # with a "did you mean" for a near miss), and the tools the agent must not have.
    ignored: tuple[str, ...] = ()
    disallowed_tools: tuple[str, ...] = ()
    # A project agent type (.claude/agents/<name>.md): its body is the agent's system prompt,
    # its hash is in the key (an edited file re-runs on resume), and what the run log is told
    # about how the file was applied (tools narrowed, a model not allowed).
    system_prompt: str | None = None
    agent_file: str | None = None          # the file's sha256
    type_notes: tuple[str, ...] = ()

    def key_material(self, prompt: str, args_digest: str, workflow: str | None = None) -> str:
        """The content key of this call (before its occurrence index); a nested workflow's
        agents carry its path."""
        extra: JsonObject = {"isolation": self.isolation, "base": self.base} if self.isolation else {}
        if self.disallowed_tools:
            extra["disallowedTools"] = sorted(self.disallowed_tools)
        if self.agent_type is not None:
            extra["agentType"] = self.agent_type
        if self.agent_file is not None:
            extra["agentFile"] = self.agent_file
        return journal.base_key(engine=self.engine, model=self.model, profile=self.profile, effort=self.effort,
                                schema=self.schema, cwd=self.cwd, prompt=prompt, args_digest=args_digest,
                                workflow=workflow, **extra)


def _type(name: str, value: Json, kind: type | tuple[type, ...], what: str) -> None:
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise OptionError(f"agent(): opts.{name} must be {what}, got a boolean")
    if not isinstance(value, kind):
        raise OptionError(f"agent(): opts.{name} must be {what}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f"agent(): opts.{name} must be a finite number")


class NoRepository(OptionError):
    """A worktree agent with no repository to make its worktree from: fails that agent
    before any spend (and a run whose every worktree agent failed so is `failed`)."""


def pinned_cwd(path: str, roots: list[str]) -> str:
    """The realpath of `path` if it lies under one of `roots` (realpaths), else OptionError.
    Resolving first means a symlink pointing out of a root is refused; a refusal never says
    where the path resolves (that would map the host's filesystem for the script)."""
    if "\x00" in path or any(ord(c) < 32 for c in path) or len(path) > 4096:
        raise OptionError("agent(): opts.cwd must be a plain absolute path (no control characters, at most 4096)")
    if not os.path.isabs(path):
        raise OptionError(f"agent(): opts.cwd must be an absolute path, got {path[:200]!r}")
    refused = OptionError(f"agent(): opts.cwd {path[:200]!r} is not inside this caller's cwdRoots")
    if any(path == p or path.startswith(p + "/") for p in REFUSED_CWD_PREFIXES):
        raise refused
    real = os.path.realpath(path)
    for root in roots:
        if real == root or real.startswith(root.rstrip("/") + "/"):
            if not os.path.isdir(real):
                raise OptionError(f"agent(): opts.cwd {path[:200]!r} is not a directory")
            return real
    raise refused


def model_allowed(model: str, patterns: list[str] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(model, p) for p in patterns)


def ignored_option(name: str, known: tuple[str, ...]) -> str:
    """How the run log names an ignored option: `'retries'`, or `'modle' (did you mean 'model'?)`."""
    near = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or [k for k in known if k.lower() == name.lower()]
    return f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")


def unknown_option(what: str, name: Json, known: tuple[str, ...]) -> str:
    """The refusal of an unknown option, with a "did you mean" for a near miss."""
    text = str(name)[:100]
    near = difflib.get_close_matches(text, known, n=1, cutoff=0.6) or \
        [k for k in known if k.lower() == text.lower()]
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"{what}: unknown option {text!r}{hint} (known: {', '.join(known)})"


def resolve(prompt: str, opts: JsonObject, run: Run, caller: Caller, cfg: Config, n: int,
            default_timeout_ms: int, engines: Mapping[str, Engine], profile: str | None = None,
            phase_model: str | None = None, project_types: ProjectAgents = NO_PROJECT_AGENTS) -> AgentOptions:
    """`engines`: the daemon's engines by name (what each takes: schema size, models, token
    budget, placements). `profile`: the calling script's profile (a nested workflow's may
    be lower than the run's): the default for agents, and their ceiling besides the
    caller's maxProfile. `phase_model`: the model the agent's declared phase names
    (meta.phases[].model), the default before the run's for an engine that takes it.
    `project_types`: the run's project's agent types, read when the run started."""
    if not isinstance(prompt, str) or not prompt:
        raise OptionError("agent(): the prompt must be a non-empty string")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise OptionError(f"agent(): the prompt is {len(prompt):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    # As Claude Code's runtime does, an option it does not know is ignored, not refused (a
    # public script's `retries: 0` must run); the run log says so (agents.py).
    ignored = tuple(ignored_option(str(k)[:100], KNOWN) for k in opts if k not in KNOWN)
    engine = opts.get("engine", DEFAULT_ENGINE)
    if not any(cfg.engines.configured(e) for e in ENGINES):
        # Said first: "engine 'claude' is not allowed (allowed: none)" sent people to the
        # caller's list when the daemon has no agent CLI at all.
        raise OptionError(f"agent(): no agent CLI was found on this daemon; {NO_ENGINE_FIX}")
    if engine not in ENGINES:
        raise OptionError(f"agent(): opts.engine must be one of {', '.join(ENGINES)}, got {str(engine)[:100]!r}")
    if engine not in (caller.engines or []):
        raise OptionError(f"agent(): engine {engine!r} is not allowed for caller {caller.name!r} "
                          f"(allowed: {', '.join(caller.engines or []) or 'none'})")
    if not cfg.engines.configured(engine) or engine not in engines:
        raise OptionError(f"agent(): engine {engine!r} is not configured on this daemon")
    eng = engines[engine]
    agent_type = opts.get("agentType")
    type_file = _agent_type(agent_type, project_types) if agent_type is not None else None
    notes: list[str] = []
    allowed = caller.models.for_engine(engine)
    model = opts.get("model")
    if model is not None:
        _type("model", model, str, "a string")
        if not model or len(model) > 200:
            raise OptionError("agent(): opts.model must be 1-200 characters")
    else:
        model = eng.default_model(caller, run.model, phase_model)
        if type_file is not None and type_file.model is not None and engine == DEFAULT_ENGINE:
            # The file's model, by the full name its alias stands for (`sonnet`), when the
            # caller may use it; else the run's model, said in the run log (the file is the
            # project's, the allowlist the operator's).
            named = prices.ALIASES.get(type_file.model, type_file.model)
            if model_allowed(named, allowed):
                model = named
            else:
                notes.append(f"agent type {agent_type!r} names model {type_file.model!r}, which caller "
                             f"{caller.name!r} may not use; it runs on {model or eng.cli_default_model!r}")
    shown = model or eng.cli_default_model or ""
    if not model_allowed(shown, allowed):
        raise OptionError(f"agent(): model {shown!r} is not allowed for caller "
                          f"{caller.name!r} on {engine} (allowed: {', '.join(allowed or [])})")
    if (caller.usdPerDay is not None or caller.usdPerMonth is not None) and eng.price(model or None) is None:
        # An unpriced agent counts $0, so a USD quota would not bound it (issue 31 #6).
        raise OptionError(f"agent(): model {shown!r} on {engine} has no price row, and caller {caller.name!r} has "
                          f"a USD spend quota (usdPerDay/usdPerMonth) that an unpriced agent would pass uncounted; "
                          f"use a priced model, or add a `prices` row for {shown!r} to the daemon config")
    effort = opts.get("effort", run.effort)
    if effort is not None and effort not in EFFORTS:
        raise OptionError(f"agent(): opts.effort must be one of {', '.join(EFFORTS)}, got {str(effort)[:50]!r}")
    scope_profile = profile or run.profile
    type_ceiling = type_file.profile if type_file is not None else AGENT_TYPES.get(agent_type) if agent_type else None
    if type_file is not None and "profile" not in opts:
        # A project type gets the least profile its tools need, within the caller's
        # maxProfile (and a nested workflow's profile): never above, and said when narrowed.
        ceiling = caller.maxProfile if scope_profile == run.profile else \
            PROFILES[min(PROFILES.index(caller.maxProfile), PROFILES.index(scope_profile))]
        scope_default, narrowed = profile_within(type_file.profile, ceiling)
        if narrowed:
            notes.append(f"agent type {agent_type!r} ({type_file.path}) needs the {type_file.profile} profile for "
                         f"its tools; it runs as {scope_default}, the most this " +
                         ("caller's maxProfile" if ceiling == caller.maxProfile else "workflow's profile") + " allows")
    elif type_ceiling and "profile" not in opts and PROFILES.index(scope_profile) > PROFILES.index(type_ceiling):
        scope_default = type_ceiling
    else:
        scope_default = scope_profile
    profile = opts.get("profile", scope_default)
    if profile not in PROFILES:
        raise OptionError(f"agent(): opts.profile must be one of {', '.join(PROFILES)}, got {str(profile)[:50]!r}")
    if PROFILES.index(profile) > PROFILES.index(caller.maxProfile):
        raise OptionError(f"agent(): profile {profile!r} is above this caller's maxProfile {caller.maxProfile!r}")
    if scope_profile != run.profile and PROFILES.index(profile) > PROFILES.index(scope_profile):
        raise OptionError(f"agent(): profile {profile!r} is above this workflow's profile {scope_profile!r}")
    if type_ceiling and PROFILES.index(profile) > PROFILES.index(type_ceiling):
        raise OptionError(f"agent(): agentType {agent_type!r} is " +
                          (f"limited to {type_ceiling!r} by its tools" if type_file else "read-only") +
                          f"; profile {profile!r} is above {type_ceiling!r}")
    disallowed = opts.get("disallowedTools")
    if disallowed is not None:
        if not isinstance(disallowed, list) or not all(isinstance(t, str) and 0 < len(t) <= 200 for t in disallowed):
            raise OptionError("agent(): opts.disallowedTools must be an array of tool names")
        disallowed = tuple(dict.fromkeys(disallowed))
    # Only the script's own list lowers the profile: a type naming WebFetch alone keeps the
    # read profile that offers it, without Read, Grep and Glob.
    while disallowed and profile in PROFILE_OWN_TOOLS and set(PROFILE_OWN_TOOLS[profile]) <= set(disallowed):
        profile = PROFILES[PROFILES.index(profile) - 1]
    if type_file is not None and type_file.tools is not None:
        # The profile's tools the file does not name are not offered (the file's list is exact).
        unnamed = [t for own in PROFILE_OWN_TOOLS.values() for t in own if t not in type_file.tools]
        disallowed = tuple(dict.fromkeys([*(disallowed or ()), *unnamed]))
    schema = opts.get("schema")
    if schema is not None:
        _type("schema", schema, dict, "a JSON Schema object")
        size = len(json.dumps(schema))
        if size > eng.max_schema_bytes:
            raise OptionError(f"agent(): opts.schema is {size:,} bytes; the {engine} engine takes at most "
                              f"{eng.max_schema_bytes:,}")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise OptionError(f"agent(): opts.schema is not a valid JSON Schema: {e.message[:300]}") from None
        except RecursionError:
            raise OptionError("agent(): opts.schema is nested too deeply") from None
        object_root(schema)
    max_usd = opts.get("maxUsd")
    if max_usd is not None:
        _type("maxUsd", max_usd, (int, float), "a number")
        if max_usd <= 0:
            raise OptionError(f"agent(): opts.maxUsd must be above 0, got {max_usd}")
    max_tokens = opts.get("maxTokens")
    if max_tokens is not None:
        if eng.token_budget(None) is None:
            raise OptionError(f"agent(): opts.maxTokens applies to {' and '.join(TOKEN_BUDGETED)} agents only")
        _type("maxTokens", max_tokens, int, "a whole number")
        if max_tokens <= 0:
            raise OptionError(f"agent(): opts.maxTokens must be above 0, got {max_tokens}")
    cwd = opts.get("cwd")
    if cwd is not None:
        _type("cwd", cwd, str, "a string")
        if not cwd.startswith("/") and run.repository is not None:
            cwd = os.path.join(run.repository, cwd)     # relative: to the run's project, as in Claude Code
        cwd = pinned_cwd(cwd, caller.cwdRoots)
    elif run.repository is not None:
        cwd = run.repository          # pinned when the run started
    label = opts.get("label", f"agent {n}")
    _type("label", label, str, "a string")
    timeout_ms = opts.get("timeoutMs", default_timeout_ms)
    _type("timeoutMs", timeout_ms, int, "a whole number of milliseconds")
    if not 1_000 <= timeout_ms <= 24 * 3_600_000:
        raise OptionError(f"agent(): opts.timeoutMs must be between 1000 and 86400000, got {timeout_ms}")
    isolation = opts.get("isolation")
    if isolation is not None and isolation != "worktree":
        raise OptionError(f"agent(): opts.isolation must be 'worktree', got {str(isolation)[:50]!r}")
    if isolation == "worktree" and cwd is None:
        raise NoRepository("agent(): isolation: 'worktree' needs a git repository to make the worktree from, "
                           "and this run has no project: configure the caller's `projects` (a \"default\" one is "
                           "used by every run), start the run with `project`, or pass opts.cwd")
    phase = opts.get("phase")
    if phase is not None:
        _type("phase", phase, str, "a string (a progress group's title)")
        phase = phase[:500]
    base = opts.get("base")
    if base is not None:
        _type("base", base, str, "a string (a commit, branch or tag)")
        if isolation is None:
            raise OptionError("agent(): opts.base applies with isolation: 'worktree' only")
        if not base or len(base) > 200 or base.startswith("-") or any(ord(c) < 33 for c in base):
            raise OptionError(f"agent(): opts.base {base[:100]!r} is not a valid revision")
    detail = opts.get("detail", False)
    _type("detail", detail, bool, "true or false")
    retries = opts.get("schemaRetries", DEFAULT_SCHEMA_RETRIES.get(engine, 0))
    _type("schemaRetries", retries, int, "a whole number")
    if not 0 <= retries <= 3:
        raise OptionError(f"agent(): opts.schemaRetries must be between 0 and 3, got {retries}")
    placement = _placement(opts, engine, engines, cwd, caller, cfg)
    return AgentOptions(engine=engine, model=model, effort=effort, profile=profile, schema=schema,
                        max_usd=float(max_usd) if max_usd is not None else None, max_tokens=max_tokens,
                        cwd=cwd, label=label[:200], timeout_ms=timeout_ms, isolation=isolation, base=base,
                        detail=detail, schema_retries=retries, placement=placement, phase=phase,
                        agent_type=agent_type, ignored=ignored, disallowed_tools=disallowed or (),
                        system_prompt=type_file.prompt if type_file else None,
                        agent_file=type_file.sha256 if type_file else None, type_notes=tuple(notes))


def _agent_type(name: Json, project_types: ProjectAgents) -> AgentFile | None:
    """Claude Code's order: the project's `.claude/agents` first, then the built-in types
    (None: a built-in one). A malformed file fails the agents naming it with file:line."""
    _type("agentType", name, str, "a string")
    assert isinstance(name, str)
    try:
        found = project_types.find(name)
    except AgentFileError as e:
        raise OptionError(f"agent({{agentType}}): agent type {name[:100]!r} cannot be used: {e}") from None
    if found is None and name not in AGENT_TYPES:
        raise OptionError(f"agent({{agentType}}): agent type {name[:100]!r} not found. Available agents: "
                          f"{', '.join([*project_types.types, *AGENT_TYPES])}")
    return found


def object_root(schema: JsonObject) -> None:
    """Claude Code's rule: a schema's root is {type: 'object', properties: {...}} and its
    `required` names only listed properties (the StructuredOutput tool takes an object);
    anything else is refused before an agent starts and spends anything."""
    if schema.get("type") != "object":
        got = schema.get("type")
        raise OptionError("agent({schema}) received an unusable JSON Schema: its root must be {type: 'object', "
                          f"properties: {{...}}}} (its type is {json.dumps(got)[:60] if got is not None else 'missing'}); "
                          "wrap arrays or primitives in an object property. The agent was not started")
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if isinstance(props, dict) and isinstance(required, list):
        missing = [r for r in required if isinstance(r, str) and r not in props]
        if missing:
            raise OptionError(f"agent({{schema}}) received an unusable JSON Schema: it requires {missing[0][:100]!r}, "
                              "which is not in its properties. The agent was not started")


def _placement(opts: JsonObject, engine: str, engines: Mapping[str, Engine], cwd: str | None, caller: Caller,
               cfg: Config) -> str:
    allowed = caller.placements or ["local"]
    local_only = engines[engine].local_only
    if "placement" not in opts:
        chosen = cfg.default_placement(caller)
        # The default never sends an agent where it cannot run (codex stays on this machine).
        return "local" if chosen != "local" and local_only and "local" in allowed else chosen
    placement = opts["placement"]
    if placement not in PLACEMENTS:
        raise OptionError(f"agent(): opts.placement must be one of {', '.join(PLACEMENTS)}, got {str(placement)[:50]!r}")
    if placement not in allowed:
        raise OptionError(f"agent(): placement {placement!r} is not allowed for caller {caller.name!r} "
                          f"(allowed: {', '.join(allowed)})")
    ray = cfg.placement.ray
    if placement == "ray":
        if ray is None:
            raise OptionError("agent(): placement 'ray' is not configured on this daemon (placement.ray)")
        if local_only:
            anywhere = [name for name, e in engines.items() if not e.local_only]
            raise OptionError(f"agent(): placement 'ray' runs {' and '.join(anywhere)} agents only ({local_only})")
        if cwd is not None and not any(cwd == r or cwd.startswith(r.rstrip("/") + "/") for r in ray.sharedRoots):
            raise OptionError(f"agent(): opts.cwd {cwd[:200]!r} is not under placement.ray.sharedRoots; an agent "
                              "placed on Ray needs a cwd every node mounts at the same path")
    return placement
