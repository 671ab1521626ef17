"""How deep JSON may nest where a value crosses into the daemon. No I/O.

Python's json parser recurses (about 1,000 levels under the default recursion limit), and
so does most of what walks a value later: json.dumps, jsonschema (about 4 frames a level),
redaction, the canonical encoding of sealed records. A script's return value nested 2,000
deep, or a model's structured answer nested 1,500 deep, raised RecursionError inside a
run's nursery, and the whole run failed with "internal error: ExceptionGroup" — a hostile
answer took down its run despite the script's `catch`. So every value that arrives from
outside is held to MAX_DEPTH levels where it arrives (the runner bridge, a CLI's stream,
a model's structured answer; MCPL frames have their own bound, mcpl/jsonrpc.py), and a
deeper one is refused with an error naming the limit, failing only what carried it.

The check costs a count of brackets at C speed; only a text with more brackets than the
limit is walked, level by level without recursion. Measured on 8.3 MB of 200,000 flat rows
(2 loaded cores): json.loads ~480 ms, this ~520 ms; a 2 KB CLI line: 8 µs, 12 µs.
"""

from __future__ import annotations

import json
from typing import Any

# Levels of arrays/objects: `[1]` nests 1, `1` nests 0. A script's values, a workflow's
# args, agent options and models' answers all get this bound; the bridge's and the CLIs'
# envelopes around them add a few levels of their own.
MAX_DEPTH = 100
# A CLI's stream event wraps a model's value in a few levels of its own (assistant →
# message → content → block → input), so its lines may nest that much deeper.
LINE_DEPTH = MAX_DEPTH + 8


class TooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"nests deeper than {limit} levels (the limit)")
        self.limit = limit


def may_exceed(text: str | bytes, limit: int) -> bool:
    """False when `text` cannot nest deeper than `limit` (too few brackets)."""
    if isinstance(text, bytes):
        return text.count(b"[") + text.count(b"{") > limit
    return text.count("[") + text.count("{") > limit


_CONTAINERS = (dict, list)


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the parsed `value` nests more than `limit` levels. Level by level, without
    recursion (4× faster than a stack of (container, depth) pairs on flat rows)."""
    if type(value) not in _CONTAINERS:
        return False
    level: list[Any] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        for container in level:
            for v in (container.values() if type(container) is dict else container):
                if type(v) in _CONTAINERS:
                    below.append(v)
        level = below
    return False


def loads(text: str | bytes, limit: int = MAX_DEPTH, **kw: Any) -> Any:
    """json.loads, refusing (TooDeep, a ValueError) a value nested deeper than `limit`,
    including one too deep for Python's parser."""
    try:
        value = json.loads(text, **kw)
    except RecursionError:
        raise TooDeep(limit) from None
    if may_exceed(text, limit) and deeper_than(value, limit):
        raise TooDeep(limit)
    return value
