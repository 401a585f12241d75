"""``wheel.http_targets``: a target checked and normalised, kept as the
stored ``HttpCall`` and read back out of it, for every edge that converts."""

from __future__ import annotations

import pytest

from wheel import http_targets
from wheel.engine.spec import JobSpec, Once
from wheel.errors import InvalidArgument
from wheel.rpc import convert
from wheel.rpc.v1 import jobs_pb2


def normal(t: jobs_pb2.HttpTarget, job_timeout_ms: int = 300_000) -> jobs_pb2.HttpTarget:
    return http_targets.normalised_target(t, tenant="default", job_timeout_ms=job_timeout_ms)


def test_normalising_upper_cases_the_method_and_resolves_the_timeout() -> None:
    t = normal(jobs_pb2.HttpTarget(url="HTTPS://Example.com/x", method="delete"))
    assert (t.url, t.method, t.timeout_ms) == ("HTTPS://Example.com/x", "DELETE", 30_000)
    assert normal(jobs_pb2.HttpTarget(url="http://h/")).method == "POST"
    assert normal(jobs_pb2.HttpTarget(url="http://h/", timeout_ms=90_000), 20_000).timeout_ms == (
        20_000
    )
    # Normalising a normalised target changes nothing.
    assert normal(t) == t


def test_a_name_that_is_only_a_scheme_and_port_has_no_host() -> None:
    with pytest.raises(InvalidArgument, match=r"spec\.http\.url: has no host"):
        normal(jobs_pb2.HttpTarget(url="http://:80/x"))


def test_the_url_length_limit_is_2048_characters_inclusive() -> None:
    base = "https://example.com/"
    url = base + "a" * (http_targets.MAX_URL_LEN - len(base))
    assert normal(jobs_pb2.HttpTarget(url=url)).url == url
    with pytest.raises(InvalidArgument, match="2049 characters"):
        normal(jobs_pb2.HttpTarget(url=url + "a"))


def test_a_signing_secret_is_asked_of_secret_known_with_the_tenant() -> None:
    asked: list[tuple[str, str]] = []

    def known(tenant: str, name: str) -> bool:
        asked.append((tenant, name))
        return name == "there"

    def target(secret: str) -> jobs_pb2.HttpTarget:
        return http_targets.normalised_target(
            jobs_pb2.HttpTarget(url="http://h/", signing_secret=secret),
            tenant="acme",
            job_timeout_ms=1_000,
            secret_known=known,
        )

    with pytest.raises(InvalidArgument, match="tenant 'acme' has no signing secret 'missing'"):
        target("missing")
    assert target("there").signing_secret == "there"
    assert asked == [("acme", "missing"), ("acme", "there")]
    # Unsigned targets ask nothing.
    normal(jobs_pb2.HttpTarget(url="http://h/"))
    assert len(asked) == 2


def _spec(**kw: object) -> JobSpec:
    return JobSpec(name="j", handler="h", schedule=Once(at_ms=1), **kw)  # type: ignore[arg-type]


def test_a_spec_round_trips_through_the_wire_with_its_target_and_body() -> None:
    msg = jobs_pb2.JobSpec(name="j", payload=b"body", timeout_ms=60_000)
    msg.schedule.once.at_ms = 1
    msg.http.url = "http://h/x"
    spec = convert.spec_from_proto(msg, now_ms=0, sent=True)
    assert spec.handler == "http"
    assert http_targets.body_of(spec) == b"body"
    target = http_targets.target_of(spec)
    assert target is not None and target.timeout_ms == 30_000
    back = convert.spec_to_proto(spec)
    assert back.handler == "http" and back.payload == b"body" and back.http == target
    # A handler's job shows no target, and its payload as it is.
    plain = _spec(payload=b"\n\x02\n\x00")  # bytes that parse as an HttpCall
    assert not convert.spec_to_proto(plain).HasField("http")
    assert http_targets.body_of(plain) == b"\n\x02\n\x00"


def test_a_stored_spec_from_elsewhere_is_checked_as_a_submit() -> None:
    call = http_targets.call_payload(jobs_pb2.HttpTarget(url="http://h/", method="get"), b"b")
    spec = http_targets.stored_spec(
        JobSpec(name="j", handler="http", schedule=Once(at_ms=1), payload=call, timeout_ms=5_000)
    )
    target = http_targets.target_of(spec)
    assert target is not None and (target.method, target.timeout_ms) == ("GET", 5_000)
    with pytest.raises(InvalidArgument, match="reserved"):
        http_targets.stored_spec(JobSpec(name="j", handler="http", schedule=Once(at_ms=1)))
    bad = http_targets.call_payload(jobs_pb2.HttpTarget(url="ftp://h/"), b"")
    with pytest.raises(InvalidArgument, match=r"spec\.http\.url"):
        http_targets.stored_spec(
            JobSpec(name="j", handler="http", schedule=Once(at_ms=1), payload=bad)
        )
    assert http_targets.stored_spec(_spec(payload=b"x")).payload == b"x"


def test_the_history_keeps_a_target_without_its_body() -> None:
    call = http_targets.call_payload(jobs_pb2.HttpTarget(url="http://h/"), b"big body")
    spec = JobSpec(name="j", handler="http", schedule=Once(at_ms=1), payload=call)
    kept = http_targets.history_spec(spec)
    assert http_targets.target_of(kept) == http_targets.target_of(spec)
    assert http_targets.body_of(kept) == b""
    assert http_targets.history_spec(_spec(payload=b"p")).payload == b""
