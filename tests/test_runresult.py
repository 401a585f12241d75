"""The node's rules for what a worker sends as a run's result and its
Retry-After, and the few words a table shows of a result."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from wheel.runresult import (
    MAX_RESULT_BYTES,
    MAX_RETRY_AFTER_MS,
    checked_result,
    clamp_retry_after,
    parse_result,
    summary,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), _json, max_size=6))
def test_a_json_object_within_the_limit_is_kept_as_it_came(value: dict[str, object]) -> None:
    text = json.dumps(value)
    assert checked_result(text) == text
    assert parse_result(checked_result(text)) == value


@given(_json.filter(lambda v: not isinstance(v, dict)))
def test_any_other_json_becomes_an_error_object(value: object) -> None:
    refused = json.loads(checked_result(json.dumps(value)))
    assert list(refused) == ["error"] and "not an object" in refused["error"]


def test_text_that_is_not_json_or_is_too_big_becomes_an_error_object() -> None:
    for text, why in (
        ("{", "not JSON"),
        ('{"x": Infinity}', "not JSON"),
        ('{"x": "\u00e9' + "y" * MAX_RESULT_BYTES + '"}', "over the limit of 65536"),
    ):
        refused = json.loads(checked_result(text))
        assert why in refused["error"] and len(refused["error"]) < 300


def test_the_largest_result_is_kept() -> None:
    text = json.dumps({"value": "x" * (MAX_RESULT_BYTES - 13)})
    assert len(text.encode()) == MAX_RESULT_BYTES
    assert checked_result(text) == text


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_retry_after_is_held_within_zero_and_a_day(ms: int) -> None:
    held = clamp_retry_after(ms)
    assert 0 <= held <= MAX_RETRY_AFTER_MS == 86_400_000
    assert held == ms or not 0 <= ms <= MAX_RETRY_AFTER_MS


def test_summaries_say_a_result_in_a_few_words() -> None:
    assert summary(None) == "" and summary({}) == ""
    assert summary({"http_status": 503, "duration_ms": 12, "response_excerpt": "x"}) == (
        "http 503 12ms"
    )
    assert summary({"value": {"rows": 3}}) == '{"rows":3}'
    assert summary({"value": "a\nb"}, 40) == '"a\\nb"'
    assert summary({"error": "connection refused"}) == "error: connection refused"
    long = summary({"value": "x" * 100}, 20)
    assert len(long) == 20 and long.endswith("…")
