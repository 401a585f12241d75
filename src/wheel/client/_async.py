"""``AsyncClient``: the asyncio client over one ``grpc.aio`` channel.

The same calls as ``Client``, awaited, with async iterators for the lists;
requests and responses go through the same ``_wire`` functions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar, Unpack

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from wheel.client import _wire
from wheel.client._specs import JobArgs, JobRequest
from wheel.client._time import When
from wheel.client._values import Backfill, Job, JobState, Run, RunState, Status, Trigger
from wheel.errors import WheelError
from wheel.rpc.v1 import admin_service_pb2_grpc, job_service_pb2_grpc

_T = TypeVar("_T")


class AsyncClient:
    """An asyncio connection to one wheel node; use it on one event loop.

    ``async with AsyncClient(target) as client: job = await client.submit(...)``.
    Errors, arguments and results are those of ``Client``.
    """

    def __init__(self, target: str = _wire.DEFAULT_TARGET, *, timeout: float = 10.0) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(target)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)
        self._admin = admin_service_pb2_grpc.AdminServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any) -> Any:
        try:
            return await method(request, timeout=self.timeout)
        except grpc.RpcError as exc:  # grpc.aio's AioRpcError is one
            raise _wire.error_from_rpc(exc) from exc

    async def _pages(self, method: Callable[..., Any], pages: _wire.Pages[_T]) -> AsyncIterator[_T]:
        token = ""
        while True:
            resp = await self._call(method, pages.request(token))
            for item in pages.items(resp):
                yield item
            token = resp.next_page_token
            if not token:
                return

    # -- jobs ------------------------------------------------------------------

    async def submit(self, **job: Unpack[JobArgs]) -> Job:
        """See ``Client.submit``."""
        resp = await self._call(self._jobs.SubmitJob, _wire.submit_request(JobRequest(**job)))
        return _wire.job_of(resp.job, created=resp.created)

    async def submit_many(self, jobs: Iterable[JobRequest | JobArgs]) -> list[Job | WheelError]:
        """See ``Client.submit_many``."""
        request, refused = _wire.submit_many_request(jobs)
        resp = await self._call(self._jobs.SubmitJobs, request) if request.jobs else None
        return _wire.submit_many_results(refused, resp)

    async def get(self, job_id: int, *, next_fires: int = 5, recent_runs: int = 10) -> Job:
        """See ``Client.get``."""
        request = _wire.get_request(job_id, next_fires, recent_runs)
        return _wire.job_of(await self._call(self._jobs.GetJob, request))

    def jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Job]:
        """See ``Client.jobs``; ``async for job in client.jobs(): ...``."""
        return self._pages(self._jobs.ListJobs, _wire.job_pages(tenant, state, page_size))

    async def cancel(self, job_id: int) -> Job:
        """See ``Client.cancel``."""
        return _wire.job_of(await self._call(self._jobs.CancelJob, _wire.job_ref(job_id)))

    async def pause(self, job_id: int) -> Job:
        """See ``Client.pause``."""
        return _wire.job_of(await self._call(self._jobs.PauseJob, _wire.job_ref(job_id)))

    async def resume(self, job_id: int) -> Job:
        """See ``Client.resume``."""
        return _wire.job_of(await self._call(self._jobs.ResumeJob, _wire.job_ref(job_id)))

    async def trigger(self, job_id: int) -> Trigger:
        """See ``Client.trigger``."""
        return _wire.trigger_of(await self._call(self._jobs.TriggerJob, _wire.job_ref(job_id)))

    async def backfill(self, job_id: int, start: When, end: When) -> Backfill:
        """See ``Client.backfill``."""
        request = _wire.backfill_request(job_id, start, end)
        return _wire.backfill_of(await self._call(self._jobs.BackfillJob, request))

    def runs(
        self, job_id: int, *, states: Iterable[RunState | str] = (), page_size: int = 100
    ) -> AsyncIterator[Run]:
        """See ``Client.runs``; ``async for run in client.runs(job_id): ...``."""
        return self._pages(self._jobs.ListRuns, _wire.run_pages(job_id, states, page_size))

    # -- admin -----------------------------------------------------------------

    async def status(self, *, include_shards: bool = False) -> Status:
        """See ``Client.status``."""
        request = _wire.status_request(include_shards)
        return _wire.status_of(await self._call(self._admin.GetClusterStatus, request))
