"""What every subagent is told about its place (issue 21, item 11): its final message is
the calling script's return value, not a message to a person. Claude Code's Workflow
runtime frames its subagents the same way (its system prompt says the final text is
"returned verbatim as a string to the calling script"); without it a CLI agent answers
like a chat assistant ("Sure! Here is ...") and the script gets the prose.

The claude engine appends the note to the CLI's own system prompt (--append-system-prompt);
codex exec has no flag for it that --strict-config accepts on 0.169, so its note leads the
prompt. A project agent type's body (.claude/agents/<name>.md) is the system prompt before
the note: the claude CLI's --system-prompt-file, the think requests' `system`/`instructions`,
codex's prompt. The journal key is built from the script's prompt, never from the framed one.
"""

from __future__ import annotations

TEXT = ("You are running inside a workflow script. Your final text response is returned verbatim as a "
        "string to the calling script: it is your return value, not a message to a human. Output the "
        "literal result (data, JSON, text); do not output confirmations like \"Done.\" If asked for JSON, "
        "return only the raw JSON, with no code fences and no prose. Be concise: the script will parse "
        "your output.")
STRUCTURED = ("You are running inside a workflow script. You must return your final answer by calling the "
              "StructuredOutput tool exactly once: its input schema defines the required shape, and the script "
              "reads only that call, not your text. Do your work, then call StructuredOutput; if validation "
              "fails, read the error and call it again with a corrected shape.")


def note(structured: bool) -> str:
    return STRUCTURED if structured else TEXT


def instructions(structured: bool, system: str | None) -> str:
    """A project agent type's system prompt (its file's body), then the note; the note alone
    without one."""
    return f"{system}\n\n{note(structured)}" if system else note(structured)


def framed_prompt(prompt: str, structured: bool, system: str | None = None) -> str:
    """The prompt with the note (and an agent type's system prompt) ahead of it, for
    engines without a system-prompt flag."""
    return f"[{instructions(structured, system)}]\n\n{prompt}"
