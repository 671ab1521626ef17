"""The one name for data whose shape is JSON's: decoded from disk, the wire or a script
(run.json, journal lines, agent options, a script's args and results). Its shape is checked
where it is read (the store's loaders, agent_opts.resolve, the tool schemas), not by the
type checker: runs/ forbids a bare `Any` (pyproject.toml, disallow_any_explicit), so every
untyped value there says it is JSON by using these names."""

from typing import Any

Json = Any                    # any JSON value (object, array, string, number, bool, null)
JsonObject = dict[str, Any]   # a JSON object


def object_at(value: JsonObject, key: str) -> JsonObject:
    """value[key] when it is a JSON object, else an empty one (a field that is missing or
    of another shape reads as empty)."""
    found = value.get(key)
    return found if isinstance(found, dict) else {}


def list_at(value: JsonObject, key: str) -> list[Json]:
    """value[key] when it is a JSON array, else an empty one."""
    found = value.get(key)
    return found if isinstance(found, list) else []
