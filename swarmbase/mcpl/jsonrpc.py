"""JSON-RPC 2.0 framing for MCPL: parsing, classification and message builders. No I/O.

Incoming JSON is held to what JSON is: `NaN`, `Infinity` and `-Infinity` (which Python's
parser accepts) are refused with the path where they occur, and nesting is bounded
(MAX_DEPTH) so nothing later recurses past Python's limit on a hostile frame.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNAUTHORIZED = -32001          # MCPL convention for a bad token
CAPABILITY_NOT_GRANTED = -32002
FEATURE_SET_UNKNOWN = -32003


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


@attrs.frozen
class Request:
    id: Any
    method: str
    params: Any


@attrs.frozen
class Notification:
    method: str
    params: Any


@attrs.frozen
class Response:
    id: Any
    result: Any = None
    error: dict[str, Any] | None = None


@attrs.frozen
class Invalid:
    """A message we cannot act on; `id` is set when the peer expects an answer."""
    error: RpcError
    id: Any = None


Message = Request | Notification | Response | Invalid

MAX_DEPTH = 128


class _NonFinite:
    """What the parser makes of NaN / Infinity / -Infinity: found and refused by _scan."""
    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token


class _TooDeep(ValueError):
    pass


def _loads(text: str) -> tuple[Any, bool]:
    """The parsed value, and whether it may need a scan: it holds a NaN/Infinity token,
    or has enough brackets (counted at C speed) that it could nest past MAX_DEPTH."""
    marks: list[bool] = []

    def constant(token: str) -> _NonFinite:
        marks.append(True)
        return _NonFinite(token)
    try:
        obj = json.loads(text, parse_constant=constant)
    except RecursionError:
        raise _TooDeep() from None
    return obj, bool(marks) or text.count("[") + text.count("{") > MAX_DEPTH


def _scan(obj: Any) -> tuple[list[Any], str] | str | None:
    """Walk the parsed message without recursion: 'too deep' past MAX_DEPTH, (path, token)
    of the first non-finite number, or None when the message is clean. The first pass
    carries only depths (cheap on big arrays); paths are built only once one is found."""
    found = isinstance(obj, _NonFinite)
    stack: list[tuple[Any, int]] = [(obj, 0)] if isinstance(obj, (dict, list)) else []
    while stack:
        value, depth = stack.pop()
        if depth >= MAX_DEPTH:
            return "too deep"
        for v in (value.values() if isinstance(value, dict) else value):
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
            elif isinstance(v, _NonFinite):
                found = True
    if not found:
        return None
    paths: list[tuple[Any, list[Any]]] = [(obj, [])]
    while paths:
        value, path = paths.pop()
        if isinstance(value, _NonFinite):
            return path, value.token
        if isinstance(value, dict):
            paths.extend((v, path + [k]) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            paths.extend((v, path + [i]) for i, v in reversed(list(enumerate(value))))
    return None


def format_path(root: str, parts: list[Any]) -> str:
    return root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _refuse_scanned(obj: Any, found: tuple[list[Any], str] | str) -> Message:
    rid = obj.get("id") if isinstance(obj, dict) else None
    if not (rid is None or isinstance(rid, (str, int)) and not isinstance(rid, bool)):
        rid = None
    if isinstance(found, str):          # "too deep"
        return Invalid(RpcError(INVALID_REQUEST, f"invalid request: the message nests deeper than {MAX_DEPTH} levels"),
                       rid)
    parts, token = found
    if parts[:1] == ["params"]:
        # tools/call paths read like the schema errors' paths: arguments.x.y
        rest = parts[1:]
        path = format_path(str(rest[0]), rest[1:]) if rest and rest[0] == "arguments" else format_path("params", rest)
        return Invalid(RpcError(INVALID_PARAMS, f"invalid params: {path}: {token} is not a number JSON allows "
                                                "(no NaN or Infinity)", {"path": path}), rid)
    if parts[:1] in (["result"], ["error"]) and "method" not in obj:
        return Response(rid, None, {"code": INVALID_REQUEST, "message": f"the answer holds {token}"})
    where = format_path("", parts).lstrip(".") or "the message"
    return Invalid(RpcError(INVALID_REQUEST, f"invalid request: {where}: {token} is not a number JSON allows"), rid)


def parse_one(text: str) -> Message:
    """One JSON text → a classified message. Raises ValueError when it is not JSON
    (or nests too deep to parse)."""
    obj, suspect = _loads(text)
    found = _scan(obj) if suspect else None
    if found is not None:
        return _refuse_scanned(obj, found)
    return classify(obj)


def classify(obj: Any) -> Message:
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
        rid = obj.get("id") if isinstance(obj, dict) else None
        return Invalid(RpcError(INVALID_REQUEST, "invalid request: expected a JSON-RPC 2.0 object"), rid)
    # A request is told from a notification by the presence of "id", never its
    # truthiness: MCPL hosts send initialize with id 0.
    has_id = "id" in obj
    rid = obj.get("id")
    if has_id and not (rid is None or isinstance(rid, (str, int)) and not isinstance(rid, bool)):
        return Invalid(RpcError(INVALID_REQUEST, "invalid request: id must be a string or a number"), None)
    if "method" in obj:
        method = obj["method"]
        if not isinstance(method, str):
            return Invalid(RpcError(INVALID_REQUEST, "invalid request: method must be a string"), rid)
        params = obj.get("params")
        if params is not None and not isinstance(params, (dict, list)):
            return Invalid(RpcError(INVALID_REQUEST, "invalid request: params must be an object or an array"), rid)
        if has_id:
            return Request(rid, method, params)
        return Notification(method, params)
    if has_id and ("result" in obj or "error" in obj):
        err = obj.get("error")
        return Response(rid, obj.get("result"), err if isinstance(err, dict) else None)
    return Invalid(RpcError(INVALID_REQUEST, "invalid request: no method"), rid)


def _parse_error(e: ValueError, what: str) -> RpcError:
    if isinstance(e, _TooDeep):
        return RpcError(PARSE_ERROR, f"parse error: {what} nests too deep to parse (at most {MAX_DEPTH} levels)")
    return RpcError(PARSE_ERROR, f"parse error: {what} is not valid JSON")


def parse_frame(text: str) -> list[Message] | RpcError:
    """One frame is one message; frames with several newline-separated messages are tolerated."""
    try:
        return [parse_one(text)]
    except ValueError as e:
        first_error = e
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if len(lines) > 1:
        out: list[Message] = []
        for ln in lines:
            try:
                out.append(parse_one(ln))
            except ValueError as e:
                out.append(Invalid(_parse_error(e, "a line")))
        return out
    return _parse_error(first_error, "the message")


def result(rid: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def error(rid: Any, err: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": err.to_json()}


def request(rid: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def dumps(msg: Any) -> str:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))
