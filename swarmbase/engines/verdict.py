"""How an agent ended, as every engine reports it to the agent service. Pure data."""

from __future__ import annotations

import json
from typing import Any, Callable

import attrs

from ..prices import Tokens


@attrs.frozen
class Verdict:
    ok: bool
    value: Any = None
    error: str | None = None
    cost_usd: float | None = None        # None: unknown, estimate from tokens
    tokens: Tokens = Tokens()
    tokens_exact: bool = False
    exit_code: int | None = None
    text: str | None = None              # the agent's final text (for detail records)
    schema_error: str | None = None      # the structured output failed the schema


def scrubbed(verdict: Verdict, redact: Callable[[str], str]) -> Verdict:
    """The verdict with every secret `redact` knows now replaced in what the agent said:
    its bearer is dropped from the redactor before the verdict is recorded."""
    def text(s: str | None) -> str | None:
        return None if s is None else redact(s)
    value = verdict.value if verdict.value is None else json.loads(redact(json.dumps(verdict.value, ensure_ascii=False)))
    return attrs.evolve(verdict, value=value, error=text(verdict.error), text=text(verdict.text),
                        schema_error=text(verdict.schema_error))
