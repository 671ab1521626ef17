"""Schema nudges: when an agent's structured output is missing or fails its schema, it gets
up to `schemaRetries` follow-up turns that quote the validation error, before it fails with
`schemaError` set. Each turn is a fresh CLI process (the CLIs keep no session here) whose
prompt carries the original task, the previous answer and what was wrong with it; what
every turn cost is added up. Pure functions."""

from __future__ import annotations

import attrs

from ..engines.verdict import Verdict

MARKER = "[swarmbase schema nudge]"
PREVIOUS_LIMIT = 4_000


def prompt(original: str, verdict: Verdict, attempt: int) -> str:
    previous = (verdict.text or "(no structured output at all)")[:PREVIOUS_LIMIT]
    return (f"{original}\n\n{MARKER} Attempt {attempt + 1}. Your previous answer did not satisfy the required "
            f"JSON schema: {verdict.schema_error}\nYour previous answer was:\n{previous}\n"
            "Answer again, with output that matches the schema exactly.")


def add(earlier: Verdict, later: Verdict) -> Verdict:
    """The later turn's outcome with the cost and tokens of both."""
    cost = None if earlier.cost_usd is None or later.cost_usd is None else earlier.cost_usd + later.cost_usd
    return attrs.evolve(later, cost_usd=cost, tokens=earlier.tokens + later.tokens,
                        tokens_exact=earlier.tokens_exact and later.tokens_exact)
