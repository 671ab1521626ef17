"""A fake OTLP/HTTP trace collector on loopback, decoding what the official exporter posts
with the official opentelemetry-proto types (tests/test_telemetry.py, the audit tests)."""

from __future__ import annotations

import gzip
from typing import Any

from swarmbase.engines.bearer_relay import lifespan, read_body


class OtlpReceiver:
    """A minimal OTLP/HTTP trace collector (ASGI): decodes every POST to /v1/traces."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
        self.request_type = ExportTraceServiceRequest
        self.posts: list[tuple[str, dict[str, str], Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await lifespan(receive, send)
        body = await read_body(receive) or b""
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        req = self.request_type()
        req.ParseFromString(body)
        self.posts.append((scope["path"], headers, req))
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": ExportTraceServiceResponse().SerializeToString()})

    def spans(self) -> list[Any]:
        return [s for _, _, req in self.posts for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def attrs_of(obj: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in obj.attributes}
