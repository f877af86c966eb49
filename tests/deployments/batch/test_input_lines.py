"""Batch input lines are parsed as strictly as request bodies: UTF-8 only, no NaN, bounded nesting."""

import json

import pytest

from deployments.batch.input_line import LineError, parse_line

LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "hi"}}


@pytest.mark.parametrize("raw, reason", [
    (json.dumps(LINE).encode("utf-16"), "not valid JSON"),  # starts FF FE: never sniffed as UTF-16
    (json.dumps({**LINE, "body": {**LINE["body"], "temperature": float("nan")}}).encode(), "NaN"),
    (b'{"custom_id": "a", "body": ' + b"[" * 100 + b"]" * 100 + b"}", "nested"),
    (b'{"custom_id": "\\ud800"}', "surrogate"),
])
def test_lines_that_are_not_strict_json_are_refused_with_a_reason(raw, reason):
    with pytest.raises(LineError, match=reason):
        parse_line(raw, "/v1/completions", {"m"}, set(), 1 << 20)


def test_a_strict_line_parses():
    request = parse_line(json.dumps(LINE).encode(), "/v1/completions", {"m"}, set(), 1 << 20)
    assert request.custom_id == "a" and request.model == "m"
