"""The trace contexts of jobs in both SQL stores (schema 23): one row a
job, written by traced submits and updates, read in batches by the node's
dispatch tracer (``wheel.rpc._tracing``)."""

from __future__ import annotations

from collections.abc import Sequence

from wheel.store._shared import Executor, Transaction


class TracesSQL:
    """The job-traces calls of ``SQLStore``: ``read`` and ``write`` run a
    function in one transaction; ``param`` is the backend's parameter marker."""

    __slots__ = ("_param", "_read", "_write")

    def __init__(self, read: Transaction, write: Transaction, param: str) -> None:
        self._read = read
        self._write = write
        self._param = param

    def record_job_traces(self, traces: Sequence[tuple[int, str]], now_ms: int) -> None:
        if not traces:
            return
        p = self._param
        upsert = (
            f"INSERT INTO job_traces (job_id, traceparent, updated_at_ms) VALUES ({p}, {p}, {p})"
            " ON CONFLICT (job_id) DO UPDATE SET traceparent = excluded.traceparent,"
            " updated_at_ms = excluded.updated_at_ms"
        )

        def op(cur: Executor) -> None:
            for job_id, traceparent in traces:
                cur.execute(upsert, (job_id, traceparent, now_ms))

        self._write(op)

    def job_traces(self, job_ids: Sequence[int]) -> dict[int, str]:
        if not job_ids:
            return {}
        p = self._param
        wanted = sorted(set(job_ids))

        def op(cur: Executor) -> dict[int, str]:
            out: dict[int, str] = {}
            for i in range(0, len(wanted), 500):
                chunk = wanted[i : i + 500]
                marks = ", ".join([p] * len(chunk))
                rows = cur.execute(
                    f"SELECT job_id, traceparent FROM job_traces WHERE job_id IN ({marks})",
                    tuple(chunk),
                ).fetchall()
                out.update((int(r[0]), str(r[1])) for r in rows)
            return out

        found: dict[int, str] = self._read(op)
        return found
