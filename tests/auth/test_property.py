"""Random well-formed and malformed requests from several tenants to a real
server with --auth: every answer is a documented status code (never UNKNOWN
or INTERNAL), and no tenant ever sees or changes another tenant's job."""

from __future__ import annotations

from typing import Any

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.auth.conftest import AuthServer, Stubs, Tokens, md
from tests.auth.test_matrix import once_spec
from wheel.rpc.v1 import job_service_pb2, jobs_pb2

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}

CREDENTIALS = ["acme_rw", "acme_read", "beta_rw", "operator", "acme_worker", "none", "junk"]
texts = st.text(max_size=30)
ids = st.one_of(st.sampled_from(["acme", "beta"]), st.integers(-5, 2**63 - 1))
METHODS = ["GetJob", "CancelJob", "PauseJob", "ResumeJob", "TriggerJob", "ListRuns", "Submit",
           "ListJobs", "Backfill"]  # fmt: skip


def request_of(method: str, target: Any, extra: Any, known: dict[str, int]) -> tuple[str, Any]:
    job_id = known[target] if isinstance(target, str) else target
    if method == "GetJob":
        return method, job_service_pb2.GetJobRequest(job_id=job_id, next_fires=extra % 200)
    if method == "ListRuns":
        return method, job_service_pb2.ListRunsRequest(job_id=job_id, page_token=str(extra))
    if method == "Backfill":
        req = job_service_pb2.BackfillJobRequest(job_id=job_id, from_ms=extra, to_ms=extra + 10)
        return "BackfillJob", req
    if method == "Submit":
        spec = once_spec(f"p{extra}", tenant=["", "acme", "beta", "x"][extra % 4])
        if extra % 5 == 0:
            spec.name = ""  # malformed
        if extra % 7 == 0:
            spec.pool = "beta/gpu"
        return "SubmitJob", job_service_pb2.SubmitJobRequest(spec=spec)
    if method == "ListJobs":
        return method, job_service_pb2.ListJobsRequest(
            tenant=["", "acme", "beta"][extra % 3], page_size=extra % 1500
        )
    return method, job_service_pb2.JobRef(job_id=job_id)


def test_random_requests_get_documented_codes_and_stay_in_their_tenant(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    known = {}
    for tenant, token in (("acme", tokens.acme_rw), ("beta", tokens.beta_rw)):
        resp = stubs.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(spec=once_spec(f"{tenant}-seed")),
            metadata=md(token),
            timeout=10,
        )
        known[tenant] = resp.job.job_id
    assert server.node is not None
    store = server.node.store

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        cred=st.sampled_from(CREDENTIALS),
        method=st.sampled_from(METHODS),
        target=ids,
        extra=st.integers(0, 10_000),
    )
    def one(cred: str, method: str, target: Any, extra: int) -> None:
        token = {"none": None, "junk": "wheel_x_y"}.get(cred) or getattr(tokens, cred, None)
        name, request = request_of(method, target, extra, known)
        beta_before = store.get_job(known["beta"])
        try:
            answer = getattr(stubs.jobs, name)(request, metadata=md(token), timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code, answer = exc.code(), None
        assert code in DOCUMENTED, (cred, name, code)
        tenant = {"acme_rw": "acme", "acme_read": "acme", "beta_rw": "beta"}.get(cred)
        if tenant is None or answer is None:
            return
        # What a tenant got back is its own.
        if isinstance(answer, jobs_pb2.Job):
            assert answer.spec.tenant == tenant
        elif isinstance(answer, job_service_pb2.SubmitJobResponse):
            assert answer.job.spec.tenant == tenant
        elif isinstance(answer, job_service_pb2.ListJobsResponse):
            assert {j.spec.tenant for j in answer.jobs} <= {tenant}
        if tenant == "acme":
            assert store.get_job(known["beta"]) == beta_before

    one()
