"""OpenTelemetry traces of requests, exported over OTLP/HTTP to the app config's `otlp_traces_endpoint` (vLLM's
`--otlp-traces-endpoint`); with none set, nothing here runs.

Per request: the HTTP side's server span (`POST /v1/chat/completions`), continuing the caller's W3C
`traceparent`; the replica's `llm_request` span under it (the trace context crosses the Ray hop inside the
request body, a private attribute), with vLLM's `gen_ai.*` attributes (request id, model, prompt and completion
tokens, time to first token, end-to-end latency); and under that, `prefill` (from the engine taking the request
to its first token: queueing included) and `decode` (first token to last). Every route's requests carry it
(chat, completions, /generate, embeddings, and the Responses and Messages APIs, which call chat).
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from runtime import RequestDelta

_tracer: trace.Tracer | None = None  # set by `start_tracing` in a process that exports


def start_tracing(endpoint: str | None, service: str) -> None:
    """Export this process's spans to `endpoint` (an OTLP/HTTP traces URL); None: tracing stays off."""
    global _tracer
    if endpoint is None or _tracer is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = provider.get_tracer("rayllm-engine")


def tracing() -> bool:
    return _tracer is not None


def carry(body) -> None:
    """Put the current trace context into a request body (its private `_trace`), for the replica that answers it."""
    if _tracer is not None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        body._trace = carrier


@contextmanager
def continued(body):
    """On the replica: the trace context the body carries is current inside (the engine's observer reads it)."""
    carrier = getattr(body, "_trace", None)
    if _tracer is None or not carrier:
        yield
        return
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


class HttpSpans:
    """ASGI middleware: a server span per POST, continuing the caller's `traceparent`, current while the route
    runs and ended when the response's last byte is sent."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or _tracer is None:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path = scope["path"].removeprefix(scope.get("root_path", ""))  # the route, under the app's route prefix
        span = _tracer.start_span(f"POST {path}", context=propagate.extract(headers), kind=trace.SpanKind.SERVER,
                                  attributes={"http.route": path})

        async def traced_send(message):
            if message["type"] == "http.response.start":
                span.set_attribute("http.status_code", message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                span.end()

        token = context.attach(trace.set_span_in_context(span))
        try:
            await self.app(scope, receive, traced_send)
        finally:
            context.detach(token)
            if span.is_recording():
                span.end()


@dataclass
class _OpenRequest:
    span: trace.Span
    start_ns: int
    first_token_ns: int | None = None
    tokens: int = 0
    prompt_tokens: int = 0


class RequestSpans:
    """The engine's stream observer on a replica: an `llm_request` span per request started inside a continued
    trace, with its `prefill` and `decode` spans."""

    def __init__(self, model_id: str):
        self.model_id = model_id
        self._open: dict[str, _OpenRequest] = {}

    def started(self, request_id: str) -> None:
        parent = trace.get_current_span().get_span_context()
        if _tracer is None or not parent.is_valid:
            return
        span = _tracer.start_span("llm_request", attributes={"gen_ai.request.id": request_id,
                                                              "gen_ai.response.model": self.model_id})
        self._open[request_id] = _OpenRequest(span, time.time_ns())

    def delta(self, request_id: str, delta: RequestDelta) -> None:
        request = self._open.get(request_id)
        if request is not None:
            if request.first_token_ns is None:
                request.first_token_ns = time.time_ns()
            request.tokens += sum(len(s.token_ids) for s in delta.seqs)
            request.prompt_tokens = delta.num_prompt_tokens

    def ended(self, request_id: str) -> None:
        request = self._open.pop(request_id, None)
        if request is None:
            return
        span, start = request.span, request.start_ns
        end = time.time_ns()
        first = request.first_token_ns or end
        parent = trace.set_span_in_context(span)
        _tracer.start_span("prefill", context=parent, start_time=start).end(end_time=first)
        _tracer.start_span("decode", context=parent, start_time=first).end(end_time=end)
        span.set_attributes({"gen_ai.usage.prompt_tokens": request.prompt_tokens,
                             "gen_ai.usage.completion_tokens": request.tokens,
                             "gen_ai.latency.time_to_first_token": (first - start) / 1e9,
                             "gen_ai.latency.e2e": (end - start) / 1e9})
        span.end(end_time=end)


class Observers:
    """Several stream observers as one (the engine takes one)."""

    def __init__(self, *observers):
        self.observers = observers

    def started(self, request_id: str) -> None:
        for observer in self.observers:
            observer.started(request_id)

    def delta(self, request_id: str, delta: RequestDelta) -> None:
        for observer in self.observers:
            observer.delta(request_id, delta)

    def ended(self, request_id: str) -> None:
        for observer in self.observers:
            observer.ended(request_id)
