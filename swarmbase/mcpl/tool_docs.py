"""The tool schemas as a caller's model reads them: every property described, with its
default and its bounds, in that caller's own values. Pure.

A model only knows what `tools/list` tells it. `run.budgetUsd` used to say nothing of the
$5 it defaults to or the $25 past which a run is refused, so a model guessed, and a guess
above runUsdMax came back as a refusal. Here each property gets:

- what it means (MEANING, else the schema's own description);
- its default (DEFAULTS, a function of the caller and the daemon's config), also set as the
  JSON Schema `default` annotation when it is a plain value;
- its bounds, written out from the schema's own keywords (so they cannot drift from what
  validation enforces) plus the caller's policy limits (POLICY), which are refusals, not
  schema errors.

tools.py keeps the schemas that validate; this only adds text, per caller, when a host
lists the tools.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from .. import money, progress_notice
from ..config import Caller, Config

Describe = Callable[[Caller, Config], Any]


def _ms(ms: int) -> str:
    return f"{ms:,} ms ({ms / 3_600_000:g} h)" if ms >= 3_600_000 else f"{ms:,} ms"


def _model(c: Caller, cfg: Config) -> str:
    if c.defaultModels.claude:
        return f"{c.defaultModels.claude} (your defaultModels.claude)"
    return "the Claude Code CLI's own default"


MEANING: dict[tuple[str, str], str] = {
    ("run", "script"): ("The script: the body of an async function (top-level await and return), in Claude Code's "
                        "Workflow language plus SwarmBase's extras"),
    ("run", "scriptPath"): ("Instead of script: an absolute path to a script file under your cwdRoots (the file at "
                            "most 1,000,000 characters); script wins if both are given"),
    ("run", "name"): ("Instead of script: a workflow's name (a file name without .js, or its meta.name), looked "
                      "up as Claude Code does: the project's .claude/workflows/ first, then your saved workflows "
                      "(save_workflow); see the workflows tool"),
    ("workflows", "project"): ("The project whose .claude/workflows/ is listed beside your saved workflows: one of "
                               "your projects by name, or a directory under your cwdRoots"),
    ("run", "resumeFromRunId"): ("Resume this ended run: with a script, every agent() call it makes as before "
                                 "replays from that run's journal; without one, that run's script runs again"),
    ("run", "title"): "The run's label (Claude Code's name for it; label wins if both are given)",
    ("run", "description"): "What the run is for, kept and shown with it",
    ("run", "project"): ("The project this run works in, as a Claude Code session works in its directory: the "
                         "name of one of your configured projects, or a directory (a git repository or not) under "
                         "your cwdRoots. It is every agent's default cwd, the base of a relative opts.cwd, and the "
                         "repository isolation: 'worktree' makes its worktrees from"),
    ("run", "repository"): "The older name of project (project wins if both are given)",
    ("run", "tokenTarget"): ("The run's token target, budget.total in the script: output tokens the run's agents "
                             "may spend; agent() throws once they are spent"),
    ("run", "profile"): "Default profile of the run's agents: think (no tools), read, or write (edits and Bash)",
    ("run", "timeoutMs"): "The run's wall-clock limit, in milliseconds",
    ("run", "budgetWarnAt"): "Fraction of budgetUsd at which spent + reserved sends one budget-warning notice",
    ("run", "notify"): ("Progress notices before the end notice: \"phase\" when a phase of the script ends, "
                        "\"failures\" on the run's first failed agent; tagged swarmbase:progress (no need to wake), "
                        "coalesced: at most one waiting per run, one per "
                        f"{progress_notice.MIN_INTERVAL_S:g} s per run. Resume keeps it"),
    ("resume", "args"): "New args for the script (calls that depend on them run again)",
    ("run", "label"): "A name for the run in list, status, notices and the dashboard",
    ("run", "effort"): "Default reasoning effort for the run's agents (an agent's opts.effort overrides it)",
    ("run", "budgetUsd"): "The run's USD budget: agents reserve from it and agent() throws once it is spent",
    ("run", "budgetTokens"): "The run's token budget for codex agents (each reserves its maxTokens ceiling from it)",
    ("status", "logLines"): "How many of the newest log lines to include",
    ("result", "offset"): "Character offset of the page in the return value's JSON text",
    ("result", "limit"): "Characters per page",
    ("list", "limit"): "How many runs to return, newest first",
    ("list", "status"): "Only runs in this status; \"archived\": the runs retention archived, whatever their status",
    ("guide", "topic"): "One section of the reference",
    ("save_workflow", "name"): "The workflow's name, used as workflow({name}) in scripts",
    ("save_workflow", "script"): "The workflow's script: the body of an async function, like run's script",
    ("usage", "from"): "First UTC day, YYYY-MM-DD, inclusive",
    ("usage", "to"): "Last UTC day, YYYY-MM-DD, inclusive",
}

def _project(c: Caller) -> str:
    found = c.default_project()
    if found is not None:
        return f"your project {found[0]!r} ({found[1]})"
    if c.projects:
        return ("none: you have several projects and none is named \"default\", so name one "
                f"({', '.join(sorted(c.projects))}); without one agents work in the run's own empty work dir")
    return "none: you have no project configured, so agents work in the run's own empty work dir"


DEFAULTS: dict[tuple[str, str], Describe] = {
    ("run", "script"): lambda c, cfg: "none; one of script, scriptPath, name or resumeFromRunId is needed",
    ("run", "scriptPath"): lambda c, cfg: "none",
    ("run", "name"): lambda c, cfg: "none",
    ("run", "resumeFromRunId"): lambda c, cfg: "none (a fresh run)",
    ("run", "title"): lambda c, cfg: "the script's meta.name, else its leading // comment line, else \"untitled\"",
    ("run", "description"): lambda c, cfg: "none",
    ("run", "project"): lambda c, cfg: _project(c),
    ("run", "repository"): lambda c, cfg: "none (see project)",
    ("workflows", "project"): lambda c, cfg: (f"your project {found[0]!r}" if (found := c.default_project())
                                              else "none: only your saved workflows are listed"),
    ("run", "tokenTarget"): lambda c, cfg: "none (budget.total is null)",
    ("run", "args"): lambda c, cfg: None,
    ("run", "label"): lambda c, cfg: "the script's meta.name, else its leading // comment line, else \"untitled\"",
    ("run", "model"): lambda c, cfg: _model(c, cfg),
    ("run", "effort"): lambda c, cfg: "the agent CLI's own",
    ("run", "profile"): lambda c, cfg: "read" if c.maxProfile != "think" else "think",
    ("run", "budgetUsd"): lambda c, cfg: c.runUsdDefault,
    ("run", "budgetTokens"): lambda c, cfg: c.runTokensDefault,
    ("run", "keepWork"): lambda c, cfg: not cfg.deleteWorkOnEnd,
    ("run", "timeoutMs"): lambda c, cfg: min(cfg.runTimeoutMs, c.runTimeoutMaxMs),
    ("run", "budgetWarnAt"): lambda c, cfg: c.budgetWarnAt,
    ("run", "notify"): lambda c, cfg: "none ([]: only the end notice)",
    ("status", "logLines"): lambda c, cfg: 20,
    ("result", "offset"): lambda c, cfg: 0,
    ("result", "limit"): lambda c, cfg: 20_000,
    ("resume", "args"): lambda c, cfg: "the resumed run's args",
    ("list", "limit"): lambda c, cfg: 20,
    ("list", "status"): lambda c, cfg: "every status",
    ("guide", "topic"): lambda c, cfg: "the whole reference",
    ("usage", "from"): lambda c, cfg: "29 days before `to`",
    ("usage", "to"): lambda c, cfg: "today (UTC)",
}

# The caller's policy: values above these are refused with a tool error naming the limit.
POLICY: dict[tuple[str, str], Describe] = {
    ("run", "budgetUsd"): lambda c, cfg: f"at most {money.usd(c.runUsdMax)} (your runUsdMax; the default is "
                                          f"your runUsdDefault)" + _quota(c),
    ("run", "budgetTokens"): lambda c, cfg: f"at most {c.runTokensMax:,} (your runTokensMax; the default is your "
                                             f"runTokensDefault)",
    ("run", "timeoutMs"): lambda c, cfg: f"at most {_ms(c.runTimeoutMaxMs)} (your runTimeoutMaxMs; the default is "
                                          f"the daemon's runTimeoutMs)",
    ("run", "profile"): lambda c, cfg: f"at most your maxProfile, {c.maxProfile!r}",
    ("run", "model"): lambda c, cfg: ("one of your allowed models: " + ", ".join(c.models.claude))
    if c.models.claude is not None else "",
    ("run", "budgetWarnAt"): lambda c, cfg: "the default is your budgetWarnAt",
}



def _quota(c: Any) -> str:
    limits = [f"{k} {money.usd(v)}" for k, v in (("usdPerDay", c.usdPerDay), ("usdPerMonth", c.usdPerMonth))
              if v is not None]
    if not limits:
        return ""
    return (f", and it must fit what is left of your spend quota ({', '.join(limits)}, UTC; a run reserves its "
            f"whole budget from it while it runs; the usage tool shows what is left and when it resets)")


MONEY = {("run", "budgetUsd")}
MILLISECONDS = {("run", "timeoutMs")}


def _value_text(tool: str, prop: str, v: Any) -> str:
    if (tool, prop) in MONEY and isinstance(v, (int, float)):
        return money.usd(v)
    if (tool, prop) in MILLISECONDS and isinstance(v, int):
        return _ms(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def bounds(schema: dict[str, Any]) -> list[str]:
    """The schema's own limits, in words."""
    out = []
    if "enum" in schema:
        out.append("one of " + ", ".join(str(v) for v in schema["enum"]))
    items = schema.get("items")
    if isinstance(items, dict) and "enum" in items:
        out.append("a list of " + ", ".join(str(v) for v in items["enum"])
                   + (", each at most once" if schema.get("uniqueItems") else ""))
    lo = ("at least", schema["minimum"]) if "minimum" in schema else \
        ("more than", schema["exclusiveMinimum"]) if "exclusiveMinimum" in schema else None
    hi = ("at most", schema["maximum"]) if "maximum" in schema else \
        ("less than", schema["exclusiveMaximum"]) if "exclusiveMaximum" in schema else None
    for bound in (lo, hi):
        if bound is not None:
            word, v = bound
            out.append(f"{word} {v:,}" if isinstance(v, int) else f"{word} {v:g}")
    if "minLength" in schema or "maxLength" in schema:
        out.append(f"{schema.get('minLength', 0):,} to {schema['maxLength']:,} characters"
                   if "maxLength" in schema else f"at least {schema['minLength']:,} characters")
    if "pattern" in schema:
        out.append(f"matching /{schema['pattern']}/")
    return out


