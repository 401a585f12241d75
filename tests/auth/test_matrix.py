"""Every (credential, RPC, target tenant) gets exactly its status code, and a
refused call leaves the store as it was: no job, run, token or quota changed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.auth.conftest import AuthServer, Stubs, Tokens, md
from wheel.engine.model import JobState, RunState
from wheel.engine.records import Completion, FireClaim
from wheel.rpc.v1 import (
    admin_service_pb2,
    job_service_pb2,
    jobs_pb2,
    node_service_pb2,
    worker_service_pb2,
)
from wheel.store.base import Store

OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def once_spec(name: str, tenant: str = "", pool: str = "") -> jobs_pb2.JobSpec:
    at = int(time.time() * 1000) + 3_600_000
    return jobs_pb2.JobSpec(
        name=name,
        handler="h",
        tenant=tenant,
        pool=pool,
        schedule=jobs_pb2.Schedule(once=jobs_pb2.OnceSchedule(at_ms=at)),
    )


def snapshot(server: AuthServer) -> tuple[Any, ...]:
    assert server.node is not None
    store = server.node.store
    jobs = store.list_jobs(limit=1000)
    return (
        [(j.job_id, j.state, j.next_run_at, j.spec.tenant, j.updated_at_ms) for j in jobs],
        [store.list_runs(j.job_id) for j in jobs],
        store.list_tokens(),
        store.list_tenant_quotas(),
    )


Call = Callable[[Stubs, dict[str, int], Any], Any]


def job_call(method: str) -> Callable[[str], Call]:
    def for_tenant(tenant: str) -> Call:
        def call(s: Stubs, ids: dict[str, int], metadata: Any) -> Any:
            return getattr(s.jobs, method)(
                job_service_pb2.JobRef(job_id=ids[tenant]), metadata=metadata, timeout=10
            )

        return call

    return for_tenant


def get_job(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.GetJob(
        job_service_pb2.GetJobRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def list_runs(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.ListRuns(
        job_service_pb2.ListRunsRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def backfill(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.BackfillJob(
        job_service_pb2.BackfillJobRequest(job_id=ids[tenant], from_ms=0, to_ms=1_000),
        metadata=m,
        timeout=10,
    )


def update_job(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.UpdateJob(
        job_service_pb2.UpdateJobRequest(
            job_id=ids[tenant], spec=jobs_pb2.JobSpec(name="renamed"), fields=["name"]
        ),
        metadata=m,
        timeout=10,
    )


def list_job_updates(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.ListJobUpdates(
        job_service_pb2.ListJobUpdatesRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def preview(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.PreviewSchedule(
        job_service_pb2.PreviewScheduleRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def dead_letters(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.ListDeadLetters(
        job_service_pb2.ListDeadLettersRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def redrive(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.RedriveDeadLetters(
        job_service_pb2.RedriveDeadLettersRequest(job_id=ids[tenant]), metadata=m, timeout=10
    )


def submit(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.SubmitJob(
        job_service_pb2.SubmitJobRequest(spec=once_spec("new", tenant)), metadata=m, timeout=10
    )


def list_jobs(tenant: str) -> Call:
    return lambda s, ids, m: s.jobs.ListJobs(
        job_service_pb2.ListJobsRequest(tenant=tenant), metadata=m, timeout=10
    )


def status(_: str) -> Call:
    return lambda s, ids, m: s.admin.GetClusterStatus(
        admin_service_pb2.GetClusterStatusRequest(), metadata=m, timeout=10
    )


def list_tokens(_: str) -> Call:
    return lambda s, ids, m: s.admin.ListTokens(
        admin_service_pb2.ListTokensRequest(), metadata=m, timeout=10
    )


def create_token(tenant: str) -> Call:
    return lambda s, ids, m: s.admin.CreateToken(
        admin_service_pb2.CreateTokenRequest(tenant=tenant, scopes=["jobs:read"]),
        metadata=m,
        timeout=10,
    )


def set_quota(tenant: str) -> Call:
    return lambda s, ids, m: s.admin.SetTenantQuota(
        admin_service_pb2.TenantQuota(tenant=tenant, max_jobs=1), metadata=m, timeout=10
    )


def membership(_: str) -> Call:
    return lambda s, ids, m: s.admin.GetMembership(
        admin_service_pb2.GetMembershipRequest(), metadata=m, timeout=10
    )


def jobs_changed(tenant: str) -> Call:
    return lambda s, ids, m: s.nodes.JobsChanged(
        node_service_pb2.JobsChangedRequest(job_ids=[ids[tenant]]), metadata=m, timeout=10
    )


def connect(tenant: str) -> Call:
    def call(s: Stubs, ids: dict[str, int], m: Any) -> Any:
        hello = worker_service_pb2.WorkerMessage(
            hello=worker_service_pb2.Hello(worker_id=f"{tenant}-w1", capacity=1)
        )
        stream = s.workers.Connect(iter([hello]), metadata=m, timeout=10)
        return list(stream)

    return call


STATE_CHANGING = [
    *[job_call(m) for m in ("CancelJob", "PauseJob", "ResumeJob", "TriggerJob")],
    update_job,
    redrive,
]
READING = [get_job, list_runs, list_job_updates, preview, dead_letters]
EVERY_JOB_CALL = [*READING, backfill, *STATE_CHANGING]
EVERY_CALL = [
    *EVERY_JOB_CALL,
    submit,
    list_jobs,
    status,
    list_tokens,
    create_token,
    set_quota,
    membership,
    jobs_changed,
    connect,
]


def name_of(call: Callable[[str], Call]) -> str:
    return getattr(call, "__name__", "call")


# (credential, call, target tenant, code). "nobody": no metadata at all;
# "garbage": a malformed token; "unknown": well formed, never minted.
MATRIX: list[tuple[str, Callable[[str], Call], str, grpc.StatusCode]] = [
    *[
        (cred, c, "acme", UNAUTH)
        for cred in ("nobody", "garbage", "unknown", "expired", "revoked")
        for c in EVERY_CALL
    ],
    # Another tenant's jobs do not exist for a tenant; its own do.
    *[("acme_rw", c, "beta", NOT_FOUND) for c in EVERY_JOB_CALL],
    *[("beta_rw", c, "acme", NOT_FOUND) for c in EVERY_JOB_CALL],
    *[("acme_rw", c, "missing", NOT_FOUND) for c in EVERY_JOB_CALL],
    *[("acme_rw", c, "acme", OK) for c in READING],
    *[("acme_read", c, "acme", OK) for c in READING],
    *[("operator", c, "beta", OK) for c in READING],
    ("acme_rw", update_job, "acme", OK),
    ("acme_rw", redrive, "acme", OK),  # no dead letters: none redriven
    ("operator", update_job, "beta", OK),
    ("acme_read", list_jobs, "beta", OK),  # lists acme's jobs: see the test below
    ("operator", get_job, "beta", OK),
    ("operator", list_runs, "acme", OK),
    ("operator", membership, "", OK),
    ("acme_rw", membership, "", OK),
    # A scope the credential lacks.
    *[("acme_read", c, "acme", DENIED) for c in [*STATE_CHANGING, backfill, submit, jobs_changed]],
    *[("acme_rw", c, "acme", DENIED) for c in (status, list_tokens, create_token, set_quota)],
    *[("acme_worker", c, "acme", DENIED) for c in [*EVERY_JOB_CALL, submit, list_jobs, status]],
    ("acme_rw", connect, "acme", DENIED),
    ("operator", connect, "acme", DENIED),  # no worker scope
    # A worker credential bound to another worker id (and pool).
    ("acme_worker", connect, "beta", DENIED),
]


@pytest.fixture
def ids(server: AuthServer, tokens: Tokens, stubs: Stubs) -> dict[str, int]:
    out = {"missing": 987_654_321}
    for tenant, token in (("acme", tokens.acme_rw), ("beta", tokens.beta_rw)):
        resp = stubs.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(spec=once_spec(f"{tenant}-job")),
            metadata=md(token),
            timeout=10,
        )
        out[tenant] = resp.job.job_id
    return out


def credential(tokens: Tokens, name: str) -> Any:
    if name == "nobody":
        return ()
    if name == "garbage":
        return md("not-a-token")
    if name == "unknown":
        return md("wheel_0123456789ab_" + "0" * 64)
    return md(getattr(tokens, name))


def test_every_credential_rpc_and_tenant_gets_its_status_and_changes_nothing_refused(
    server: AuthServer, stubs: Stubs, tokens: Tokens, ids: dict[str, int]
) -> None:
    failures = []
    for cred, call, tenant, want in MATRIX:
        before = snapshot(server)
        try:
            call(tenant)(stubs, ids, credential(tokens, cred))
            got = OK
        except grpc.RpcError as exc:
            got = exc.code()
            assert got not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), exc
        if got != want:
            failures.append(f"{cred} {name_of(call)} {tenant}: {got.name}, want {want.name}")
        if want != OK:
            assert snapshot(server) == before, f"{cred} {name_of(call)} {tenant} changed state"
    assert failures == []


def test_a_tenants_requests_act_for_its_own_tenant_whatever_they_name(
    server: AuthServer, stubs: Stubs, tokens: Tokens, ids: dict[str, int]
) -> None:
    made = stubs.jobs.SubmitJob(
        job_service_pb2.SubmitJobRequest(spec=once_spec("sneaky", tenant="beta")),
        metadata=md(tokens.acme_rw),
        timeout=10,
    )
    assert made.job.spec.tenant == "acme"
    listed = stubs.jobs.ListJobs(
        job_service_pb2.ListJobsRequest(tenant="beta"), metadata=md(tokens.acme_rw), timeout=10
    )
    assert {j.spec.tenant for j in listed.jobs} == {"acme"}
    assert ids["beta"] not in {j.job_id for j in listed.jobs}
    # The operator names tenants as before.
    theirs = stubs.jobs.ListJobs(
        job_service_pb2.ListJobsRequest(tenant="beta"), metadata=md(tokens.operator), timeout=10
    )
    assert [j.job_id for j in theirs.jobs] == [ids["beta"]]


def test_a_pool_of_another_tenant_is_permission_denied(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stubs.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(spec=once_spec("x", pool="beta/gpu")),
            metadata=md(tokens.acme_rw),
            timeout=10,
        )
    assert err.value.code() == DENIED
    assert err.value.details().startswith("spec.pool:")
    bulk = stubs.jobs.SubmitJobs(
        job_service_pb2.SubmitJobsRequest(
            jobs=[
                job_service_pb2.SubmitJobRequest(spec=once_spec("ok", pool="acme/gpu")),
                job_service_pb2.SubmitJobRequest(spec=once_spec("no", pool="beta/gpu")),
            ]
        ),
        metadata=md(tokens.acme_rw),
        timeout=10,
    )
    assert [r.error_code for r in bulk.results] == ["", "PERMISSION_DENIED"]


def test_cancel_through_the_owner_of_the_credential_works(
    server: AuthServer, stubs: Stubs, tokens: Tokens, ids: dict[str, int]
) -> None:
    job = stubs.jobs.CancelJob(
        job_service_pb2.JobRef(job_id=ids["acme"]), metadata=md(tokens.acme_rw), timeout=10
    )
    assert job.state == jobs_pb2.JOB_STATE_CANCELLED
    assert server.node is not None
    assert server.node.store.get_job(ids["beta"]).state is JobState.ACTIVE


def test_a_tenant_lists_only_its_own_dead_letters(
    server: AuthServer, stubs: Stubs, tokens: Tokens, ids: dict[str, int]
) -> None:
    assert server.node is not None
    store = server.node.store
    dead = {t: _ended_run(store, ids[t], RunState.DEAD_LETTERED) for t in ("acme", "beta")}

    def listed(token: str, job_id: int = 0) -> set[int]:
        resp = stubs.jobs.ListDeadLetters(
            job_service_pb2.ListDeadLettersRequest(job_id=job_id), metadata=md(token), timeout=10
        )
        return {r.run_id for r in resp.runs}

    assert listed(tokens.acme_read) == {dead["acme"]}
    assert listed(tokens.beta_rw) == {dead["beta"]}
    assert listed(tokens.operator) == set(dead.values())
    with pytest.raises(grpc.RpcError) as info:
        listed(tokens.beta_rw, ids["acme"])
    assert info.value.code() == NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stubs.jobs.RedriveDeadLetters(
            job_service_pb2.RedriveDeadLettersRequest(job_id=ids["acme"], run_id=dead["acme"]),
            metadata=md(tokens.beta_rw),
            timeout=10,
        )
    assert info.value.code() == NOT_FOUND
    assert listed(tokens.acme_read) == {dead["acme"]}  # not redriven by beta


def test_the_docs_scope_table_names_each_job_call_with_the_scope_it_needs() -> None:
    """The table of scopes an operator reads to make tokens lists every
    JobService call under the scope the interceptor asks for."""
    from pathlib import Path

    from wheel.auth._interceptor import scope_of

    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    listed: dict[str, set[str]] = {}
    for line in page.splitlines():
        for scope in ("jobs:read", "jobs:write"):
            if line.startswith(f"| `{scope}` |"):
                listed[scope] = {name.strip() for name in line.split("|")[2].split(",")}
    service = job_service_pb2.DESCRIPTOR.services_by_name["JobService"]
    needed: dict[str, set[str]] = {"jobs:read": set(), "jobs:write": set()}
    for method in service.methods:
        needed.setdefault(scope_of(f"/wheel.rpc.v1.JobService/{method.name}"), set()).add(
            method.name
        )
    assert listed == needed


def test_get_run_shows_a_tenant_its_own_runs_and_no_other_tenants(
    server: AuthServer, stubs: Stubs, tokens: Tokens, ids: dict[str, int]
) -> None:
    assert server.node is not None
    store = server.node.store
    runs = {
        t: _ended_run(store, ids[t], RunState.SUCCEEDED, result=f'{{"value": "{t}"}}')
        for t in ("acme", "beta")
    }

    def get(token: str, run_id: int) -> jobs_pb2.Run:
        return stubs.jobs.GetRun(  # type: ignore[no-any-return]
            job_service_pb2.GetRunRequest(run_id=run_id), metadata=md(token), timeout=10
        )

    mine = get(tokens.acme_read, runs["acme"])
    assert (mine.run_id, mine.job_id, mine.result_json) == (
        runs["acme"],
        ids["acme"],
        '{"value": "acme"}',
    )
    assert get(tokens.operator, runs["beta"]).result_json == '{"value": "beta"}'
    # Another tenant's run is as absent as one that never was, in the same words.
    for token, run_id in ((tokens.beta_rw, runs["acme"]), (tokens.acme_rw, 987_654_321)):
        with pytest.raises(grpc.RpcError) as info:
            get(token, run_id)
        assert info.value.code() == NOT_FOUND
        assert info.value.details() == f"run {run_id} does not exist"
    for name in ("acme_worker",):
        with pytest.raises(grpc.RpcError) as info:
            get(getattr(tokens, name), runs["acme"])
        assert info.value.code() == DENIED
    with pytest.raises(grpc.RpcError) as info:
        get(tokens.acme_read, 0)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("run_id:")


def _ended_run(store: Store, job_id: int, state: RunState, result: str | None = None) -> int:
    """A run of the job's fire at 1,000, claimed and ended in ``state``
    straight in the store: its id."""
    claim = FireClaim(
        job_id=job_id, scheduled_for=1_000, attempt=0, fence=1, dispatched_at_ms=1_000,
        advance=False,
    )  # fmt: skip
    [won] = store.claim_fires([claim])
    assert won.run_id is not None
    done = Completion(run_id=won.run_id, fence=1, state=state, finished_at_ms=2_000, result=result)
    store.complete_runs([done])
    return won.run_id
