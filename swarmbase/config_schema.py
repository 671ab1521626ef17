"""The config's schema machinery, independent of which keys the config has: a field
declaration that carries its JSON key and limits, a validating walk over attrs classes
that names the key path in every error, and the cattrs converter built from the same
declarations (config.py declares the keys)."""

from __future__ import annotations

import difflib
import functools
import re
import typing
from typing import Any, Literal

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override


class ConfigError(Exception):
    """A config fault; str() is the one line shown to the user."""


def field(key: str, default: Any = attrs.NOTHING, *, lo: float | None = None, hi: float | None = None,
       factory: Any = None, pattern: str | None = None) -> Any:
    """An attrs field with its JSON key and limits (validation and structuring read them)."""
    meta = {"key": key, "min": lo, "max": hi, "pattern": pattern}
    if factory is not None:
        return attrs.field(factory=factory, metadata=meta)
    return attrs.field(default=default, metadata=meta)


def _json_keys(cls: type) -> dict[str, attrs.Attribute]:
    return {a.metadata["key"]: a for a in attrs.fields(cls) if a.metadata.get("key")}


def type_name(v: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _check(tp: Any, value: Any, path: str, meta: dict[str, Any]) -> None:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, path, meta)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}: must be one of {', '.join(map(repr, args))}, got {value!r}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be an array, got {type_name(value)}")
        for i, item in enumerate(value):
            _check(args[0], item, f"{path}[{i}]", {})
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be an object, got {type_name(value)}")
        for k, item in value.items():
            _check(args[1], item, f"{path}.{k}", {})
        return
    if attrs.has(tp):
        return check_object(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false, got {type_name(value)}")
        return
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: must be a number, got {type_name(value)}")
        if tp is int and not (isinstance(value, int) or float(value).is_integer()):
            raise ConfigError(f"{path}: must be a whole number, got {value!r}")
        lo, hi = meta.get("min"), meta.get("max")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f"between {lo:g} and {hi:g}" if hi is not None else f"at least {lo:g}"
            raise ConfigError(f"{path}: must be {rng}, got {value!r}")
        return
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: must be a string, got {type_name(value)}")
        if meta.get("pattern") and not re.fullmatch(meta["pattern"], value):
            raise ConfigError(f"{path}: {value!r} does not match {meta['pattern']}")
        return
    raise AssertionError(f"unhandled config type {tp!r}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The config classes' annotations never change: resolving them (strings, under
    `from __future__ import annotations`) was 80 % of a load's time, which a reload pays
    on every SIGHUP (50 callers: 220 ms -> see docs/decisions.md)."""
    return typing.get_type_hints(cls)


def check_object(cls: type, value: Any, path: str) -> None:
    where = path or "the config"
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be an object, got {type_name(value)}")
    keys = _json_keys(cls)
    hints = _hints(cls)
    prefix = f"{path}." if path else ""
    for k in value:
        if k not in keys:
            near = difflib.get_close_matches(k, list(keys), n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near else f" (known keys: {', '.join(keys)})"
            raise ConfigError(f"{prefix}{k}: unknown key{hint}")
    for k, a in keys.items():
        if k in value:
            _check(hints[a.name], value[k], prefix + k, dict(a.metadata))
        elif a.default is attrs.NOTHING:
            raise ConfigError(f"{prefix}{k}: required key is missing")


def converter(*classes: type) -> cattrs.Converter:
    """A cattrs converter that structures `classes` from their JSON keys (the metadata);
    fields without a key are left to their defaults."""
    conv = cattrs.Converter(forbid_extra_keys=True)
    for cls in classes:
        overrides = {a.name: override(rename=a.metadata["key"]) if a.metadata.get("key") else override(omit=True)
                     for a in attrs.fields(cls)}
        # cattrs types the per-field overrides as keyword arguments of their own.
        conv.register_structure_hook(cls, make_dict_structure_fn(cls, conv, **overrides))  # type: ignore[arg-type]
    conv.register_structure_hook(float, lambda v, _: float(v))
    conv.register_structure_hook(int, lambda v, _: int(v))
    return conv
