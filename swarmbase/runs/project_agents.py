"""A project's agent types: `.claude/agents/<name>.md`, as Claude Code reads them.

A file is YAML-ish front matter between two `---` lines (name, description, tools, model;
other keys, such as color, are Claude Code's display hints and are ignored) and a body,
the agent's system prompt. Only the subset of YAML these files use is read — `key: value`,
a comma list, a flow list `[a, b]` or a block list of `- item` lines — so a file that is
not that fails with its file and line instead of meaning something else.

Pure: `parse` turns text into an AgentFile; `scan` reads a project's directory once (when a
run starts: the hashes pin what its agents saw, so an edited file re-runs on resume).
`runs/agent_opts.resolve` looks a call's `agentType` up here before the built-in types.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import attrs

from ..config import PROFILES

AGENTS_DIR = (".claude", "agents")
MAX_FILE_BYTES = 256 * 1024
# Claude Code's tool names by the least profile that offers them: a file whose tools need
# no more than `read` runs as a read agent (never above the caller's maxProfile).
WRITE_TOOLS = frozenset({"Bash", "Edit", "MultiEdit", "Write", "NotebookEdit"})
READ_TOOLS = frozenset({"Read", "Grep", "Glob", "LS", "NotebookRead", "WebFetch", "WebSearch"})


class AgentFileError(ValueError):
    """`<file>:<line>: <what is wrong>`: thrown into the agents that name the type."""


@attrs.frozen
class AgentFile:
    name: str
    description: str
    tools: tuple[str, ...] | None      # None: the field is absent, every tool (Claude Code's rule)
    model: str | None                  # None or "inherit": the run's model
    prompt: str
    path: str
    sha256: str

    @property
    def profile(self) -> str:
        """The least profile that offers every tool the file names."""
        if self.tools is None or WRITE_TOOLS.intersection(self.tools):
            return "write"
        return "read" if READ_TOOLS.intersection(self.tools) else "think"


def profile_within(wanted: str, ceiling: str) -> tuple[str, bool]:
    """(the profile an agent gets, whether that narrowed what its file asked for)."""
    if PROFILES.index(wanted) > PROFILES.index(ceiling):
        return ceiling, True
    return wanted, False


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _items(value: str, where: str) -> tuple[str, ...]:
    if value.startswith("["):
        if not value.endswith("]"):
            raise AgentFileError(f"{where}: a list that starts with [ must end with ]")
        value = value[1:-1]
    return tuple(_unquote(v.strip()) for v in value.split(",") if v.strip())


def parse(text: str, path: str) -> AgentFile:
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        raise AgentFileError(f"{path}:1: an agent file starts with a '---' line (front matter)")
    fields: dict[str, str | tuple[str, ...]] = {}
    key_line: dict[str, int] = {}
    block: str | None = None           # the key whose '- item' lines follow (only `tools:` with no value)
    end = None
    for i, raw in enumerate(lines[1:], start=2):
        line = raw.rstrip()
        if line.strip() == "---":
            end = i
            break
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("- "):
            if block is None:
                raise AgentFileError(f"{path}:{i}: a '- item' line belongs under 'tools:' with no value")
            listed = fields[block]
            assert isinstance(listed, tuple)
            fields[block] = (*listed, _unquote(line.lstrip()[2:].strip()))
            continue
        if ":" not in line or line[0].isspace():
            raise AgentFileError(f"{path}:{i}: expected 'key: value', got {line.strip()[:80]!r}")
        key, value = line.split(":", 1)
        key, value = key.strip(), value.strip()
        if key in fields:
            raise AgentFileError(f"{path}:{i}: {key!r} is given twice")
        fields[key] = _items(value, f"{path}:{i}") if key == "tools" else _unquote(value)
        block = key if key == "tools" and not value else None
        key_line[key] = i
    if end is None:
        raise AgentFileError(f"{path}:1: the front matter has no closing '---' line")
    for required in ("name", "description"):
        given = fields.get(required)
        if not isinstance(given, str) or not given:
            raise AgentFileError(f"{path}:{key_line.get(required, 1)}: front matter needs a {required!r}")
    tools = fields.get("tools")
    model = fields.get("model")
    if isinstance(model, tuple):
        raise AgentFileError(f"{path}:{key_line['model']}: 'model' is one name, not a list")
    return AgentFile(name=str(fields["name"]), description=str(fields["description"]),
                     tools=tools if isinstance(tools, tuple) else None,
                     model=None if model in (None, "", "inherit") else str(model),
                     prompt="\n".join(lines[end:]).strip(), path=path,
                     sha256=hashlib.sha256(text.encode()).hexdigest())


@attrs.frozen
class ProjectAgents:
    """What a project's `.claude/agents` held when the run started."""
    types: dict[str, AgentFile]
    broken: dict[str, AgentFileError]     # file stem -> why: agents naming it fail with this

    def find(self, name: str) -> AgentFile | None:
        """The type `name`; AgentFileError when the file that would define it is malformed."""
        if name in self.types:
            return self.types[name]
        if name in self.broken:
            raise self.broken[name]
        return None


NO_PROJECT_AGENTS = ProjectAgents({}, {})


def scan(project: Path) -> ProjectAgents:
    """Read every `*.md` of the project's agents dir. A file that is a symlink leaving the
    project, too large or unreadable is broken, not skipped: an agent naming it says why."""
    folder = project.joinpath(*AGENTS_DIR)
    types: dict[str, AgentFile] = {}
    broken: dict[str, AgentFileError] = {}
    try:
        entries = sorted(folder.glob("*.md"))
    except OSError:
        return ProjectAgents({}, {})
    top = os.path.realpath(project)
    for entry in entries:
        shown = os.path.join(*AGENTS_DIR, entry.name)
        try:
            real = os.path.realpath(entry)
            if os.path.commonpath([top, real]) != top:
                raise AgentFileError(f"{shown}:1: a link that leaves the project")
            with open(real, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                raise AgentFileError(f"{shown}:1: larger than {MAX_FILE_BYTES // 1024} KiB")
            agent = parse(data.decode("utf-8", errors="replace"), shown)
        except AgentFileError as e:
            broken[entry.stem] = e
            continue
        except OSError as e:
            broken[entry.stem] = AgentFileError(f"{shown}:1: cannot read it: {e.strerror}")
            continue
        if agent.name in types:
            broken[agent.name] = AgentFileError(f"{shown}:1: agent type {agent.name!r} is also defined by "
                                                f"{types.pop(agent.name).path}")
        elif agent.name not in broken:
            types[agent.name] = agent
    return ProjectAgents(types, broken)
