"""The client SDK: what services submitting and managing jobs call.

A thin synchronous wrapper over ``JobService`` and ``AdminService``: specs go
in as ``JobSpec`` values, jobs and runs come back as protobuf messages, list
calls follow page tokens, and every gRPC failure is raised as a
``wheel.errors.WheelError`` carrying the server's message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

import grpc  # type: ignore[import-untyped, unused-ignore]

from wheel.engine.model import JobState, RunState
from wheel.engine.spec import JobSpec
from wheel.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    WheelError,
)
from wheel.rpc.convert import job_state_to_proto, run_state_to_proto, spec_to_proto
from wheel.rpc.v1 import admin_service_pb2, admin_service_pb2_grpc, jobs_pb2
from wheel.rpc.v1 import job_service_pb2 as js
from wheel.rpc.v1 import job_service_pb2_grpc as js_grpc

__all__ = ["MISSED", "Client", "error_from_rpc"]

_R = TypeVar("_R")

# Pass in ``Client.runs(states=...)`` to include missed fires.
MISSED = "missed"

_BY_CODE: dict[Any, Callable[[str], WheelError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def error_from_rpc(exc: grpc.RpcError) -> WheelError:
    """The ``WheelError`` for a failed call; the server's message is kept as is.

    INVALID_ARGUMENT details of the form ``"field: reason"`` (how the server
    renders ``InvalidArgument``) become ``InvalidArgument(field, reason)``.
    Codes without a wheel error of their own (UNAVAILABLE, DEADLINE_EXCEEDED,
    INTERNAL...) become a plain ``WheelError`` whose message starts with the
    code's name.
    """
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or ""
    return _error(code, details)


def _error(code: Any, details: str) -> WheelError:
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, sep, reason = details.partition(": ")
        if sep and field and " " not in field:
            return InvalidArgument(field, reason)
        err = InvalidArgument("", details)
        err.args = (details,)
        return err
    make = _BY_CODE.get(code)
    if make is not None:
        return make(details)
    return WheelError(f"{code.name}: {details}" if details else code.name)


class Client:
    """A connection to one wheel node (any node serves every call)."""

    def __init__(self, target: str, *, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._jobs = js_grpc.JobServiceStub(self._channel)
        self._admin = admin_service_pb2_grpc.AdminServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, response: type[_R]) -> _R:
        try:
            return cast(_R, method(request, timeout=self.timeout))
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc

    # -- jobs ------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, idempotency_key: str = "") -> tuple[jobs_pb2.Job, bool]:
        """Submit a job; returns (job, created). Created is False when an earlier
        submit with the same idempotency key made it."""
        resp = self._call(
            self._jobs.SubmitJob,
            js.SubmitJobRequest(spec=spec_to_proto(spec), idempotency_key=idempotency_key),
            js.SubmitJobResponse,
        )
        return resp.job, resp.created

    def submit_many(
        self, jobs: Sequence[tuple[JobSpec, str]]
    ) -> list[tuple[jobs_pb2.Job, bool] | WheelError]:
        """Submit (spec, idempotency key) pairs in one call (at most 10,000);
        each result is (job, created) or the error of that submit alone."""
        resp = self._call(
            self._jobs.SubmitJobs,
            js.SubmitJobsRequest(
                jobs=[
                    js.SubmitJobRequest(spec=spec_to_proto(spec), idempotency_key=key)
                    for spec, key in jobs
                ]
            ),
            js.SubmitJobsResponse,
        )
        out: list[tuple[jobs_pb2.Job, bool] | WheelError] = []
        for r in resp.results:
            if r.error_code:
                out.append(_error(grpc.StatusCode[r.error_code], r.error_message))
            else:
                out.append((r.response.job, r.response.created))
        return out

    def get(self, job_id: int, *, next_fires: int = 5, recent_runs: int = 10) -> jobs_pb2.Job:
        return self._call(
            self._jobs.GetJob,
            js.GetJobRequest(job_id=job_id, next_fires=next_fires, recent_runs=recent_runs),
            jobs_pb2.Job,
        )

    def list_jobs(
        self, *, tenant: str = "", state: JobState | None = None, page_size: int = 100
    ) -> Iterator[jobs_pb2.Job]:
        """Every matching job, in job id order, fetched a page at a time."""
        token = ""
        while True:
            resp = self._call(
                self._jobs.ListJobs,
                js.ListJobsRequest(
                    tenant=tenant,
                    state=job_state_to_proto(state) if state is not None else None,
                    page_size=page_size,
                    page_token=token,
                ),
                js.ListJobsResponse,
            )
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def cancel(self, job_id: int) -> jobs_pb2.Job:
        return self._call(self._jobs.CancelJob, js.JobRef(job_id=job_id), jobs_pb2.Job)

    def pause(self, job_id: int) -> jobs_pb2.Job:
        return self._call(self._jobs.PauseJob, js.JobRef(job_id=job_id), jobs_pb2.Job)

    def resume(self, job_id: int) -> jobs_pb2.Job:
        return self._call(self._jobs.ResumeJob, js.JobRef(job_id=job_id), jobs_pb2.Job)

    def trigger(self, job_id: int) -> js.TriggerJobResponse:
        return self._call(self._jobs.TriggerJob, js.JobRef(job_id=job_id), js.TriggerJobResponse)

    def backfill(self, job_id: int, from_ms: int, to_ms: int) -> js.BackfillJobResponse:
        """Schedule the fires with from_ms <= scheduled_for < to_ms not already in history."""
        return self._call(
            self._jobs.BackfillJob,
            js.BackfillJobRequest(job_id=job_id, from_ms=from_ms, to_ms=to_ms),
            js.BackfillJobResponse,
        )

    def runs(
        self, job_id: int, *, states: Iterable[RunState | str] = (), page_size: int = 100
    ) -> Iterator[jobs_pb2.Run]:
        """Executions and missed fires of a job, newest first. ``states`` filters
        (``RunState`` values, or ``MISSED`` for missed fires); empty means all."""
        wanted = [
            jobs_pb2.RUN_STATE_MISSED if s == MISSED else run_state_to_proto(RunState(s))
            for s in states
        ]
        token = ""
        while True:
            resp = self._call(
                self._jobs.ListRuns,
                js.ListRunsRequest(
                    job_id=job_id, page_size=page_size, page_token=token, states=wanted
                ),
                js.ListRunsResponse,
            )
            yield from resp.runs
            token = resp.next_page_token
            if not token:
                return

    # -- admin -----------------------------------------------------------------

    def status(self, include_shards: bool = False) -> admin_service_pb2.ClusterStatus:
        return self._call(
            self._admin.GetClusterStatus,
            admin_service_pb2.GetClusterStatusRequest(include_shards=include_shards),
            admin_service_pb2.ClusterStatus,
        )