def describe_property(tool: str, prop: str, schema: dict[str, Any], required: bool,
                      caller: Caller, cfg: Config) -> dict[str, Any]:
    out = dict(schema)
    key = (tool, prop)
    base = MEANING.get(key) or schema.get("description") or prop
    parts = [base.rstrip(".")]
    if required:
        parts.append("Required")
    elif key in DEFAULTS:
        v = DEFAULTS[key](caller, cfg)
        parts.append(f"Default: {_value_text(tool, prop, v)}")
        if v is None or isinstance(v, (bool, int, float)):
            out["default"] = v                      # the JSON Schema annotation, for hosts that show it
    limits = bounds(schema)
    policy = POLICY[key](caller, cfg) if key in POLICY else ""
    if policy:
        limits.append(policy)
    if limits:
        text = "; ".join(limits)
        parts.append(text[:1].upper() + text[1:])
    out["description"] = ". ".join(parts) + "."
    return out


def for_caller(tools: list[dict[str, Any]], caller: Caller, cfg: Config) -> list[dict[str, Any]]:
    """The tools as listed to this caller: every property described (default, bounds)."""
    listed = []
    for tool in tools:
        t = copy.deepcopy(tool)
        schema = t["inputSchema"]
        required = set(schema.get("required", []))
        schema["properties"] = {name: describe_property(t["name"], name, prop, name in required, caller, cfg)
                                for name, prop in schema.get("properties", {}).items()}
        listed.append(t)
    return listed
