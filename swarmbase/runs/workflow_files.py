"""Where a workflow named in `workflow('name')` or `run {name}` is found, in Claude Code's
order: the run's project's `.claude/workflows/<name>.js` (or a file there whose meta.name
is `name`), then the caller's saved workflows (the `save_workflow` tool's dir). A project's
workflow shadows a saved one of the same name, as Claude Code's project workflows shadow
the user's `~/.claude/workflows/`.

Pure but for reading the two dirs, which happens when a name is looked up or listed (not
at boot: a project's files change under it). A project's file is the project's agents'
work, so it is read as untrusted: a link that leaves the project, a FIFO or an oversized
file is refused, never followed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

import attrs

from ..jsonvalue import JsonObject
from ..script import meta as script_meta

WORKFLOWS_DIR = (".claude", "workflows")
# A saved workflow's file name: matched whole (fullmatch), since `$` also matches before a
# final newline and NAME.match("x\n") once let save_workflow write "x\n.js".
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_SOURCE_CHARS = 1_000_000
PROJECT, SAVED = "project", "saved"


class WorkflowFileError(ValueError):
    """Why a workflow file cannot be used; the caller says which call it was for."""


@attrs.frozen
class Found:
    name: str        # the file's name without .js (the saved name, or the project file's)
    script: str
    source: str      # PROJECT or SAVED


def read_text(f: BinaryIO) -> str:
    """An opened script file's text: a regular file, UTF-8, at most MAX_SOURCE_CHARS."""
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        raise WorkflowFileError("is not a regular file")
    data = f.read(MAX_SOURCE_CHARS * 4 + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkflowFileError("is not UTF-8 text") from None
    if len(data) > MAX_SOURCE_CHARS * 4 or len(text) > MAX_SOURCE_CHARS:
        raise WorkflowFileError(f"is larger than {MAX_SOURCE_CHARS:,} characters")
    return text


def _inside(top: str, path: str) -> bool:
    return os.path.commonpath([top, path]) == top


def read_project_file(project: str, file_name: str) -> str:
    """`.claude/workflows/<file_name>` of the project. A link is followed only while it stays
    inside the project: checked on the resolved path, and again on the file actually opened
    (its /proc/self/fd link), so a directory swapped for a link in between is caught too."""
    top = os.path.realpath(project)
    real = os.path.realpath(os.path.join(top, *WORKFLOWS_DIR, file_name))
    if not _inside(top, real):
        raise WorkflowFileError("is a link that leaves the project")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise WorkflowFileError("does not exist") from None
    except OSError as e:
        raise WorkflowFileError(f"cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not _inside(top, os.readlink(f"/proc/self/fd/{f.fileno()}")):
            raise WorkflowFileError("is a link that leaves the project")
        return read_text(f)


def _project_files(project: str) -> list[str]:
    """The `*.js` names in the project's workflows dir, sorted."""
    try:
        names = os.listdir(os.path.join(project, *WORKFLOWS_DIR))
    except OSError:          # no such dir (most projects), or not a dir
        return []
    return sorted(n for n in names if n.endswith(".js") and len(n) > 3)


def describe(name: str, text: str) -> JsonObject:
    """A listing's entry: name, size, first line, and what the meta block declares (name,
    description, whenToUse, phases), read without running the script."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    entry: JsonObject = {"name": name, "chars": len(text), "firstLine": first[:200]}
    meta = script_meta.describe(text)
    if meta:
        entry["meta"] = meta
        for key in ("description", "whenToUse"):
            if meta.get(key):
                entry[key] = meta[key]
    return entry


def saved_listing(saved: Path) -> list[JsonObject]:
    """The saved workflows in `saved` (the daemon's own dir: its files are trusted)."""
    out = []
    if saved.is_dir():
        for p in sorted(saved.glob("*.js")):
            try:
                out.append(describe(p.stem, p.read_text()))
            except (OSError, UnicodeDecodeError):
                continue
    return out


def project_listing(project: str | None) -> list[JsonObject]:
    """The project's workflows; a file that cannot be used is listed with its `error`."""
    if project is None:
        return []
    out = []
    for file_name in _project_files(project):
        shown = os.path.join(*WORKFLOWS_DIR, file_name)
        try:
            entry = describe(file_name[:-3], read_project_file(project, file_name))
        except WorkflowFileError as e:
            entry = {"name": file_name[:-3], "error": f"{shown} {e}"}
        out.append({**entry, "path": shown})
    return out


def _meta_name(entry: JsonObject) -> str | None:
    return (entry.get("meta") or {}).get("name")


def _by_meta_name(entries: list[JsonObject], name: str) -> str | None:
    return next((e["name"] for e in entries if _meta_name(e) == name), None)


def find_workflow(project: str | None, saved: Path, name: str) -> Found | None:
    """The workflow `name` in Claude Code's order: the project's file of that name, a project
    file whose meta.name it is, then the same two among the saved workflows. A project
    file of that name that cannot be used is an error (it is not skipped for a saved one)."""
    if project is not None:
        stem = name if f"{name}.js" in _project_files(project) else _by_meta_name(project_listing(project), name)
        if stem is not None:
            try:
                return Found(stem, read_project_file(project, f"{stem}.js"), PROJECT)
            except WorkflowFileError as e:
                raise WorkflowFileError(f"the project's {os.path.join(*WORKFLOWS_DIR, stem)}.js {e}") from None
    if NAME.fullmatch(name) and (saved / f"{name}.js").is_file():
        return Found(name, _read_saved(saved, name), SAVED)
    stem = _by_meta_name(saved_listing(saved), name)
    return Found(stem, _read_saved(saved, stem), SAVED) if stem is not None else None


def _read_saved(saved: Path, name: str) -> str:
    try:
        return (saved / f"{name}.js").read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkflowFileError(f"the saved workflow {name!r} cannot be read ({type(e).__name__})") from None


def all_workflows(project: str | None, saved: Path) -> list[JsonObject]:
    """Both, each marked with its `source`; a saved workflow whose name finds a project
    workflow first (the project's file name or meta.name) is marked `shadowed`."""
    ours = project_listing(project)
    hidden = {e["name"] for e in ours} | {_meta_name(e) for e in ours} - {None}
    listed: list[JsonObject] = [{**e, "source": PROJECT} for e in ours]
    for e in saved_listing(saved):
        listed.append({**e, "source": SAVED, **({"shadowed": True} if e["name"] in hidden else {})})
    return listed


def not_found(name: str, project: str | None, saved: Path) -> str:
    """The `run` tool's refusal of a name found nowhere, with the names there are."""
    return f"no workflow named {name[:100]!r} in {_looked_in(project)}. Available: {_available(project, saved)}"


def not_found_in_script(name: str, project: str | None, saved: Path) -> str:
    """workflow()'s: Claude Code's own words first (scripts test for them), then where it looked."""
    return (f"workflow('{name[:100]}'): no workflow with that name. Available: {_available(project, saved)} "
            f"(looked in {_looked_in(project)})")


def _looked_in(project: str | None) -> str:
    return ("the project's .claude/workflows or the saved workflows" if project is not None
            else "the saved workflows (this run has no project)")


def _available(project: str | None, saved: Path) -> str:
    names = list(dict.fromkeys(e["name"] for e in all_workflows(project, saved)))
    return ", ".join(names[:50]) or "(none)"
