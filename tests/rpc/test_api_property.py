"""SubmitJob, SubmitJobs and UpdateJob of a real node over real gRPC, driven
with generated specs, valid and malformed (``tests.strategies``): every
answer is OK or a documented refusal (INVALID_ARGUMENT naming the field,
ALREADY_EXISTS, NOT_FOUND, FAILED_PRECONDITION), never INTERNAL or UNKNOWN;
the node keeps serving; and what was accepted reads back as it was sent."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import fresh_schema
from tests.rpc.test_api import Api, InProcessServer, connect
from tests.strategies import (
    UPDATABLE,
    proto_copy,
    specs,
    submit_requests,
    update_fields,
)
from wheel.rpc.v1 import job_service_pb2, jobs_pb2

OK = grpc.StatusCode.OK
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
}
# "spec.retry.multiplier: must be ...": the field, then why.
FIELD = re.compile(r"^(spec(\.[a-z_]+)*|idempotency_key|jobs|fields|job_id|if_version|request): \S")
PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Model:
    """What the node was told and accepted: the test's own bookkeeping."""

    # (tenant, key) -> (the spec as sent, the job it made)
    keys: dict[tuple[str, str], tuple[bytes, int]] = field(default_factory=dict)
    jobs: list[int] = field(default_factory=list)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Api, Model]]:
    """A node on each store: what one takes, the other must take too."""
    with contextlib.ExitStack() as stack:
        store = None
        if request.param == "postgres":
            store = stack.enter_context(fresh_schema())
        server = InProcessServer(tmp_path_factory.mktemp("api-property"), store=store).start()
        stack.callback(server.stop)
        with connect(server) as api:
            yield api, Model()


def _defaults(sent: jobs_pb2.JobSpec, *, tenant: str | None = None) -> jobs_pb2.JobSpec:
    """The spec a node stores for ``sent``, by the proto's documented
    defaults (jobs.proto): 0 and empty mean the default, enums spelled out.
    An interval sent without a start keeps 0 here (the node's start is now
    + period, checked apart)."""
    out: jobs_pb2.JobSpec = proto_copy(sent)
    out.tenant = tenant if tenant is not None else (sent.tenant or "default")
    out.pool = sent.pool or "default"
    out.timeout_ms = sent.timeout_ms or 300_000
    out.side_effect = sent.side_effect or jobs_pb2.SIDE_EFFECT_IDEMPOTENT
    out.catch_up.mode = sent.catch_up.mode or jobs_pb2.CATCH_UP_MODE_RUN_LATEST_ONLY
    out.catch_up.max_count = sent.catch_up.max_count or 100
    out.overlap.policy = sent.overlap.policy or jobs_pb2.OVERLAP_POLICY_SKIP
    out.overlap.max_concurrent = sent.overlap.max_concurrent or 1
    out.overlap.max_buffered = sent.overlap.max_buffered or 100
    out.retry.max_attempts = sent.retry.max_attempts or 5
    out.retry.initial_backoff_ms = sent.retry.initial_backoff_ms or 1_000
    out.retry.max_backoff_ms = sent.retry.max_backoff_ms or 300_000
    out.retry.multiplier = sent.retry.multiplier or 2.0
    if out.HasField("priority") and out.priority == 5:
        out.ClearField("priority")  # the default, read back unset
    kind = out.schedule.WhichOneof("kind")
    if kind == "cron":
        c = out.schedule.cron
        c.time_zone = c.time_zone or "UTC"
        c.dst_gap = c.dst_gap or jobs_pb2.DST_GAP_FIRE_AT_TRANSITION
        c.dst_fold = c.dst_fold or jobs_pb2.DST_FOLD_FIRST
    elif kind == "interval":
        out.schedule.interval.mode = out.schedule.interval.mode or jobs_pb2.INTERVAL_MODE_FIXED_RATE
    return out


def assert_reads_back(api: Api, job: jobs_pb2.Job, expected: jobs_pb2.JobSpec) -> None:
    """GetJob (and the answer itself) hold ``expected``; an interval sent
    without a start got one a period after the submit or update."""
    got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    for spec in (job.spec, got.spec):
        spec = proto_copy(spec)
        no_start = expected.schedule.WhichOneof("kind") == "interval" and (
            expected.schedule.interval.start_at_ms == 0
        )
        if no_start:
            assert spec.schedule.interval.start_at_ms > 0
            spec.schedule.interval.start_at_ms = 0
        assert spec == expected, f"stored:\n{spec}\nsent (with defaults):\n{expected}"


