"""An OTLP/gRPC trace receiver for tests: it takes what processes' OpenTelemetry
SDKs export (``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT``) and keeps
each span as a plain ``Span``, so a test can judge the spans of several
processes by their ids, parents and links."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from testkit.services import free_port


@dataclass(frozen=True, slots=True)
class Span:
    service: str
    name: str
    trace_id: int
    span_id: int
    parent_span_id: int  # 0: a root
    links: tuple[tuple[int, int], ...]
    attributes: dict[str, Any] = field(hash=False)
    error: bool = False


def _int(raw: bytes) -> int:
    return int.from_bytes(raw, "big")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpReceiver) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:
        got = []
        for rs in request.resource_spans:
            service = next(
                (str(_value(a.value)) for a in rs.resource.attributes if a.key == "service.name"),
                "",
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            service=service,
                            name=s.name,
                            trace_id=int.from_bytes(s.trace_id, "big"),
                            span_id=int.from_bytes(s.span_id, "big"),
                            parent_span_id=int.from_bytes(s.parent_span_id or b"", "big"),
                            links=tuple(
                                (
                                    int.from_bytes(k.trace_id, "big"),
                                    int.from_bytes(k.span_id, "big"),
                                )
                                for k in s.links
                            ),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            error=s.status.code == 2,
                        )
                    )
        with self.sink.lock:
            self.sink.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` serves on ``r.endpoint`` until the block ends."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server
        add(_Servicer(self), self._server)  # type: ignore[no-untyped-call]
        self._server.add_insecure_port(f"127.0.0.1:{self.port}")

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None)

    def find(self, name: str, **attributes: Any) -> list[Span]:
        with self.lock:
            return [
                s
                for s in self.spans
                if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
            ]

    def wait(self, name: str, timeout: float = 20.0, **attributes: Any) -> Span:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.find(name, **attributes)
            if found:
                return found[0]
            time.sleep(0.05)
        with self.lock:
            seen = sorted({(s.service, s.name) for s in self.spans})
            named = [s.attributes for s in self.spans if s.name == name]
        raise AssertionError(
            f"no span {name!r} {attributes} within {timeout}s; seen {seen}; {name!r}: {named}"
        )
