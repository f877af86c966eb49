"""An OTLP/HTTP trace receiver in a thread, for tests: what the app's real exporter sends, decoded."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class OtlpReceiver:
    """Collects every span POSTed to `url` (…/v1/traces, protobuf): dicts of name, service, trace_id, span_id,
    parent_id (hex; "" for a root), start_ns and end_ns (Unix time) and attributes."""

    def __init__(self):
        self.spans: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.add(ExportTraceServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                    self.spans.append({"name": span.name, "service": service, "trace_id": span.trace_id.hex(),
                                       "span_id": span.span_id.hex(), "parent_id": span.parent_span_id.hex(),
                                       "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                                       "attributes": attributes})

    def stop(self) -> None:
        self._server.shutdown()
