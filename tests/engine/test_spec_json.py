"""A spec's JSON, as the store keeps it: a round trip, computed once, and the
memo that spares a node parsing the specs it has just stored."""

from __future__ import annotations

import dataclasses
import json

from wheel.engine import spec as spec_module
from wheel.engine.spec import (
    CatchUp,
    CatchUpMode,
    Cron,
    Interval,
    JobSpec,
    Once,
    Overlap,
    OverlapPolicy,
    Retry,
    SideEffect,
)

SPECS = [
    JobSpec(name="once", handler="h", schedule=Once(at_ms=1_800_000_000_000), payload=b"\x00\xff"),
    JobSpec(
        name="cron",
        handler="h",
        tenant="acme",
        schedule=Cron(expr="*/5 * * * *", time_zone="Europe/Berlin"),
        jitter_ms=250,
        catch_up=CatchUp(mode=CatchUpMode.RUN_ALL, window_ms=60_000, max_count=7),
        overlap=Overlap(policy=OverlapPolicy.BUFFER_ALL, max_buffered=3),
        retry=Retry(max_attempts=5, initial_backoff_ms=10, max_backoff_ms=1_000, multiplier=1.5),
        timeout_ms=9_000,
        side_effect=SideEffect.AT_MOST_ONCE,
        pool="gpu",
    ),
    JobSpec(name="every", handler="h", schedule=Interval(period_ms=2_000, start_at_ms=5)),
]


def test_json_round_trips_every_field() -> None:
    for spec in SPECS:
        text = spec.to_json()
        assert json.loads(text) == spec.to_dict()
        back = JobSpec.from_dict(json.loads(text))  # parsed, not remembered
        assert back == spec
        assert back.to_json() == text


def test_json_is_computed_once_and_a_copy_with_changes_gets_its_own() -> None:
    spec = JobSpec(name="a", handler="h", schedule=Once(at_ms=1))
    assert spec.to_json() is spec.to_json()
    renamed = dataclasses.replace(spec, name="b")
    assert json.loads(renamed.to_json())["name"] == "b"
    assert renamed != spec and json.loads(spec.to_json())["name"] == "a"


def test_a_spec_read_back_from_its_own_json_is_not_parsed_again() -> None:
    spec = JobSpec(name="fresh", handler="h", schedule=Once(at_ms=2))
    assert JobSpec.from_json(spec.to_json()) is spec
    # Text never serialized here is parsed, and keeps the text it came from.
    other = dataclasses.replace(spec, name="elsewhere")
    text = json.dumps(other.to_dict(), sort_keys=True, separators=(",", ":"))
    read = JobSpec.from_json(text + " ")  # not byte-equal to anything remembered
    assert read == other and read is not other
    assert read.to_json() == text + " "


def test_the_memo_keeps_only_the_latest() -> None:
    memo = spec_module._RecentSpecs(capacity=2)
    specs = [JobSpec(name=f"s{i}", handler="h", schedule=Once(at_ms=i)) for i in range(3)]
    for s in specs:
        memo.remember(s.to_json(), s)
    assert memo.get(specs[0].to_json()) is None
    assert memo.get(specs[1].to_json()) is specs[1]
    assert memo.get(specs[2].to_json()) is specs[2]
