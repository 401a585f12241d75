"""A spec's JSON, as the store keeps it: a round trip, computed once, and kept
by a spec read from it."""

from __future__ import annotations

import dataclasses
import json

from wheel.engine.profiles import profile_of, split_spec
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
from wheel.errors import InvalidArgument

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
    JobSpec(
        name="skips",
        handler="h",
        schedule=Interval(period_ms=2_000, start_at_ms=5),
        skip_calendars=("holidays", "weekend"),
    ),
    JobSpec(name="keyed", handler="h", schedule=Once(at_ms=5), concurrency_key="db.main"),
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


def test_a_spec_read_from_json_keeps_the_text_it_came_from() -> None:
    spec = JobSpec(name="fresh", handler="h", schedule=Once(at_ms=2))
    text = json.dumps(spec.to_dict(), sort_keys=True, separators=(",", ":"))
    read = JobSpec.from_json(text + " ")  # stored text need not be byte-equal
    assert read == spec and read is not spec
    assert read.to_json() == text + " "


def test_a_profile_writes_each_job_s_json_as_the_spec_does() -> None:
    for spec in SPECS:
        template, param = split_spec(spec)
        assert (
            profile_of(template).spec_json(spec.name, param)
            == dataclasses.replace(spec, payload=b"").to_json()
        )


def test_a_spec_without_a_concurrency_key_keeps_the_json_it_always_had() -> None:
    spec = JobSpec(name="every", handler="h", schedule=Interval(period_ms=2_000, start_at_ms=5))
    assert "concurrency_key" not in spec.to_json()
    keyed = dataclasses.replace(spec, concurrency_key="db")
    assert json.loads(keyed.to_json())["concurrency_key"] == "db"
    assert JobSpec.from_json(keyed.to_json()).concurrency_key == "db"


def test_a_concurrency_key_is_text_without_whitespace() -> None:
    spec = JobSpec(name="n", handler="h", schedule=Once(at_ms=5))
    for bad in ("a b", "x" * 101, "nul\0"):
        try:
            dataclasses.replace(spec, concurrency_key=bad).validate()
        except InvalidArgument as exc:
            assert "spec.concurrency_key" in str(exc)
        else:  # pragma: no cover - the assertion's message
            raise AssertionError(f"{bad!r} was accepted")
