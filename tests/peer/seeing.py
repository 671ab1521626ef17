"""The deterministic fake, made to see what the agent sees: an answer that depends on the
files the agent could read, so an agent started in the wrong directory (an empty work dir
instead of the project, the wrong worktree) changes the script's result.

A task that names project files (a path-like word ending in a known extension, e.g.
`src/calc.py`, `.claude/agents/executor.md`) makes the agent's first turn one `Read` tool
call per file, each an absolute path under the agent's own working directory (the
`Working directory:` line of the system prompt Claude Code gives every agent, the peer's
subagents and SwarmBase's `claude -p` alike). Read is the tool both runtimes' agents
have (the peer's subagents have no Glob or Grep). The next turn answers with a `seen:`
digest of what came back: per file, a short hash of its text (the Read tool's line-number
prefixes removed), or `missing` when the tool said it is not there. With a schema the digest
seeds the StructuredOutput value, so a structured answer changes too.

A task naming no file is answered as DeterministicModel answers it (tests/peer/model.py).
Every agent is recorded once in `subagent_requests` (its first request), whatever number of
turns its reads take.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import attrs

from ..fakes.anthropic_api import tool_results
from .model import DeterministicModel, answer_text, output_tokens, task_text, value_for

FILES = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|txt|toml|json|js|cfg))\b")
WORKDIR = re.compile(r"Primary working directory: ([^\s\\\"]+)")
LINE_PREFIX = re.compile(r"^\s*\d+[\t→]", re.M)
SO_ID = "toolu_so"


def files_named(task: str) -> list[str]:
    """The project files a task names, in order, once each."""
    return list(dict.fromkeys(FILES.findall(task)))


def workdir(body: dict[str, Any]) -> str | None:
    # The peer puts the environment block in the system prompt, the CLI of a SwarmBase
    # agent in a user message: look in the whole request.
    m = WORKDIR.search(json.dumps(body))
    return m.group(1) if m else None


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def digest(reads: list[tuple[str, dict[str, Any] | None]]) -> str:
    """`seen: a.py#1f2e3d b.md#missing`: what each Read returned, independent of where
    the agent's directory is (only the text of a file that was there counts)."""
    parts = []
    for path, block in reads:
        text = _result_text(block) if block else ""
        missing = block is None or block.get("is_error") or "does not exist" in text or not text.strip()
        parts.append(f"{path}#missing" if missing else
                     f"{path}#{hashlib.sha256(LINE_PREFIX.sub('', text).encode()).hexdigest()[:6]}")
    return "seen: " + " ".join(parts)


@attrs.define
class SeeingModel(DeterministicModel):
    # Each seeing agent's working directory as its system prompt gave it, by origin
    # (SwarmBase's run id or "cc:<session>"): where the agents of a run were started.
    workdirs: dict[str, list[str]] = attrs.Factory(dict)

    def answer(self, body: dict[str, Any], origin: str = "?") -> Any:
        tools = {t.get("name"): t for t in body.get("tools", []) if isinstance(t, dict)}
        task = task_text(body)
        files = files_named(task)
        if "Workflow" in tools or not files or "[[fail]]" in task:
            return super().answer(body, origin)
        model = body.get("model", "claude-test")
        usage = (100, output_tokens(task))
        results = {b.get("tool_use_id"): b for b in tool_results(body)}
        if not results:
            self.subagent_requests.append((task, origin))
            cwd = workdir(body) or "/nonexistent"
            self.workdirs.setdefault(origin, []).append(cwd)
            if "Read" not in tools:           # an agent that cannot read sees nothing
                return self._reply(model, task, tools, digest([(f, None) for f in files]), usage)
            calls = [{"type": "tool_use", "id": f"toolu_read_{i}", "name": "Read",
                      "input": {"file_path": f"{cwd.rstrip('/')}/{f}"}} for i, f in enumerate(files)]
            return self._stream(model, (calls, "tool_use"), usage)
        if SO_ID in results:
            return self._stream(model, ([{"type": "text", "text": "ok"}], "end_turn"), usage)
        seen = digest([(f, results.get(f"toolu_read_{i}")) for i, f in enumerate(files)])
        return self._reply(model, task, tools, seen, usage)

    def _reply(self, model: str, task: str, tools: dict[str, Any], seen: str, usage: tuple[int, int]) -> Any:
        if "StructuredOutput" in tools:
            value = value_for(tools["StructuredOutput"].get("input_schema"), task + "\n" + seen)
            if isinstance(value, dict) and "seen" in (tools["StructuredOutput"].get("input_schema") or {}).get(
                    "properties", {}):
                value["seen"] = seen
            block = {"type": "tool_use", "id": SO_ID, "name": "StructuredOutput", "input": value}
            return self._stream(model, ([block], "tool_use"), usage)
        return self._stream(model, ([{"type": "text", "text": f"{answer_text(task, model)}\n{seen}"}], "end_turn"),
                            usage)

