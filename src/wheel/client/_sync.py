"""``Client``: the blocking client over one gRPC channel."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc  # type: ignore[import-untyped, unused-ignore]

from wheel.client import _wire
from wheel.client._specs import JobArgs, JobRequest
from wheel.client._time import When
from wheel.client._values import Backfill, Job, JobState, Run, RunState, Status, Trigger
from wheel.errors import WheelError
from wheel.rpc.v1 import admin_service_pb2_grpc, job_service_pb2_grpc

_T = TypeVar("_T")


class Client:
    """A blocking connection to one wheel node (any node serves every call).

    Every failure is raised as a ``wheel.errors.WheelError``: ``InvalidArgument``
    naming the field, ``NotFound``, ``AlreadyExists``, ``FailedPrecondition``,
    ``ResourceExhausted``, or a plain ``WheelError`` starting with the gRPC
    code's name (``UNAVAILABLE: ...``). ``timeout`` is each call's deadline,
    in seconds. Safe to share between threads.
    """

    def __init__(self, target: str = _wire.DEFAULT_TARGET, *, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)
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

    def _call(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            raise _wire.error_from_rpc(exc) from exc

    def _pages(self, method: Callable[..., Any], pages: _wire.Pages[_T]) -> Iterator[_T]:
        token = ""
        while True:
            resp = self._call(method, pages.request(token))
            yield from pages.items(resp)
            token = resp.next_page_token
            if not token:
                return

    # -- jobs ------------------------------------------------------------------

    def submit(self, **job: Unpack[JobArgs]) -> Job:
        """Submit a job (the keywords are ``JobRequest``'s) and return it as the
        node stored it; ``created`` is False when an earlier submit with the
        same ``idempotency_key`` made it."""
        resp = self._call(self._jobs.SubmitJob, _wire.submit_request(JobRequest(**job)))
        return _wire.job_of(resp.job, created=resp.created)

    def submit_many(self, jobs: Iterable[JobRequest | JobArgs]) -> list[Job | WheelError]:
        """Submit many jobs in one call and one store transaction (at most
        10,000): each item's ``Job``, or the error of that item alone."""
        request, refused = _wire.submit_many_request(jobs)
        resp = self._call(self._jobs.SubmitJobs, request) if request.jobs else None
        return _wire.submit_many_results(refused, resp)

    def get(self, job_id: int, *, next_fires: int = 5, recent_runs: int = 10) -> Job:
        """A job with its next ``next_fires`` fires and ``recent_runs`` latest runs
        (each at most 100)."""
        msg = self._call(self._jobs.GetJob, _wire.get_request(job_id, next_fires, recent_runs))
        return _wire.job_of(msg)

    def jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        page_size: int = 100,
    ) -> Iterator[Job]:
        """Every job (of ``tenant``, in ``state``, if given) in job id order,
        fetched ``page_size`` at a time."""
        return self._pages(self._jobs.ListJobs, _wire.job_pages(tenant, state, page_size))

    def cancel(self, job_id: int) -> Job:
        """Cancel a job; a run in flight is revoked. Cancelling again is a no-op."""
        return _wire.job_of(self._call(self._jobs.CancelJob, _wire.job_ref(job_id)))

    def pause(self, job_id: int) -> Job:
        """Pause a job: fires that come due are recorded as missed (``paused``)."""
        return _wire.job_of(self._call(self._jobs.PauseJob, _wire.job_ref(job_id)))

    def resume(self, job_id: int) -> Job:
        """Resume a paused job from now, without a burst of the fires it missed."""
        return _wire.job_of(self._call(self._jobs.ResumeJob, _wire.job_ref(job_id)))

    def trigger(self, job_id: int) -> Trigger:
        """Run a job now, out of band, as a fire of its own."""
        return _wire.trigger_of(self._call(self._jobs.TriggerJob, _wire.job_ref(job_id)))

    def backfill(self, job_id: int, start: When, end: When) -> Backfill:
        """Run the job's fires with ``start <= scheduled_for < end`` (both in the
        past) that are not already in its history."""
        request = _wire.backfill_request(job_id, start, end)
        return _wire.backfill_of(self._call(self._jobs.BackfillJob, request))

    def runs(
        self, job_id: int, *, states: Iterable[RunState | str] = (), page_size: int = 100
    ) -> Iterator[Run]:
        """A job's executions (every attempt) and missed fires, newest first;
        ``states`` keeps only those states (``RunState.MISSED`` for missed fires)."""
        return self._pages(self._jobs.ListRuns, _wire.run_pages(job_id, states, page_size))

    # -- admin -----------------------------------------------------------------

    def status(self, *, include_shards: bool = False) -> Status:
        """The node's view of the cluster: nodes, workers, backlog, lag, totals."""
        msg = self._call(self._admin.GetClusterStatus, _wire.status_request(include_shards))
        return _wire.status_of(msg)
