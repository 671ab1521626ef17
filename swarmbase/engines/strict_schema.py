"""Strict JSON Schemas for the codex engine (OpenAI structured outputs in strict mode).

Every object gets `additionalProperties: false`; a schema that cannot be strict is
refused up front, naming the path: an object whose `additionalProperties` allows extras,
or a property missing from `required` (in strict mode an optional field is written as a
required, nullable one). Pure function, no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from .base import SchemaRefused


class StrictSchemaError(SchemaRefused):
    pass


def _walk(node: Any, path: str) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    is_object = node.get("type") == "object" or (isinstance(node.get("type"), list) and "object" in node["type"]) \
        or "properties" in node
    if is_object:
        extra = node.get("additionalProperties", False)
        if extra is not False:
            raise StrictSchemaError(f"agent(): schema {path or '(root)'} allows extra properties "
                                    f"(additionalProperties must be false on the codex engine)")
        node["additionalProperties"] = False
        props = node.get("properties") or {}
        required = node.get("required") or []
        missing = [k for k in props if k not in required]
        if missing:
            where = f"{path}.properties.{missing[0]}" if path else f"properties.{missing[0]}"
            raise StrictSchemaError(f"agent(): schema {where} is missing from required; on the codex engine "
                                    f"every property is required (make an optional one nullable: "
                                    f"\"type\": [\"string\", \"null\"])")
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions", "patternProperties"):
            if isinstance(value, dict):
                for name, sub in value.items():
                    _walk(sub, f"{path}.{key}.{name}" if path else f"{key}.{name}")
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "additionalItems", "contains"):
            _walk(value, f"{path}.{key}" if path else key)


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` with additionalProperties false on every object, or StrictSchemaError."""
    out = copy.deepcopy(schema)
    _walk(out, "")
    return out
