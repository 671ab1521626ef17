"""Token prices (USD per million tokens) for estimating costs the CLIs did not report:
killed agents, lost results, codex agents. The config's `prices` rows add or override."""

from __future__ import annotations

from typing import Mapping

import attrs

from .config import PriceRow


@attrs.frozen
class Tokens:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write

    def __add__(self, other: "Tokens") -> "Tokens":
        return Tokens(self.input + other.input, self.output + other.output,
                      self.cache_read + other.cache_read, self.cache_write + other.cache_write)

    def __sub__(self, other: "Tokens") -> "Tokens":
        return Tokens(max(0, self.input - other.input), max(0, self.output - other.output),
                      max(0, self.cache_read - other.cache_read), max(0, self.cache_write - other.cache_write))

    def to_json(self) -> dict[str, int]:
        return {"input": self.input, "output": self.output, "cacheRead": self.cache_read,
                "cacheWrite": self.cache_write, "total": self.total}


# List prices as the Claude CLI itself uses them; cache reads at 10 %, writes at 125 %.
BUILTIN: dict[str, PriceRow] = {
    "claude-opus-5-5": PriceRow(input=4.0, output=20.0, cacheRead=0.4, cacheWrite=5.0),
    "claude-sonnet-5-5": PriceRow(input=3.0, output=15.0, cacheRead=0.3, cacheWrite=3.75),
    "claude-haiku-5-5": PriceRow(input=1.0, output=5.0, cacheRead=0.1, cacheWrite=1.25),
    "claude-fable-5-2": PriceRow(input=3.0, output=15.0, cacheRead=0.3, cacheWrite=3.75),
    "claude-sonnet-4-5": PriceRow(input=3.0, output=15.0, cacheRead=0.3, cacheWrite=3.75),
}
ALIASES = {"opus": "claude-opus-5-5", "sonnet": "claude-sonnet-5-5", "haiku": "claude-haiku-5-5",
           "fable": "claude-fable-5-2"}
# An unknown claude model is estimated at the most expensive known row: over, never under.
FALLBACK_CLAUDE = BUILTIN["claude-opus-5-5"]


def row_for(model: str | None, extra: Mapping[str, PriceRow], engine: str = "claude") -> PriceRow | None:
    """The price row for a model. Claude rows (built in) apply only to the claude engine,
    whose default model is claude-opus-5-5; a codex model has a row only in `prices`
    (none: the agent counts $0 of the USD budget; its token budget bounds it)."""
    if engine != "claude":
        return extra.get(model) if model else None
    if model and model in extra:
        return extra[model]
    name = ALIASES.get(model or "", model or "claude-opus-5-5")
    if name in extra:
        return extra[name]
    return BUILTIN.get(name, FALLBACK_CLAUDE)


def cost(tokens: Tokens, row: PriceRow) -> float:
    cr = row.cacheRead if row.cacheRead is not None else row.input * 0.1
    cw = row.cacheWrite if row.cacheWrite is not None else row.input * 1.25
    return (tokens.input * row.input + tokens.output * row.output
            + tokens.cache_read * cr + tokens.cache_write * cw) / 1_000_000
