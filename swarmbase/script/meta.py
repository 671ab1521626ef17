"""`export const meta = {...}` read as a pure literal, without running the script.

Claude Code's Workflow tool (2.1.328, read from its bundled runtime) does the same: the
meta statement must be the script's first statement (comments may come before it), its
value must be a literal (objects, arrays, strings without interpolation, numbers, true,
false, null), and `name` and `description` must be non-empty strings; `whenToUse` and
`phases: [{title, detail?, model?}]` are optional. A computed meta is refused before
anything runs. SwarmBase keeps meta optional (a script without one runs unlabelled), so
only a meta that is *there* and not a literal, or not first, is an error.

Design log:
- A tokenizer-free recursive reader over the text, ported from Claude Code's fast path
  (same escapes, same "no interpolation", same refusal of __proto__/constructor/prototype
  keys), so the daemon decides before a runner starts and the `workflows` tool can list a
  saved script's meta without running it. Cost: ~20 µs for a typical meta block.
- The statement must end where the literal ends (`;`, a line break not followed by an
  operator that would continue the expression, or the end of the script), exactly as
  Claude Code checks it; `export const meta = {...}.x` is therefore refused.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

RESERVED_KEYS = frozenset({"__proto__", "constructor", "prototype"})
MAX_STRING = 2000           # longer meta strings are cut: they label a run, nothing more
MAX_PHASES = 200

_SPACE = re.compile(r"(?:\s|//[^\n\r\u2028\u2029]*(?:[\n\r\u2028\u2029]|$)|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/)*")
_LINE_BREAK = re.compile(r"[\n\r\u2028\u2029]")
_IDENT = re.compile(r"[A-Za-z_$][\w$]*")
_IDENT_CHAR = re.compile(r"[\w$\\]")
_NUMBER = re.compile(r"(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX = re.compile(r"x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|u\{([0-9a-fA-F]+)\}")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "v": "\v"}
_HEAD = re.compile(_SPACE.pattern + r"export\s+const\s+meta\s*=\s*(?=\{)")
_ANYWHERE = re.compile(r"(^|[;\n\r{}])\s*export\s+const\s+meta\s*=")


class MetaError(ValueError):
    """The script's meta block is there but not usable; the message says why."""


@attrs.frozen
class Phase:
    title: str
    detail: str | None = None
    model: str | None = None


@attrs.frozen
class Meta:
    name: str | None = None
    description: str | None = None
    when_to_use: str | None = None
    phases: tuple[Phase, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in (("name", self.name), ("description", self.description),
                                                 ("whenToUse", self.when_to_use)) if v is not None}
        if self.phases:
            out["phases"] = [{k: v for k, v in attrs.asdict(p).items() if v is not None} for p in self.phases]
        return out

    def phase_model(self, title: str | None) -> str | None:
        """The model a declared phase names for its agents (meta.phases[].model)."""
        for p in self.phases:
            if p.title == title:
                return p.model
        return None


@attrs.frozen
class Found:
    meta: Meta | None
    start: int = 0          # where `export` begins (None meta: 0)
    end: int = 0            # just after the statement


def _skip(s: str, i: int) -> int:
    m = _SPACE.match(s, i)
    assert m is not None          # the pattern matches the empty string
    return m.end()


def _ident(s: str, i: int) -> str | None:
    m = _IDENT.match(s, i)
    if not m or _ident_continues(s, m.end()):
        return None
    return m.group(0)


def _ident_continues(s: str, i: int) -> bool:
    return i < len(s) and (bool(_IDENT_CHAR.match(s[i])) or ord(s[i]) > 127)


def _value(s: str, i: int) -> tuple[Any, int] | None:
    c = s[i] if i < len(s) else ""
    if c == "{":
        return _object(s, i)
    if c == "[":
        return _list(s, i, "]", _value)
    if c in "'\"`":
        return _string(s, i)
    if c == "-":
        r = _number(s, _skip(s, i + 1))
        return (-r[0], r[1]) if r else None
    r = _number(s, i)
    if r:
        return r
    word = _ident(s, i)
    if word in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[word], i + len(word)
    return None


def _object(s: str, i: int) -> tuple[dict[str, Any], int] | None:
    r = _list(s, i, "}", _pair)
    if r is None:
        return None
    return dict(r[0]), r[1]


def _pair(s: str, i: int) -> tuple[tuple[str, Any], int] | None:
    if i < len(s) and s[i] in "'\"":
        k = _string(s, i)
    else:
        word = _ident(s, i)
        k = (word, i + len(word)) if word is not None else None
    if not k or k[0] in RESERVED_KEYS:
        return None
    j = _skip(s, k[1])
    if j >= len(s) or s[j] != ":":
        return None
    v = _value(s, _skip(s, j + 1))
    return ((k[0], v[0]), v[1]) if v else None


