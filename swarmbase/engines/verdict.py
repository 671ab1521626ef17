"""How an agent ended, as every engine reports it to the agent service. Pure data."""

from __future__ import annotations

from typing import Any

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
