"""The trace contexts a node keeps with jobs (``wheel.tracing``): written
when a traced call submits or updates a job, read in batches when the
jobs' fires are handed out."""

from __future__ import annotations

from collections.abc import Sequence

from wheel.node._changes import InThread
from wheel.node._values import Clock
from wheel.store.base import Store


class JobTraces:
    """The store's ``TraceStore`` calls, off the event loop."""

    def __init__(self, store: Store, clock: Clock, *, in_thread: InThread) -> None:
        self._store = store
        self._clock = clock
        self._in_thread = in_thread

    async def record(self, traces: Sequence[tuple[int, str]]) -> None:
        await self._in_thread(self._store.record_job_traces, traces, self._clock.now_ms())

    async def read(self, job_ids: Sequence[int]) -> dict[int, str]:
        return await self._in_thread(self._store.job_traces, job_ids)
