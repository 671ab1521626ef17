"""Claude Code's read-only tools for an in-process read agent: schemas, path rules, result text.

Pure logic; the tools are executed by swarmbase/toolhost/read_host.py inside the agent's
sandbox. Names and input shapes follow the CLI package's published tool types
(`sdk-tools.d.ts`: FileReadInput, GrepInput, GlobInput) so a model trained on Claude Code
calls them the same way; result text follows the CLI's (`cat -n` numbered lines for Read,
"Found N files" for Grep's default mode).
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, NamedTuple

READ_DEFAULT_LIMIT = 2000      # lines, as the CLI's Read
READ_LINE_MAX = 2000           # characters per line before it is cut
GREP_HEAD_DEFAULT = 250        # entries, as the CLI's Grep head_limit default
GLOB_MAX = 100                 # paths, as the CLI's Glob

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"name": "Read",
     "description": "Reads a file from the local filesystem. file_path must be absolute. Lines are "
                    "returned numbered (cat -n); use offset and limit for large files.",
     "input_schema": {"type": "object", "additionalProperties": False, "required": ["file_path"],
                      "properties": {
                          "file_path": {"type": "string", "description": "The absolute path to the file to read"},
                          "offset": {"type": "number", "description": "The line number to start reading from"},
                          "limit": {"type": "number", "description": "The number of lines to read"},
                          "pages": {"type": "string", "description": "Page range for PDF files"},
                          "allow_large": {"type": "boolean"}}}},
    {"name": "Grep",
     "description": "Searches file contents with a regular expression (Python re syntax).",
     "input_schema": {"type": "object", "additionalProperties": False, "required": ["pattern"],
                      "properties": {
                          "pattern": {"type": "string"},
                          "path": {"type": "string"},
                          "glob": {"type": "string"},
                          "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                          "-B": {"type": "number"}, "-A": {"type": "number"}, "-C": {"type": "number"},
                          "context": {"type": "number"},
                          "-n": {"type": "boolean"}, "-i": {"type": "boolean"}, "-o": {"type": "boolean"},
                          "type": {"type": "string"},
                          "head_limit": {"type": "number"}, "offset": {"type": "number"},
                          "multiline": {"type": "boolean"}}}},
    {"name": "Glob",
     "description": "Finds files by glob pattern (e.g. \"**/*.py\"), most recently modified first.",
     "input_schema": {"type": "object", "additionalProperties": False, "required": ["pattern"],
                      "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}}},
]
TOOL_NAMES = frozenset(t["name"] for t in TOOL_SCHEMAS)

# The daemon's own records under its state dir, as engines/claude.py denies them to the CLI.
STATE_DENY = ("*.json", "*.json.*", "*.key", "*.token", "procs/**", "homes/**",
              "runs/*/agents/**", "runs/*/*.json", "runs/*/*.jsonl", "runs/*/script.js")


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A Claude Code rule glob as a regex: `**` spans directories, `*` and `?` do not; a
    pattern not starting with `/` may match at any directory depth (as `**/.env` does)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "{" and "}" in pattern[i:]:
            end = pattern.index("}", i)
            out.append("(?:" + "|".join(re.escape(a) for a in pattern[i + 1:end].split(",")) + ")")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    prefix = "" if pattern.startswith("/") else "(?:.*/)?"
    return re.compile(prefix + body + r"\Z", re.DOTALL)


class PathRules(NamedTuple):
    """Which paths a read agent may open: under one of `roots`, and no `deny` glob matching
    either the path as given or where its symlinks lead (a link in the work dir must not
    reach a credential). A NamedTuple, not attrs: the tool host imports this module in
    every sandbox, and attrs alone was a third of its start (~25 ms CPU)."""
    roots: tuple[str, ...]
    deny: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"roots": list(self.roots), "deny": list(self.deny)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> PathRules:
        return cls(roots=tuple(value["roots"]), deny=tuple(value.get("deny", ())))

    def allows(self, path: str) -> bool:
        return all(self._allows_one(p) for p in {os.path.normpath(path), os.path.realpath(path)})

    def _allows_one(self, path: str) -> bool:
        inside = any(path == r or path.startswith(r.rstrip("/") + "/") for r in self.roots)
        return inside and not any(glob_regex(d).match(path) for d in self.deny)


def read_rules(cwd: str, state_dir: str, user_home: str, secret_files: Iterable[str]) -> PathRules:
    """The same rules `claude -p` gets for a read agent (engines/claude.py argv/deny_rules)."""
    # Imported here: the tool host imports this module inside every sandbox and never builds
    # rules, so it should not pay for engines/claude.py's imports (jsonschema) at start.
    from .claude import CREDENTIAL_DIRS, CREDENTIAL_FILES
    deny = [os.path.join(user_home, d) + "/**" for d in CREDENTIAL_DIRS]
    deny += [os.path.join(user_home, d) for d in CREDENTIAL_DIRS]
    deny += list(CREDENTIAL_FILES)
    deny += [state_dir.rstrip("/") + "/" + pat for pat in STATE_DENY]
    deny += list(secret_files)
    return PathRules(roots=(os.path.normpath(cwd),), deny=tuple(deny))


def numbered(lines: list[str], first: int) -> str:
    """`cat -n` style, as the CLI's Read result: right-aligned number, tab, the line."""
    out = []
    for n, line in enumerate(lines, start=first):
        if len(line) > READ_LINE_MAX:
            line = line[:READ_LINE_MAX] + "… [line truncated]"
        out.append(f"{n:6}\t{line}")
    return "\n".join(out)


def read_text(text: str, offset: int | None, limit: int | None) -> str:
    lines = text.splitlines()
    if not lines:
        return "<system-reminder>Warning: the file exists but the contents are empty.</system-reminder>"
    first = max(1, int(offset or 1))
    count = int(limit) if limit else READ_DEFAULT_LIMIT
    part = lines[first - 1:first - 1 + count]
    if not part:
        return (f"<system-reminder>Warning: the file exists but is shorter than the provided offset "
                f"({first}). The file has {len(lines)} lines.</system-reminder>")
    return numbered(part, first)


def paged(items: list[str], head_limit: int | None, offset: int | None) -> list[str]:
    start = max(0, int(offset or 0))
    limit = GREP_HEAD_DEFAULT if head_limit is None else int(head_limit)
    return items[start:] if limit == 0 else items[start:start + limit]


def files_found(paths: list[str]) -> str:
    if not paths:
        return "No files found"
    return f"Found {len(paths)} file{'s' if len(paths) != 1 else ''}\n" + "\n".join(paths)
