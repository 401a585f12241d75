"""Jobs with an HTTP target over real gRPC on a real node: the target is
checked when it is sent (every refusal names its field), kept as the job's
stored ``HttpCall`` and shown back as ``spec.http`` with the body as the
payload; a run hands the call out as ``Assignment.payload``; and everything
else a job has (pause, resume, preview, trigger, update and its history,
backfill, dead letters) works as for a handler's job."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    all_runs,
    connect,
    cron,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from tests.rpc.test_protocol_abuse import RawWorker, ack, complete
from wheel.rpc.v1 import admin_service_pb2, job_service_pb2, jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb

SECRETS = [("default", "hooks.v1"), ("default", "s1"), ("acme", "s1")]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = InProcessServer(tmp_path_factory.mktemp("http-targets")).start()
    try:
        with connect(server) as a:
            # The signing secrets the targets below name.
            for tenant, name in SECRETS:
                a.admin.SetSecret(
                    admin_service_pb2.SetSecretRequest(tenant=tenant, name=name, generate=True),
                    timeout=10,
                )
            yield a
    finally:
        server.stop()


def target(url: str = "https://hooks.example.com/wheel?x=1", **kw: Any) -> jobs_pb2.HttpTarget:
    return jobs_pb2.HttpTarget(url=url, **kw)


def http_spec(t: jobs_pb2.HttpTarget | None = None, **kw: Any) -> jobs_pb2.JobSpec:
    msg = spec(**kw)
    msg.handler = kw.get("handler", "")
    msg.http.CopyFrom(t if t is not None else target())
    return msg


def refused(api: Api, msg: jobs_pb2.JobSpec) -> str:
    before = len(api.jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10).jobs)
    with pytest.raises(grpc.RpcError) as info:
        submit(api, msg)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = len(api.jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10).jobs)
    assert after == before  # nothing made
    return str(info.value.details())


def update(
    api: Api, job_id: int, msg: jobs_pb2.JobSpec, *fields: str
) -> job_service_pb2.UpdateJobResponse:
    return api.jobs.UpdateJob(  # type: ignore[no-any-return]
        job_service_pb2.UpdateJobRequest(job_id=job_id, spec=msg, fields=list(fields)),
        timeout=10,
    )


def get(api: Api, job_id: int) -> jobs_pb2.Job:
    return api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)  # type: ignore[no-any-return]


def test_a_target_is_kept_normalised_and_read_back_as_http_with_its_body(api: Api) -> None:
    sent = target(
        method="put",
        headers=[jobs_pb2.HttpHeader(name="X-Team", value="ops"),
                 jobs_pb2.HttpHeader(name="Authorization", value="Bearer t")],
        signing_secret="hooks.v1",
        retry_4xx=True,
    )  # fmt: skip
    made = submit(api, http_spec(sent, payload=b'{"id":7}', schedule=cron("*/5 * * * *"))).job
    assert made.spec.handler == "http" and made.spec.payload == b'{"id":7}'
    t = made.spec.http
    assert (t.url, t.method, t.timeout_ms) == (sent.url, "PUT", 30_000)
    assert [(h.name, h.value) for h in t.headers] == [
        ("X-Team", "ops"),
        ("Authorization", "Bearer t"),
    ]
    assert t.signing_secret == "hooks.v1" and t.retry_4xx and not t.follow_redirects
    got = get(api, made.job_id)
    assert got.spec == made.spec
    [listed] = [
        j
        for j in api.jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10).jobs
        if j.job_id == made.job_id
    ]
    assert listed.spec == made.spec
    # Stored as the engine keeps any job: handler "http", the call as payload.
    record = api.server.run(api.server.node.get_job(made.job_id))  # type: ignore[union-attr]
    call = jobs_pb2.HttpCall.FromString(record.spec.payload)
    assert record.spec.handler == "http" and call.body == b'{"id":7}' and call.target == t


def test_the_handler_http_is_given_or_none_and_reserved_for_targets(api: Api) -> None:
    assert submit(api, http_spec(handler="http")).job.spec.handler == "http"
    assert refused(api, http_spec(handler="send_report")).startswith("spec.handler:")
    assert "reserved" in refused(api, spec(handler="http"))


def test_an_http_timeout_defaults_to_30s_and_never_outlasts_the_job(api: Api) -> None:
    short = submit(api, http_spec(timeout_ms=5_000)).job.spec
    assert short.http.timeout_ms == 5_000  # the default cut to the job's timeout
    given = submit(api, http_spec(target(timeout_ms=60_000), timeout_ms=10_000)).job.spec
    assert given.http.timeout_ms == 10_000
    assert submit(api, http_spec(target(timeout_ms=1))).job.spec.http.timeout_ms == 1


@pytest.mark.parametrize(
    ("t", "field", "says"),
    [
        (target(url=""), "spec.http.url", "required"),
        (target(url="ftp://example.com/x"), "spec.http.url", "scheme"),
        (target(url="example.com/x"), "spec.http.url", "scheme"),
        (target(url="https:///path"), "spec.http.url", "no host"),
        (target(url="https://user:pw@example.com/"), "spec.http.url", "credentials"),
        (target(url="https://example.com:99999/"), "spec.http.url", "not a URL"),
        (target(url="https://example.com/a b"), "spec.http.url", "space"),
        (target(url="https://example.com/" + "a" * 2048), "spec.http.url", "2048"),
        (target(method="FETCH"), "spec.http.method", "not one of"),
        (target(timeout_ms=-1), "spec.http.timeout_ms", "negative"),
        (target(signing_secret="no spaces"), "spec.http.signing_secret", "secret's name"),
        (target(signing_secret="x" * 129), "spec.http.signing_secret", "128"),
        (
            target(headers=[jobs_pb2.HttpHeader(name="Bad Name", value="v")]),
            "spec.http.headers[0].name",
            "not a header name",
        ),
        (
            target(headers=[jobs_pb2.HttpHeader(name="X-A", value="v\r\nX-Evil: 1")]),
            "spec.http.headers[0].value",
            "CR",
        ),
        (
            target(
                headers=[
                    jobs_pb2.HttpHeader(name="X-A", value="1"),
                    jobs_pb2.HttpHeader(name="Webhook-Signature", value="v1,x"),
                ]
            ),
            "spec.http.headers[1].name",
            "set by the executor",
        ),
        (
            target(headers=[jobs_pb2.HttpHeader(name=f"X-{i}", value="v") for i in range(65)]),
            "spec.http.headers",
            "64",
        ),
        (
            target(headers=[jobs_pb2.HttpHeader(name="X-Big", value="v" * 9000)]),
            "spec.http.headers",
            "8192",
        ),
    ],
)
def test_a_bad_target_is_refused_naming_its_field_and_nothing_is_made(
    api: Api, t: jobs_pb2.HttpTarget, field: str, says: str
) -> None:
    details = refused(api, http_spec(t))
    assert details.startswith(f"{field}:") and says in details


def test_each_reserved_header_is_refused_whatever_its_case(api: Api) -> None:
    for name in ("Idempotency-Key", "wheel-fence", "WHEEL-ATTEMPT", "Host", "traceparent"):
        t = target(headers=[jobs_pb2.HttpHeader(name=name, value="x")])
        assert "set by the executor" in refused(api, http_spec(t))


def test_a_private_literal_address_is_left_to_the_executor(api: Api) -> None:
    for url in ("http://127.0.0.1:8080/hook", "http://10.0.0.5/x", "http://[::1]:9/x"):
        assert submit(api, http_spec(target(url=url))).job.spec.http.url == url


def test_a_bulk_submit_checks_each_target_on_its_own(api: Api) -> None:
    good = http_spec(payload=b"b")
    bad = http_spec(target(url="gopher://x"))
    answer = api.jobs.SubmitJobs(
        job_service_pb2.SubmitJobsRequest(
            jobs=[job_service_pb2.SubmitJobRequest(spec=m) for m in (good, bad, good)]
        ),
        timeout=10,
    )
    first, second, third = answer.results
    assert first.response.job.spec.http.url == good.http.url
    assert first.response.job.spec.payload == b"b"
    assert second.error_code == "INVALID_ARGUMENT" and "spec.http.url" in second.error_message
    assert third.response.job.job_id


def test_a_run_hands_the_call_out_as_its_payload_and_the_job_works_as_any_other(
    api: Api,
) -> None:
    t = target(url="http://127.0.0.1:9/hook", signing_secret="s1")
    made = submit(
        api,
        http_spec(
            t,
            name="pinger",
            payload=b"ping",
            schedule=cron("0 * * * *"),
            retry=jobs_pb2.RetryPolicy(max_attempts=2, initial_backoff_ms=1),
        ),
    ).job
    job_id = made.job_id
    # Pause and resume keep the target.
    paused = api.jobs.PauseJob(job_service_pb2.JobRef(job_id=job_id), timeout=10)
    assert paused.state == jobs_pb2.JOB_STATE_PAUSED and paused.spec.http == made.spec.http
    resumed = api.jobs.ResumeJob(job_service_pb2.JobRef(job_id=job_id), timeout=10)
    assert resumed.state == jobs_pb2.JOB_STATE_ACTIVE and resumed.spec == made.spec
    # Preview: the schedule's own fires.
    preview = api.jobs.PreviewSchedule(
        job_service_pb2.PreviewScheduleRequest(job_id=job_id, count=3), timeout=10
    )
    assert len(preview.fires_ms) == 3 and preview.fires_ms[1] - preview.fires_ms[0] == 3_600_000
    worker = RawWorker(api.server.target, "raw-http", capacity=4, handlers=["http"])
    try:
        trig = api.jobs.TriggerJob(job_service_pb2.JobRef(job_id=job_id), timeout=10)
        got = worker.expect("assignments", where=lambda m: len(m.assignments.assignments) > 0)
        [a] = got.assignments.assignments
        assert a.handler == "http" and a.job_id == job_id
        assert a.scheduled_for_ms == trig.scheduled_for_ms
        call = jobs_pb2.HttpCall.FromString(a.payload)
        assert call.body == b"ping" and call.target == made.spec.http
        # A 5xx-like failure is retried under the job's policy, then dead-lettered.
        worker.send(ack((a.run_id, a.fence)))
        worker.send(complete(a.run_id, a.fence, pb.OUTCOME_RETRYABLE))
        again = worker.expect("assignments", where=lambda m: len(m.assignments.assignments) > 0)
        [b] = again.assignments.assignments
        assert b.fence > a.fence and jobs_pb2.HttpCall.FromString(b.payload) == call
        worker.send(ack((b.run_id, b.fence)))
        worker.send(complete(b.run_id, b.fence, pb.OUTCOME_RETRYABLE))
        wait_for(
            lambda: any(r.state == jobs_pb2.RUN_STATE_DEAD_LETTERED for r in all_runs(api, job_id)),
            10,
            "the dead letter",
        )
    finally:
        worker.close()
    dead = api.jobs.ListDeadLetters(
        job_service_pb2.ListDeadLettersRequest(job_id=job_id), timeout=10
    )
    assert [r.job_id for r in dead.runs] == [job_id]
    # Backfill schedules past fires as for any job.
    end = now_ms() - 1_000  # past on the node's clock too
    back = api.jobs.BackfillJob(
        job_service_pb2.BackfillJobRequest(job_id=job_id, from_ms=end - 3 * 3_600_000, to_ms=end),
        timeout=10,
    )
    assert back.scheduled + back.skipped_existing >= 2
    api.jobs.CancelJob(job_service_pb2.JobRef(job_id=job_id), timeout=10)


def test_update_replaces_the_target_or_the_body_and_the_history_shows_the_target(
    api: Api,
) -> None:
    made = submit(api, http_spec(payload=b"v1", schedule=cron("0 3 * * *"))).job
    job_id = made.job_id
    # The body alone: the target kept.
    body = update(api, job_id, spec(payload=b"v2"), "payload").job.spec
    assert body.payload == b"v2" and body.http == made.spec.http
    # The target alone: the body kept.
    moved = target(url="https://other.example.com/x", method="PATCH", timeout_ms=5_000)
    answer = update(api, job_id, http_spec(moved), "http")
    assert answer.job.spec.payload == b"v2"
    assert (answer.job.spec.http.url, answer.job.spec.http.method) == (moved.url, "PATCH")
    assert get(api, job_id).spec == answer.job.spec
    # A bad target is refused naming it, and nothing changes.
    with pytest.raises(grpc.RpcError) as info:
        update(api, job_id, http_spec(target(url="file:///etc/passwd")), "http")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value.details()).startswith("spec.http.url:")
    assert get(api, job_id).spec == answer.job.spec
    # A shorter job timeout cuts the target's.
    cut = update(api, job_id, spec(timeout_ms=2_000), "timeout_ms").job.spec
    assert cut.http.timeout_ms == 2_000
    # The history shows each target's change; the body's as payload_changed.
    updates = api.jobs.ListJobUpdates(
        job_service_pb2.ListJobUpdatesRequest(job_id=job_id), timeout=10
    ).updates
    by_version = {u.version: u for u in updates}
    assert by_version[1].payload_changed and by_version[1].new_spec.http == made.spec.http
    assert by_version[2].old_spec.http.url == made.spec.http.url
    assert by_version[2].new_spec.http.url == moved.url and not by_version[2].payload_changed
    assert all(u.old_spec.payload == b"" == u.new_spec.payload for u in updates)


def test_update_moves_a_job_between_a_target_and_a_python_handler(api: Api) -> None:
    made = submit(api, spec(handler="send", payload=b"p")).job
    job_id = made.job_id
    onto = update(api, job_id, http_spec(target(url="https://a.example.com/")), "http").job.spec
    assert onto.handler == "http" and onto.http.url == "https://a.example.com/"
    assert onto.payload == b"p"  # the payload became the body
    # Taking the target away needs a handler to move to.
    with pytest.raises(grpc.RpcError) as info:
        update(api, job_id, spec(), "http")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.handler" in str(info.value.details())
    off = update(api, job_id, spec(handler="send2"), "handler").job.spec
    assert off.handler == "send2" and not off.HasField("http") and off.payload == b"p"
    # And "http" named as a handler without a target is refused.
    with pytest.raises(grpc.RpcError) as info:
        update(api, job_id, spec(handler="http"), "handler")
    assert "reserved" in str(info.value.details())
    assert get(api, job_id).spec == off


def test_a_whole_spec_update_may_carry_a_target(api: Api) -> None:
    made = submit(api, spec(handler="h", schedule=once(now_ms() + 3_600_000))).job
    whole = http_spec(payload=b"all", schedule=once(now_ms() + 7_200_000), name="whole")
    after = update(api, made.job_id, whole).job.spec
    assert after.handler == "http" and after.http.url == whole.http.url
    assert (after.name, after.payload) == ("whole", b"all")


def test_a_target_names_a_secret_its_tenant_has_when_sent_not_when_kept(api: Api) -> None:
    details = refused(api, http_spec(target(signing_secret="gone"), tenant="acme"))
    assert details == (
        "spec.http.signing_secret: tenant 'acme' has no signing secret 'gone'"
        " (make one: wheelctl secret set gone --generate)"
    )
    # Another tenant's secret of that name is not this tenant's.
    refused(api, http_spec(target(signing_secret="hooks.v1"), tenant="acme"))
    api.admin.SetSecret(
        admin_service_pb2.SetSecretRequest(tenant="acme", name="s2", generate=True), timeout=10
    )
    made = submit(api, http_spec(target(signing_secret="s2"), tenant="acme")).job
    api.admin.DeleteSecret(
        admin_service_pb2.DeleteSecretRequest(tenant="acme", name="s2"), timeout=10
    )
    # Deleted since: a change that keeps the target still goes ...
    assert update(api, made.job_id, spec(name="renamed"), "name").job.spec.name == "renamed"
    # ... one that sends it again is refused.
    with pytest.raises(grpc.RpcError) as info:
        update(api, made.job_id, http_spec(made.spec.http), "http")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.http.signing_secret" in str(info.value.details())
