"""Real OTLP trace receivers for tests: what leaves a process, decoded.

`HttpReceiver` answers `POST /v1/traces` (OTLP/HTTP, protobuf, optionally gzip); `GrpcReceiver`
is a gRPC `TraceService`. Both decode each `ExportTraceServiceRequest` with
`opentelemetry-proto` and keep every span with its resource's `service.name`.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "INTERNAL",
    trace_pb2.Span.SPAN_KIND_SERVER: "SERVER",
    trace_pb2.Span.SPAN_KIND_CLIENT: "CLIENT",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "PRODUCER",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "CONSUMER",
}


STATUSES = {
    trace_pb2.Status.STATUS_CODE_OK: "OK",
    trace_pb2.Status.STATUS_CODE_ERROR: "ERROR",
}


@dataclass(frozen=True)
class Received:
    """One span as it arrived."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    attributes: dict[str, Any]
    #: (trace id, span id) of each span it links to
    links: tuple[tuple[str, str], ...] = ()
    status: str = "UNSET"  # UNSET, OK or ERROR


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class _Spans:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Received] = []
        self.requests = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        Received(
                            service=str(resource.get("service.name", "")),
                            name=span.name,
                            kind=KINDS.get(span.kind, "UNSPECIFIED"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                            status=STATUSES.get(span.status.code, "UNSET"),
                        )
                    )
        with self._lock:
            self._spans += found
            self.requests += 1

    def spans(self) -> list[Received]:
        with self._lock:
            return list(self._spans)


class HttpReceiver(_Spans):
    """OTLP/HTTP on 127.0.0.1 (a port of its own); `endpoint` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HttpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class GrpcReceiver(_Spans):
    """An OTLP gRPC TraceService on 127.0.0.1 (a port of its own), without TLS."""

    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)
        self._port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def __enter__(self) -> GrpcReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)


def in_trace(spans: list[Received], trace_id: str) -> Iterator[Received]:
    return (span for span in spans if span.trace_id == trace_id)