def _list(s: str, i: int, close: str, item: Any) -> tuple[list[Any], int] | None:
    out: list[Any] = []
    j = i + 1
    while True:
        j = _skip(s, j)
        if j < len(s) and s[j] == close:
            return out, j + 1
        if out:
            if j >= len(s) or s[j] != ",":
                return None
            j = _skip(s, j + 1)
            if j < len(s) and s[j] == close:
                return out, j + 1
        r = item(s, j)
        if not r:
            return None
        out.append(r[0])
        j = r[1]


def _number(s: str, i: int) -> tuple[float | int, int] | None:
    m = _NUMBER.match(s, i)
    if not m:
        return None
    end = m.end()
    if _ident_continues(s, end) or (end < len(s) and s[end] == "."):
        return None
    text = m.group(0)
    value = float(text)
    return (int(value) if value.is_integer() and "e" not in text.lower() and "." not in text else value), end


def _string(s: str, i: int) -> tuple[str, int] | None:
    quote = s[i]
    template = quote == "`"
    out, start, j = "", i + 1, i + 1
    while j < len(s):
        c = s[j]
        if c == quote:
            return out + s[start:j], j + 1
        if c == "\\":
            esc = _escape(s, j)
            if not esc:
                return None
            out += s[start:j] + esc[0]
            start = j = esc[1]
        elif template and c == "$" and j + 1 < len(s) and s[j + 1] == "{":
            return None                     # interpolation: not a literal
        elif not template and c in "\n\r":
            return None
        elif template and c == "\r":
            out += s[start:j] + "\n"
            start = j = j + (2 if s[j + 1: j + 2] == "\n" else 1)
        else:
            j += 1
    return None


def _escape(s: str, i: int) -> tuple[str, int] | None:
    if i + 1 >= len(s):
        return None
    c = s[i + 1]
    if c in _ESCAPES:
        return _ESCAPES[c], i + 2
    if c == "0":
        return (None if s[i + 2: i + 3].isdigit() else ("\x00", i + 2))
    if "1" <= c <= "9":
        return None
    if c in "xu":
        m = _HEX.match(s, i + 1)
        if not m:
            return None
        cp = int(m.group(1) or m.group(2) or m.group(3), 16)
        return (chr(cp), m.end()) if cp <= 0x10FFFF else None
    if c == "\r":
        return "", i + (3 if s[i + 2: i + 3] == "\n" else 2)
    return ("" if _LINE_BREAK.match(c) else c), i + 2


def _statement_end(s: str, i: int) -> int | None:
    """Where the meta statement ends, if the literal is the whole expression."""
    j = _skip(s, i)
    if j < len(s) and s[j] == ";":
        return j + 1
    if j >= len(s):
        return i
    if not _LINE_BREAK.search(s, i, j):
        return None
    word = _ident(s, j)
    if word is None or word in ("in", "instanceof"):
        return None
    return i


def _text(v: Any, what: str) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise MetaError(f"meta.{what} must be a string")
    return v[:MAX_STRING]


def _phases(v: Any) -> tuple[Phase, ...]:
    if not isinstance(v, list):
        return ()
    out = []
    for p in v[:MAX_PHASES]:
        if isinstance(p, dict) and isinstance(p.get("title"), str):
            detail, model = p.get("detail"), p.get("model")
            out.append(Phase(title=p["title"][:500], detail=detail[:MAX_STRING] if isinstance(detail, str) else None,
                             model=model[:200] if isinstance(model, str) else None))
    return tuple(out)


def read(script: str) -> Found:
    """The script's meta block, or Found(None) when it has none; MetaError when it has one
    that Claude Code would refuse (not first, not a pure literal, name/description not
    non-empty strings when given)."""
    head = _HEAD.match(script)
    if head is None:
        if _ANYWHERE.search(script):
            raise MetaError("`export const meta = { name, description, phases }` must be the FIRST statement "
                            "in the script (only comments may come before it)")
        return Found(None)
    lit = _object(script, head.end())
    end = _statement_end(script, lit[1]) if lit else None
    if lit is None or end is None:
        raise MetaError("meta must be a pure literal: no variables, function calls, spreads, template "
                        "interpolation or computed keys (strings, numbers, true/false/null, arrays and objects only)")
    raw = lit[0]
    for key in ("name", "description"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            raise MetaError(f"meta.{key} must be a non-empty string")
    meta = Meta(name=_text(raw.get("name"), "name"), description=_text(raw.get("description"), "description"),
                when_to_use=_text(raw.get("whenToUse"), "whenToUse"), phases=_phases(raw.get("phases")))
    start = _skip(script, 0)
    return Found(meta, start=start, end=end)


def describe(script: str) -> dict[str, Any] | None:
    """The meta of a saved script for listings; None when it has none or it is unusable."""
    try:
        found = read(script)
    except MetaError:
        return None
    return found.meta.to_json() if found.meta else None
