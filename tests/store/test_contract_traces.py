"""The trace contexts kept with jobs (``TraceStore``), on SQLite, PostgreSQL
and the reference model alike: set, replaced, read back in batches."""

from __future__ import annotations

from wheel.store.base import Store

A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_jobs_trace_context_is_set_replaced_and_read_in_batches(store: Store) -> None:
    assert store.job_traces([]) == {} and store.job_traces([1, 2]) == {}
    store.record_job_traces([], 1)
    store.record_job_traces([(1, A), (2, B)], 1_000)
    store.record_job_traces([(1, B)], 2_000)
    assert store.job_traces([1, 2, 3]) == {1: B, 2: B}
    many = [(job_id, A) for job_id in range(10, 1_210)]
    store.record_job_traces(many, 3_000)
    got = store.job_traces([job_id for job_id, _ in many] + [2])
    assert len(got) == 1_201 and got[2] == B and got[1_209] == A
