"""The idempotency keys a bulk submit generates for its jobs: 128 random bits
each, drawn in blocks, never the same twice."""

from __future__ import annotations

import re

from wheel.client._wire import GeneratedKeys, generated_key

KEY = re.compile(r"wheel-client-[0-9a-f]{32}")


def test_a_bulk_submits_keys_are_shaped_like_one_submits_and_all_differ() -> None:
    keys = GeneratedKeys()
    drawn = [keys() for _ in range(3 * GeneratedKeys.AT_ONCE + 7)]  # over several blocks
    assert all(KEY.fullmatch(k) for k in drawn)
    assert KEY.fullmatch(generated_key())
    assert len(set(drawn)) == len(drawn)
    assert not set(drawn) & {GeneratedKeys()() for _ in range(GeneratedKeys.AT_ONCE)}
