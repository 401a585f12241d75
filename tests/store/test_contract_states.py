"""Jobs found by state on SQLite, PostgreSQL and the reference model alike:
a one-shot's claim and end move it between states a search tells apart."""

from __future__ import annotations

from dataclasses import replace

from tests.store.conftest import interval_job, once_job
from tests.store.test_contract import claim, done
from wheel.store.base import JobState, Store


def test_a_search_by_state_tells_running_one_shots_from_completed_and_failed_ones(
    store: Store,
) -> None:
    running, _ = store.submit_job(once_job(50_000))
    completed, _ = store.submit_job(once_job(50_000))
    failed, _ = store.submit_job(once_job(50_000, tenant="other"))
    active, _ = store.submit_job(interval_job("every"))
    outs = store.claim_fires(
        [
            claim(j.job_id, 50_000, fence=i + 1, new=None)
            for i, j in enumerate([running, completed, failed])
        ]
    )
    ended = [
        replace(done(outs[1].run_id or 0, 2), job_state=JobState.COMPLETED),
        replace(done(outs[2].run_id or 0, 3), job_state=JobState.FAILED),
    ]
    assert all(o.applied for o in store.complete_runs(ended))
    for state, jobs in (
        (JobState.RUNNING, [running]),
        (JobState.COMPLETED, [completed]),
        (JobState.FAILED, [failed]),
        (JobState.ACTIVE, [active]),
    ):
        assert [j.job_id for j in store.list_jobs(state=state)] == [j.job_id for j in jobs]
        # Beside a tenant and a name prefix, as the console searches.
        assert [j.job_id for j in store.list_jobs(state=state, tenant=jobs[0].spec.tenant)] == [
            j.job_id for j in jobs
        ]
        named = store.list_jobs(state=state, name_prefix=jobs[0].spec.name)
        assert [j.job_id for j in named] == [j.job_id for j in jobs]
