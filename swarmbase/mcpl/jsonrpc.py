"""JSON-RPC 2.0 framing for MCPL: parsing, classification and message builders. No I/O."""

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


def parse_frame(text: str) -> list[Message] | RpcError:
    """One frame is one message; frames with several newline-separated messages are tolerated."""
    try:
        return [classify(json.loads(text))]
    except ValueError:
        pass
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if len(lines) > 1:
        out: list[Message] = []
        for ln in lines:
            try:
                out.append(classify(json.loads(ln)))
            except ValueError:
                out.append(Invalid(RpcError(PARSE_ERROR, "parse error: a line is not valid JSON")))
        return out
    return RpcError(PARSE_ERROR, "parse error: the message is not valid JSON")


def result(rid: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def error(rid: Any, err: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": err.to_json()}


def request(rid: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def dumps(msg: Any) -> str:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))