def assert_refusal(code: grpc.StatusCode, message: str) -> None:
    assert code in REFUSALS, f"{code.name}: {message}"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert FIELD.match(message), f"the message names no field: {message!r}"


def assert_serving(api: Api) -> None:
    api.jobs.ListJobs(job_service_pb2.ListJobsRequest(page_size=1), timeout=10)


def check_submit(
    api: Api,
    model: Model,
    req: job_service_pb2.SubmitJobRequest,
    code: grpc.StatusCode,
    message: str,
    answer: job_service_pb2.SubmitJobResponse | None,
) -> None:
    """One submit's outcome against the model, and the model updated."""
    tenant = req.spec.tenant or "default"
    sent = req.spec.SerializeToString(deterministic=True)
    before = model.keys.get((tenant, req.idempotency_key)) if req.idempotency_key else None
    event(f"submit: {code.name} {message.partition(':')[0]}")
    if code != OK:
        assert_refusal(code, message)
        if code == grpc.StatusCode.ALREADY_EXISTS:
            assert before is not None and before[0] != sent, message
        return
    assert answer is not None
    if before is not None:
        assert before[0] == sent, "a key used with another body was accepted"
        assert not answer.created and answer.job.job_id == before[1]
        return
    assert answer.created
    assert_reads_back(api, answer.job, _defaults(req.spec))
    model.jobs.append(answer.job.job_id)
    if req.idempotency_key:
        model.keys[(tenant, req.idempotency_key)] = (sent, answer.job.job_id)


@PROPERTY
@given(req=submit_requests(), again=st.booleans())
def test_submit_job_answers_documented_codes_and_reads_back_what_it_took(
    node: tuple[Api, Model], req: job_service_pb2.SubmitJobRequest, again: bool
) -> None:
    api, model = node
    for _ in range(2 if again else 1):  # a retry of the same request
        try:
            answer = api.jobs.SubmitJob(req, timeout=10)
        except grpc.RpcError as e:
            check_submit(api, model, req, e.code(), e.details() or "", None)
        else:
            check_submit(api, model, req, OK, "", answer)
    if req.idempotency_key and req.HasField("spec"):
        # The same key with another body.
        other = proto_copy(req)
        other.spec.handler = other.spec.handler + "-other"
        try:
            answer = api.jobs.SubmitJob(other, timeout=10)
        except grpc.RpcError as e:
            check_submit(api, model, other, e.code(), e.details() or "", None)
        else:
            check_submit(api, model, other, OK, "", answer)
    assert_serving(api)


@PROPERTY
@given(reqs=st.lists(submit_requests(), max_size=6), lean=st.booleans())
def test_submit_jobs_answers_each_item_with_a_documented_code(
    node: tuple[Api, Model], reqs: list[job_service_pb2.SubmitJobRequest], lean: bool
) -> None:
    api, model = node
    out = api.jobs.SubmitJobs(job_service_pb2.SubmitJobsRequest(jobs=reqs, lean=lean), timeout=30)
    assert len(out.results) == len(reqs)
    for req, result in zip(reqs, out.results, strict=True):
        if result.HasField("response"):
            answer = result.response
            if lean and answer.created:
                answer = proto_copy(answer)
                answer.job.spec.CopyFrom(
                    api.jobs.GetJob(
                        job_service_pb2.GetJobRequest(job_id=answer.job.job_id), timeout=10
                    ).spec
                )
            check_submit(api, model, req, OK, "", answer)
        else:
            code = grpc.StatusCode[result.error_code]
            check_submit(api, model, req, code, result.error_message, None)
    assert_serving(api)


