"""The authoring reference the `guide` tool returns (guide.md, split by `## ` topics)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

_PATH = Path(__file__).with_name("guide.md")
TOPICS = ["hooks", "agent", "profiles", "budgets", "determinism", "errors", "examples", "claude-code"]


@lru_cache(maxsize=1)
def _sections() -> dict[str, str]:
    text = _PATH.read_text(encoding="utf-8")
    parts = re.split(r"(?m)^## ", text)
    out = {"all": text}
    for part in parts[1:]:
        title = part.split("\n", 1)[0].strip().lower()
        key = title.split()[0]
        out[key] = "## " + part.strip() + "\n"
    return out


def text(topic: str | None = None) -> str:
    sections = _sections()
    return sections.get(topic or "all", sections["all"])
