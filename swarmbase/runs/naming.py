"""What a run is called where people read about it: notices, the `list` and `status`
tools, the dashboard. One rule, here, so they cannot disagree. Pure.

The caller's label, else the script's `meta.name`, else the script's leading `//` comment
line, else a neutral word. Never a line of code: "Run phase("x"); … failed" told the
reader nothing and looked like an error in the notice itself.

`meta` is whatever the run knows of `export const meta = {...}` (today: what the runner
reported when the script started); point `run_name` at another source by passing it.
"""

from __future__ import annotations

import re
from ..jsonvalue import Json

UNNAMED = "untitled"
MAX_NAME_CHARS = 80
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def _clean(text: str) -> str:
    return _CONTROL.sub(" ", text).strip()[:MAX_NAME_CHARS].strip()


def leading_comment(script: str) -> str | None:
    """The first `//` comment line with words in it, among the comment lines the script
    starts with (blank lines between them allowed); None if the script starts with code."""
    for line in script.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("//"):
            return None
        text = _clean(s.lstrip("/"))
        if text:
            return text
    return None


def meta_name(meta: Json) -> str | None:
    name = meta.get("name") if isinstance(meta, dict) else None
    if isinstance(name, str) and _clean(name):
        return _clean(name)
    return None


def run_name(label: str | None, meta: Json, comment: str | None) -> str:
    """The one naming rule: label, meta.name, leading comment, UNNAMED."""
    if isinstance(label, str) and label:
        return label
    return meta_name(meta) or (_clean(comment) if comment else "") or UNNAMED