@PROPERTY
@given(
    data=st.data(),
    spec=specs(),
    fields=update_fields(),
    key=st.sampled_from(["", "u1", "u2"]),
    if_version=st.sampled_from([None, None, None, None, -1, 0, 1, 2]),
)
def test_update_job_answers_documented_codes_and_reads_back_what_it_took(
    node: tuple[Api, Model],
    data: st.DataObject,
    spec: jobs_pb2.JobSpec,
    fields: list[str],
    key: str,
    if_version: int | None,
) -> None:
    api, model = node
    if not model.jobs:  # a job to update
        req = job_service_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec(name="u", handler="h"))
        req.spec.schedule.interval.period_ms = 60_000
        model.jobs.append(api.jobs.SubmitJob(req, timeout=10).job.job_id)
    # Drawn apart from the model (whose jobs differ from run to run): which
    # known job, or an unknown id.
    # Every draw is made whatever the node holds, so that hypothesis, which
    # replays an example against a node that has moved on, draws the same.
    pick = data.draw(st.integers(0, 2**16), "which job")
    unknown = data.draw(st.sampled_from([None, None, None, None, 0, -1, 2**63 - 1]), "unknown")
    cancel_first = data.draw(st.integers(0, 9), "cancel first") == 0
    job_id = model.jobs[pick % len(model.jobs)] if unknown is None else unknown
    req = job_service_pb2.UpdateJobRequest(
        job_id=job_id, spec=spec, fields=fields, idempotency_key=key
    )
    if if_version is not None:
        req.if_version = if_version
    before = None
    if job_id in model.jobs:
        if cancel_first:  # FAILED_PRECONDITION
            api.jobs.CancelJob(job_service_pb2.JobRef(job_id=job_id), timeout=10)
            model.jobs.remove(job_id)  # later examples update live jobs
        before = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
    try:
        answer = api.jobs.UpdateJob(req, timeout=10)
    except grpc.RpcError as e:
        event(f"update: {e.code().name} {(e.details() or '').partition(':')[0]}")
        assert_refusal(e.code(), e.details() or "")
        if before is not None:  # a refused update changes nothing
            after = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)
            assert after.spec == before.spec
    else:
        event(f"update: OK updated={answer.updated}")
        assert before is not None
        if answer.updated:
            named = set(fields) or set(UPDATABLE)
            expected = _defaults(spec, tenant=before.spec.tenant)
            for name in UPDATABLE:
                if name not in named:
                    source = getattr(before.spec, name)
                    if name == "priority":  # optional: kept set or unset
                        expected.ClearField("priority")
                        if before.spec.HasField("priority"):
                            expected.priority = source
                    elif hasattr(source, "CopyFrom"):
                        getattr(expected, name).CopyFrom(source)
                    else:
                        setattr(expected, name, source)
            if "schedule" not in named or not spec.HasField("schedule"):
                # A kept schedule reads back as it was, start and all.
                expected.schedule.CopyFrom(before.spec.schedule)
            assert_reads_back(api, answer.job, expected)
    assert_serving(api)


# -- bytes that are not the message ---------------------------------------------------

METHODS = {
    "SubmitJob": job_service_pb2.SubmitJobResponse,
    "SubmitJobs": job_service_pb2.SubmitJobsResponse,
    "UpdateJob": job_service_pb2.UpdateJobResponse,
}


@st.composite
def wire_bytes(draw: st.DrawFn) -> bytes:
    """A request's bytes as a broken or hostile client may send them: a
    valid request cut short or with bytes changed, or noise."""
    req = draw(submit_requests())
    body: bytes = req.SerializeToString()
    how = draw(st.sampled_from(["cut", "flip", "noise", "as-is"]))
    if how == "cut" and body:
        return body[: draw(st.integers(0, len(body) - 1))]
    if how == "flip" and body:
        i = draw(st.integers(0, len(body) - 1))
        return body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1 :]
    if how == "noise":
        return draw(st.binary(max_size=64))
    return body


@PROPERTY
@given(method=st.sampled_from(sorted(METHODS)), body=wire_bytes())
def test_bytes_that_are_not_a_request_get_a_documented_code(
    node: tuple[Api, Model], method: str, body: bytes
) -> None:
    api, _ = node
    call = api.channel.unary_unary(f"/wheel.rpc.v1.JobService/{method}")
    try:
        call(body, timeout=10)
    except grpc.RpcError as e:
        event(f"{method}: {e.code().name} {(e.details() or '').partition(':')[0]}")
        assert_refusal(e.code(), e.details() or "")
    assert_serving(api)


