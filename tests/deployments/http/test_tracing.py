"""OpenTelemetry traces through the served app: a request continuing its caller's `traceparent` gives the span
tree (the HTTP side's span, the replica's `llm_request`, its `prefill` and `decode`), for a chat and for the
Responses API over it, exported by the real OTLP exporter to a receiver the test runs."""

import pytest
import requests

from testing.helpers import wait_until
from testing.otlp_receiver import OtlpReceiver
from tests.conftest import MODEL_ID, another_app, app_args

TRACE_ID, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
RESPONSES_TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"


@pytest.fixture(scope="module")
def receiver():
    receiver = OtlpReceiver()
    yield receiver
    receiver.stop()


def test_a_request_continues_its_callers_trace_to_the_engine(server, receiver, tmp_path):
    args = app_args(server.model_dir, f"file://{tmp_path}")
    args["otlp_traces_endpoint"] = receiver.url
    with another_app(server, "traced", args) as url:
        reply = requests.post(f"{url}/v1/chat/completions", headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"},
                              json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 5, "ignore_eos": True, "stream": True})
        assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
        reply = requests.post(f"{url}/v1/responses", json={"model": MODEL_ID, "input": "hi", "max_output_tokens": 3},
                              headers={"traceparent": f"00-{RESPONSES_TRACE}-{CALLER_SPAN}-01"})
        assert reply.status_code == 200

        def tree(trace_id: str, route: str):
            spans = {s["name"]: s for s in receiver.spans if s["trace_id"] == trace_id}
            return spans if {f"POST {route}", "llm_request", "prefill", "decode"} <= set(spans) else None

        # the exporters send in batches, every few seconds
        spans = wait_until(lambda: tree(TRACE_ID, "/v1/chat/completions"), timeout=60, every=0.5)
        responses = wait_until(lambda: tree(RESPONSES_TRACE, "/v1/responses"), timeout=60, every=0.5)
    http, request = spans["POST /v1/chat/completions"], spans["llm_request"]
    assert http["parent_id"] == CALLER_SPAN and http["service"] == "rayllm-http"
    assert http["attributes"]["http.status_code"] == 200
    assert request["parent_id"] == http["span_id"] and request["service"] == f"rayllm-replica {MODEL_ID}"
    assert spans["prefill"]["parent_id"] == spans["decode"]["parent_id"] == request["span_id"]
    attributes = request["attributes"]
    assert attributes["gen_ai.usage.completion_tokens"] == 5 and attributes["gen_ai.usage.prompt_tokens"] > 0
    assert attributes["gen_ai.response.model"] == MODEL_ID and attributes["gen_ai.request.id"].startswith("chatcmpl-")
    assert 0 < attributes["gen_ai.latency.time_to_first_token"] <= attributes["gen_ai.latency.e2e"]
    # the Responses API calls chat on the replica: its request span is under the route's too
    assert responses["llm_request"]["parent_id"] == responses["POST /v1/responses"]["span_id"]
