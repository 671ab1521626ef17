"""A project's `.claude/agents/*.md` read as Claude Code writes them (issue 28 item 2, the
reading half): front matter forms, the profile a file's tools need, file:line errors."""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest

from swarmbase.runs.project_agents import AgentFileError, parse, profile_within, scan

EXECUTOR = """---
name: executor
description: Carries out one step of a plan
tools: Read, Grep, Glob, Bash
model: sonnet
color: green
---

You are the executor. Do the one step you are given, then report.
"""


def test_comma_list_front_matter_and_body() -> None:
    a = parse(EXECUTOR, ".claude/agents/executor.md")
    assert (a.name, a.description, a.model) == ("executor", "Carries out one step of a plan", "sonnet")
    assert a.tools == ("Read", "Grep", "Glob", "Bash")
    assert a.prompt == "You are the executor. Do the one step you are given, then report."
    assert a.profile == "write"                              # Bash
    assert len(a.sha256) == 64 and a.sha256 != parse(EXECUTOR + "\n", "x").sha256   # an edit changes the hash


@pytest.mark.parametrize("tools, profile", [
    ("tools: [Read, \"Grep\"]", "read"),
    ("tools:\n  - Read\n  - Glob", "read"),
    ("tools: WebSearch", "read"),
    ("tools:", "think"),                                      # no tools at all
    ("", "write"),                                            # absent: every tool, Claude Code's rule
])
def test_tool_list_forms_and_the_profile_they_need(tools: str, profile: str) -> None:
    a = parse(f"---\nname: r\ndescription: d\n{tools}\n---\nbody\n", "r.md")
    assert a.profile == profile
    assert a.model is None


def test_model_inherit_is_the_runs_model() -> None:
    assert parse("---\nname: r\ndescription: d\nmodel: inherit\n---\n", "r.md").model is None


def test_a_profile_is_never_above_the_ceiling() -> None:
    assert profile_within("write", "read") == ("read", True)
    assert profile_within("read", "write") == ("read", False)
    assert profile_within("think", "think") == ("think", False)


@pytest.mark.parametrize("text, where", [
    ("name: x\n", "f.md:1: an agent file starts"),
    ("---\nname: x\ndescription: d\n", "f.md:1: the front matter has no closing"),
    ("---\nname: x\ndescription: d\njust words\n---\n", "f.md:4: expected 'key: value'"),
    ("---\nname: x\nname: y\ndescription: d\n---\n", "f.md:3: 'name' is given twice"),
    ("---\ndescription: d\n---\n", "f.md:1: front matter needs a 'name'"),
    ("---\nname: x\ndescription:\n---\n", "f.md:3: front matter needs a 'description'"),
    ("---\nname: x\ndescription: d\n  - Read\n---\n", "f.md:4: a '- item' line belongs under 'tools:'"),
    ("---\nname: x\ndescription: d\ntools: [Read\n---\n", "f.md:4: a list that starts with ["),
])
def test_a_malformed_file_says_file_and_line(text: str, where: str) -> None:
    with pytest.raises(AgentFileError) as e:
        parse(text, "f.md")
    assert str(e.value).startswith(where), str(e.value)


def test_scan_finds_types_by_name_and_keeps_broken_files_as_errors(tmp_path: Path) -> None:
    agents = tmp_path / "proj" / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "executor.md").write_text(EXECUTOR)
    (agents / "broken.md").write_text("---\nname broken\n---\n")
    (agents / "notes.txt").write_text("not an agent")
    secret = tmp_path / "outside.md"
    secret.write_text("---\nname: outside\ndescription: d\n---\nsecret\n")
    os.symlink(secret, agents / "outside.md")
    found = scan(tmp_path / "proj")
    assert set(found.types) == {"executor"}
    assert found.find("executor") is found.types["executor"]
    assert found.find("Explore") is None                      # not the project's: the built-ins decide
    with pytest.raises(AgentFileError, match=r"^\.claude/agents/broken\.md:2: expected 'key: value'"):
        found.find("broken")
    with pytest.raises(AgentFileError, match="a link that leaves the project"):
        found.find("outside")


def test_two_files_defining_one_name_are_an_error(tmp_path: Path) -> None:
    agents = tmp_path / ".claude" / "agents"
    agents.mkdir(parents=True)
    (agents / "a.md").write_text(EXECUTOR)
    (agents / "b.md").write_text(EXECUTOR)
    with pytest.raises(AgentFileError, match="also defined by"):
        scan(tmp_path).find("executor")


def test_a_project_without_agents_has_none(tmp_path: Path) -> None:
    assert scan(tmp_path).types == {} and scan(tmp_path / "missing").broken == {}


def test_a_type_body_leads_each_engines_instructions() -> None:
    from swarmbase.engines import framing, think_messages, think_responses
    system = [b["text"] for b in think_messages.body("claude-opus-5-5", "p", None, None, [], "BODY")["system"]]
    assert system == ["BODY", framing.note(False)]
    assert [b["text"] for b in think_messages.body("m", "p", None, None, [])["system"]] == [framing.note(False)]
    assert think_responses.body("m", "p", None, None, "BODY")["instructions"] == f"BODY\n\n{framing.note(False)}"
    assert framing.framed_prompt("do it", True, "BODY") == f"[BODY\n\n{framing.note(True)}]\n\ndo it"


def test_the_claude_argv_takes_a_type_body_as_a_file() -> None:
    from swarmbase.engines import claude
    call = claude.ClaudeCall(bin="claude", cwd="/w", profile="read", model=None, effort=None, schema=None,
                             max_usd=1.0, state_dir="/s", user_home="/h", system_prompt_file="/a/system-prompt.md")
    argv = claude.argv(call)
    assert argv[argv.index("--system-prompt-file") + 1] == "/a/system-prompt.md"
    assert "--system-prompt-file" not in claude.argv(attrs.evolve(call, system_prompt_file=None))