def test_a_request_whose_bytes_are_not_its_message_is_invalid_argument(
    node: tuple[Api, Model],
) -> None:
    """Found by the property above: grpc answered UNKNOWN ("Unexpected
    DecodeError") for a corrupt request or a string field of bad UTF-8."""
    api, _ = node
    call = api.channel.unary_unary("/wheel.rpc.v1.JobService/SubmitJob")
    bad_utf8 = bytes([0x0A, 0x06, 0x0A, 0x04]) + b"\xff\xfe\xfd\xfc"  # spec.name
    good = job_service_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec(name="x", handler="h"))
    for body in (bad_utf8, good.SerializeToString()[:-1], b"\xff\xff\xff\xff"):
        with pytest.raises(grpc.RpcError) as err:
            call(body, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(
            "request: not a /wheel.rpc.v1.JobService/SubmitJob request message"
        )
    assert_serving(api)


def test_a_nul_character_in_a_text_field_is_refused_and_fails_no_other_submit(
    node: tuple[Api, Model],
) -> None:
    """Found by the property on PostgreSQL, whose text holds no NUL: a name,
    tenant or idempotency key with one answered INTERNAL, and failed every
    other submit of its store batch with it (SQLite took it)."""
    api, _ = node
    good = [
        job_service_pb2.SubmitJobRequest(spec=jobs_pb2.JobSpec(name=f"nul-{i}", handler="h"))
        for i in range(3)
    ]
    bad = {
        "spec.name": job_service_pb2.SubmitJobRequest(
            spec=jobs_pb2.JobSpec(name="a\0", handler="h")
        ),
        "spec.handler": job_service_pb2.SubmitJobRequest(
            spec=jobs_pb2.JobSpec(name="n", handler="\0")
        ),
        "spec.tenant": job_service_pb2.SubmitJobRequest(
            spec=jobs_pb2.JobSpec(name="n", handler="h", tenant="t\0")
        ),
        "spec.pool": job_service_pb2.SubmitJobRequest(
            spec=jobs_pb2.JobSpec(name="n", handler="h", pool="p\0")
        ),
        "idempotency_key": job_service_pb2.SubmitJobRequest(
            spec=jobs_pb2.JobSpec(name="n", handler="h"), idempotency_key="k\0"
        ),
    }
    for req in [*good, *bad.values()]:
        req.spec.schedule.interval.period_ms = 60_000
    out = api.jobs.SubmitJobs(job_service_pb2.SubmitJobsRequest(jobs=[*good, *bad.values()]))
    assert [r.HasField("response") for r in out.results[:3]] == [True] * 3
    for result, field_name in zip(out.results[3:], bad, strict=True):
        assert result.error_code == "INVALID_ARGUMENT"
        assert result.error_message == f"{field_name}: must not contain a NUL character"
    for field_name, req in bad.items():
        with pytest.raises(grpc.RpcError) as err:
            api.jobs.SubmitJob(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field_name}: must not contain a NUL")
    with pytest.raises(grpc.RpcError) as err:
        api.jobs.ListJobs(job_service_pb2.ListJobsRequest(name_prefix="a\0"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("zone", ["posix/Asia/Tokyo", "right/UTC", "posixrules"])
def test_a_zone_file_that_is_not_an_iana_name_is_refused(
    node: tuple[Api, Model], zone: str
) -> None:
    """ZoneInfo opens any file of the system's zoneinfo directory: such a
    job fired here and could not compile on a node with the tzdata package's
    zones only."""
    api, _ = node
    spec = jobs_pb2.JobSpec(name="zone", handler="h")
    spec.schedule.cron.CopyFrom(jobs_pb2.CronSchedule(expr="0 9 * * *", time_zone=zone))
    ok = jobs_pb2.JobSpec(name="zone", handler="h")
    ok.schedule.cron.CopyFrom(jobs_pb2.CronSchedule(expr="0 9 * * *", time_zone="Asia/Tokyo"))
    job_id = api.jobs.SubmitJob(job_service_pb2.SubmitJobRequest(spec=ok), timeout=10).job.job_id
    update = job_service_pb2.UpdateJobRequest(job_id=job_id, spec=spec, fields=["schedule"])
    preview = job_service_pb2.PreviewScheduleRequest(schedule=spec.schedule)
    for call, request in (
        (api.jobs.SubmitJob, job_service_pb2.SubmitJobRequest(spec=spec)),
        (api.jobs.UpdateJob, update),
        (api.jobs.PreviewSchedule, preview),
    ):
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == (
            f"spec.schedule.cron.time_zone: unknown IANA time zone {zone!r}"
        )
