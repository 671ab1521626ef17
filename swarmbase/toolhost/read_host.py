"""The read agent's tool host: executes Read, Grep and Glob inside the agent's sandbox.

Run as `python -m swarmbase.toolhost.read_host` under the same launch spec a read agent's
`claude -p` gets (the caller's sandbox identity, the agent's mounts, no network), so a
file is never opened with the daemon's privileges: the kernel refuses what the identity
may not read, and the profile's path rules (engines/read_tools.PathRules) refuse the rest.

JSON lines on stdin/stdout. The first line is `{"rules": {...}, "cwd": "...", "tools": [...]}`
(`tools`: the names offered to the model; others are refused as unknown); each later
line is one tool call `{"id", "name", "input"}` and gets one answer
`{"id", "content", "is_error"}`, in order. EOF on stdin ends the host.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import sys
from typing import IO, Any, Callable, Iterator

from ..engines import read_tools
from ..engines.read_tools import PathRules

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__"}
GREP_FILE_MAX = 16 * 1024 * 1024  # bytes; larger files are skipped, as a search would stall on them
RESULT_MAX = 100_000              # characters of one result (~25,000 tokens, the CLI's Read limit)
TYPES = {"py": ("*.py", "*.pyi"), "js": ("*.js", "*.mjs", "*.cjs", "*.jsx"), "ts": ("*.ts", "*.tsx"),
         "rust": ("*.rs",), "go": ("*.go",), "java": ("*.java",), "c": ("*.c", "*.h"),
         "cpp": ("*.cpp", "*.cc", "*.hpp", "*.h"), "md": ("*.md",), "json": ("*.json",),
         "yaml": ("*.yaml", "*.yml"), "toml": ("*.toml",), "sh": ("*.sh",), "html": ("*.html",)}


class ToolError(Exception):
    """A failure the model should see as the tool's result (is_error), not a host crash."""


class Tools:
    def __init__(self, rules: PathRules, cwd: str, offered: frozenset[str] = read_tools.TOOL_NAMES) -> None:
        self.rules = rules
        self.cwd = cwd
        self.offered = offered

    def _path(self, value: Any, *, default_cwd: bool = False) -> str:
        if value is None and default_cwd:
            return self.cwd
        if not isinstance(value, str) or not value:
            raise ToolError("path must be a non-empty string")
        path = value if os.path.isabs(value) else os.path.join(self.cwd, value)
        path = os.path.normpath(path)
        if not self.rules.allows(path):
            raise ToolError(f"Permission to read {value} has been denied.")
        return path

    def read(self, inp: dict[str, Any]) -> str:
        path = self._path(inp.get("file_path"))
        if os.path.isdir(path):
            raise ToolError(f"EISDIR: illegal operation on a directory, read '{path}'")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise ToolError(f"File does not exist. Current working directory: {self.cwd}") from None
        except OSError as e:
            raise ToolError(f"{e.strerror}: {path}") from None
        out = read_tools.read_text(data.decode("utf-8", "replace"), inp.get("offset"), inp.get("limit"))
        if len(out) > RESULT_MAX:
            raise ToolError(f"File content (~{len(out) // 4} tokens) exceeds maximum allowed tokens "
                            f"({RESULT_MAX // 4}). Please use offset and limit parameters to read specific "
                            "portions of the file, or use the Grep tool to search for specific content.")
        return out

    def _walk(self, top: str) -> Iterator[str]:
        if os.path.isfile(top):
            yield top
            return
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and self.rules.allows(os.path.join(root, d)))
            for name in sorted(files):
                p = os.path.join(root, name)
                if self.rules.allows(p):
                    yield p

    def grep(self, inp: dict[str, Any]) -> str:
        top = self._path(inp.get("path"), default_cwd=True)
        flags = re.IGNORECASE if inp.get("-i") else 0
        if inp.get("multiline"):
            flags |= re.DOTALL | re.MULTILINE
        try:
            rx = re.compile(str(inp.get("pattern", "")), flags)
        except re.error as e:
            raise ToolError(f"Invalid regular expression: {e}") from None
        wanted = file_filter(inp.get("glob"), inp.get("type"))
        mode = inp.get("output_mode") or "files_with_matches"
        before = int(inp.get("-B") or inp.get("-C") or inp.get("context") or 0)
        after = int(inp.get("-A") or inp.get("-C") or inp.get("context") or 0)
        entries: list[str] = []
        matched: list[tuple[float, str]] = []
        total = 0
        for path in self._walk(top):
            if not wanted(os.path.relpath(path, top) if path != top else os.path.basename(path)):
                continue
            text = text_of(path)
            if text is None:
                continue
            if mode == "files_with_matches":
                if rx.search(text):
                    matched.append((mtime(path), path))
                continue
            if mode == "count":
                n = sum(1 for _ in rx.finditer(text))
                if n:
                    total += n
                    entries.append(f"{path}:{n}")
                continue
            entries += content_lines(path, text, rx, before, after, bool(inp.get("-o")), inp.get("-n", True))
        head, skip = inp.get("head_limit"), inp.get("offset")
        if mode == "files_with_matches":
            paths = [p for _, p in sorted(matched, key=lambda m: (-m[0], m[1]))]
            return read_tools.files_found(read_tools.paged(paths, head, skip))
        shown = read_tools.paged(entries, head, skip)
        if mode == "count":
            if not shown:
                return "No matches found"
            return "\n".join(shown) + f"\n\nFound {total} total occurrences across {len(entries)} files."
        return "\n".join(shown) if shown else "No matches found"

    def glob(self, inp: dict[str, Any]) -> str:
        top = self._path(inp.get("path"), default_cwd=True)
        pattern = inp.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("pattern must be a non-empty string")
        rx = read_tools.glob_regex(pattern if pattern.startswith("/") else os.path.join(top, pattern))
        hits = sorted(((mtime(p), p) for p in self._walk(top) if rx.match(p)), key=lambda m: (-m[0], m[1]))
        paths = [p for _, p in hits]
        out = read_tools.files_found(paths[:read_tools.GLOB_MAX]).split("\n", 1)
        if len(out) == 1:
            return out[0]
        tail = "\n(Results are truncated. Consider using a more specific path or pattern.)" \
            if len(paths) > read_tools.GLOB_MAX else ""
        return out[1] + tail

    def call(self, name: str, inp: dict[str, Any]) -> str:
        table: dict[str, Callable[[dict[str, Any]], str]] = {"Read": self.read, "Grep": self.grep, "Glob": self.glob}
        if name not in table or name not in self.offered:
            raise ToolError(f"No such tool available: {name}")
        if not isinstance(inp, dict):
            raise ToolError("tool input must be an object")
        out = table[name](inp)
        if len(out) > RESULT_MAX:        # a search's results: cut, and said so
            out = out[:RESULT_MAX] + "\n(Results are truncated. Consider using a more specific path or pattern.)"
        return out


def mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def text_of(path: str) -> str | None:
    """The file's text, or None for what a search skips (unreadable, binary, huge)."""
    try:
        if os.path.getsize(path) > GREP_FILE_MAX:
            return None
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def file_filter(glob: Any, kind: Any) -> Callable[[str], bool]:
    pats: list[str] = []
    if isinstance(glob, str) and glob:
        pats += expand_braces(glob)
    if isinstance(kind, str) and kind:
        pats += list(TYPES.get(kind, (f"*.{kind}",)))

    def wanted(rel: str) -> bool:
        if not pats:
            return True
        base = os.path.basename(rel)
        return any(fnmatch.fnmatchcase(base if "/" not in p else rel, p) for p in pats)
    return wanted


def expand_braces(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",")
            for x in expand_braces(pattern[:m.start()] + alt + pattern[m.end():])]


def content_lines(path: str, text: str, rx: re.Pattern[str], before: int, after: int,
                  only: bool, numbers: Any) -> list[str]:
    lines = text.splitlines()
    out: list[str] = []
    shown: set[int] = set()
    for i, line in enumerate(lines):
        if not rx.search(line):
            continue
        if only:
            out += [f"{path}:{i + 1}:{m.group(0)}" if numbers else f"{path}:{m.group(0)}"
                    for m in rx.finditer(line) if m.group(0)]
            continue
        for j in range(max(0, i - before), min(len(lines), i + after + 1)):
            if j in shown:
                continue
            shown.add(j)
            sep = ":" if j == i or rx.search(lines[j]) else "-"
            out.append(f"{path}{sep}{j + 1}{sep}{lines[j]}" if numbers else f"{path}{sep}{lines[j]}")
    return out


def serve(inp: IO[str], out: IO[str]) -> None:
    first = inp.readline()
    if not first:
        return
    setup = json.loads(first)
    tools = Tools(PathRules.from_json(setup["rules"]), setup["cwd"],
                  frozenset(setup.get("tools", read_tools.TOOL_NAMES)))
    for line in inp:
        if not line.strip():
            continue
        call = json.loads(line)
        try:
            answer = {"id": call.get("id"), "content": tools.call(str(call.get("name")), call.get("input")),
                      "is_error": False}
        except ToolError as e:
            answer = {"id": call.get("id"), "content": f"<tool_use_error>{e}</tool_use_error>", "is_error": True}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main() -> None:
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
