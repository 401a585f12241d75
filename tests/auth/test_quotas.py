"""Tenant quotas on a real node: max jobs and submits a second answered
RESOURCE_EXHAUSTED naming the limit; fires over a tenant's fires/s or
in-flight limit delayed, never lost; short capacity shared fairly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from tests.auth.conftest import AuthServer, Stubs, Tokens, md
from tests.auth.test_matrix import once_spec
from tests.rpc.test_api import WorkerThread as SDKWorkerThread
from wheel.auth import WORKER
from wheel.client import Client, TenantQuota
from wheel.errors import ResourceExhausted
from wheel.rpc.v1 import job_service_pb2
from wheel.store.base import RunState
from wheel.worker import RunContext


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class WorkerThread(SDKWorkerThread):
    """A worker with its own token, bound to its id and one pool."""

    def __init__(self, server: AuthServer, worker_id: str, pool: str, capacity: int, fn: Any):
        token = server.mint("*", WORKER, worker_id=worker_id, pools=[pool])
        options = {"capacity": capacity, "pools": [pool], "token": token}
        super().__init__(server.target, worker_id, options=options, h=fn)


@pytest.fixture
def admin(server: AuthServer, tokens: Tokens) -> Iterator[Client]:
    with Client(server.target, token=tokens.operator) as client:
        yield client


def submit(stubs: Stubs, token: str, name: str, *, due_now: bool = False, pool: str = "") -> int:
    spec = once_spec(name, pool=pool)
    if due_now:
        spec.schedule.once.at_ms = int(time.time() * 1000)
    resp = stubs.jobs.SubmitJob(
        job_service_pb2.SubmitJobRequest(spec=spec), metadata=md(token), timeout=10
    )
    return int(resp.job.job_id)


def test_max_jobs_is_resource_exhausted_naming_the_limit(
    server: AuthServer, stubs: Stubs, tokens: Tokens, admin: Client
) -> None:
    admin.set_tenant_quota(TenantQuota(tenant="acme", max_jobs=2))
    submit(stubs, tokens.acme_rw, "a1")
    submit(stubs, tokens.acme_rw, "a2")
    with pytest.raises(grpc.RpcError) as err:
        submit(stubs, tokens.acme_rw, "a3")
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details().startswith("max_jobs:") and "limit of 2" in err.value.details()
    submit(stubs, tokens.beta_rw, "b1")  # another tenant is not held back
    bulk = stubs.jobs.SubmitJobs(
        job_service_pb2.SubmitJobsRequest(
            jobs=[job_service_pb2.SubmitJobRequest(spec=once_spec("a4"))]
        ),
        metadata=md(tokens.acme_rw),
        timeout=10,
    )
    assert [r.error_code for r in bulk.results] == ["RESOURCE_EXHAUSTED"]
    assert server.node is not None and server.node.store.count_jobs("acme") == 2


def test_submits_per_second_is_resource_exhausted_naming_the_limit(
    server: AuthServer, stubs: Stubs, tokens: Tokens, admin: Client
) -> None:
    admin.set_tenant_quota(TenantQuota(tenant="acme", submits_per_s=1))
    submit(stubs, tokens.acme_rw, "a1")
    with (
        Client(server.target, token=tokens.acme_rw) as client,
        pytest.raises(ResourceExhausted) as err,
    ):
        client.submit(name="a2", handler="h", at=time.time() + 3600)
    assert str(err.value).startswith("submits_per_s:") and "limit of 1 submits" in str(err.value)


def test_fires_over_a_tenants_rate_wait_and_none_is_lost(
    server: AuthServer, stubs: Stubs, tokens: Tokens, admin: Client
) -> None:
    assert server.node is not None
    rate, n = 4.0, 10
    admin.set_tenant_quota(TenantQuota(tenant="acme", fires_per_s=rate))
    with WorkerThread(server, "fleet", "default", 16, lambda ctx: None):
        ids = [submit(stubs, tokens.acme_rw, f"a{i}", due_now=True) for i in range(n)]
        store = server.node.store
        wait_for(
            lambda: all([r.state for r in store.list_runs(j)] == [RunState.SUCCEEDED] for j in ids),
            30,
            "every fire to run",
        )
    dispatched = sorted(store.list_runs(j)[0].dispatched_at_ms for j in ids)
    # A second's burst goes at once; the rest at the rate.
    assert (dispatched[-1] - dispatched[0]) / 1000 >= (n - rate) / rate - 0.3
    assert all(store.list_missed(j) == [] for j in ids)


def test_runs_over_a_tenants_in_flight_limit_wait_and_none_is_lost(
    server: AuthServer, stubs: Stubs, tokens: Tokens, admin: Client
) -> None:
    assert server.node is not None
    admin.set_tenant_quota(TenantQuota(tenant="acme", max_in_flight=2))
    lock = threading.Lock()
    running, peak = [0], [0]

    def slow(ctx: RunContext) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    with WorkerThread(server, "fleet", "default", 16, slow):
        ids = [submit(stubs, tokens.acme_rw, f"a{i}", due_now=True) for i in range(8)]
        store = server.node.store
        wait_for(
            lambda: all([r.state for r in store.list_runs(j)] == [RunState.SUCCEEDED] for j in ids),
            30,
            "every run to end",
        )
    assert peak[0] == 2


def test_short_capacity_is_shared_fairly_between_two_tenants(
    server: AuthServer, stubs: Stubs, tokens: Tokens
) -> None:
    assert server.node is not None
    order: list[str] = []
    lock = threading.Lock()

    def record(ctx: RunContext) -> None:
        with lock:
            order.append(ctx.payload.decode() if ctx.payload else "")
        time.sleep(0.05)

    n = 30
    for tenant, token in (("acme", tokens.acme_rw), ("beta", tokens.beta_rw)):
        # One tenant's burst submitted entirely before the other's: with one
        # FIFO, acme's 30 would all go first.
        for i in range(n):
            spec = once_spec(f"{tenant}{i}")
            spec.schedule.once.at_ms = int(time.time() * 1000)
            spec.payload = tenant.encode()
            stubs.jobs.SubmitJob(
                job_service_pb2.SubmitJobRequest(spec=spec), metadata=md(token), timeout=10
            )
    with WorkerThread(server, "fleet", "default", 2, record):
        wait_for(lambda: len(order) >= 2 * n, 60, "every run")
    first = order[:20]
    assert abs(first.count("acme") - first.count("beta")) <= 2, order
