"""The `run` tool's arguments as what the supervisor starts: Claude Code's Workflow call
shape `{script | scriptPath | name, args, resumeFromRunId, title, description}` beside
SwarmBase's own parameters, so a resident's habitual Workflow call works unchanged.

- The script comes from `script`, else the file at `scriptPath` (under the caller's
  cwdRoots), else the workflow `name` (a file name or a meta.name) of the run's project's
  `.claude/workflows/`, else of the caller's saved workflows — Claude Code's precedence
  when more than one is given, and its order of lookup.
- `title` is the run's label (unless `label` is given too) and `description` its
  description; Claude Code ignores both, SwarmBase shows them.
- `resumeFromRunId` resumes that run: with a script (edited or not) the new script runs
  against the old journal and every call it still makes the same way replays; without
  one, the old run's script runs again.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from ..config import Caller
from ..jsonvalue import JsonObject
from .run_opts import RunRefused, project_of
from .workflow_files import WorkflowFileError, find_workflow, not_found
from .workflows import WorkflowError, read_script_file, saved_dir

# Passed to the supervisor as they are.
PASSED = ("args", "label", "model", "effort", "profile", "budgetUsd", "budgetTokens", "keepWork", "timeoutMs",
          "budgetWarnAt", "description", "repository", "project", "tokenTarget", "notify")


@attrs.frozen
class RunCall:
    params: JsonObject
    resume_from: str | None = None


def from_tool(a: JsonObject, caller: Caller, state_dir: Path) -> RunCall:
    params = {k: a[k] for k in PASSED if k in a}
    if "title" in a and "label" not in a:
        params["label"] = a["title"]
    script = _script(a, caller, state_dir)
    if script is not None:
        params["script"] = script
    resume = a.get("resumeFromRunId")
    if script is None and resume is None:
        raise RunRefused("provide the script: `script` (its text), `scriptPath` (a file under your cwdRoots) or "
                         "`name` (a project's or saved workflow; see the workflows tool), or `resumeFromRunId`")
    return RunCall(params=params, resume_from=resume)


def _script(a: JsonObject, caller: Caller, state_dir: Path) -> str | None:
    if "script" in a:
        return a["script"]
    if "scriptPath" in a:
        try:
            return read_script_file(a["scriptPath"], caller.cwdRoots)
        except WorkflowError as e:
            raise RunRefused(str(e)) from None
    if "name" in a:
        # The project the run will work in (`project` wins over its older name, as in run_opts.asked).
        _, project = project_of(caller, a["project"] if a.get("project") is not None else a.get("repository"))
        saved = saved_dir(state_dir, caller.name)
        try:
            found = find_workflow(project, saved, a["name"])
        except WorkflowFileError as e:
            raise RunRefused(str(e)) from None
        if found is None:
            raise RunRefused(not_found(a["name"], project, saved))
        return found.script
    return None
