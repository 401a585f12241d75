"""The console's aggregates (``OverviewStore``) on SQLite, PostgreSQL and the
reference model alike: jobs by state, runs by bucket and outcome with missed
fires, the feed of recent runs with its filters and pages, a job's last
fires and its run statistics, each for every tenant or for one."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from tests.store.conftest import interval_job
from wheel.engine.records import Completion, FireClaim, RunStart
from wheel.store.base import JobState, MissedFire, MissedReason, RunState, Store

MINUTE = 60_000
MISSED_OUTCOME = "missed"


def fire(store: Store, job_id: int, at: int, *, attempt: int = 0) -> int:
    """Claim the fire at ``at`` (attempt ``attempt``); its run id."""
    [out] = store.claim_fires(
        [
            FireClaim(
                job_id=job_id,
                scheduled_for=at,
                attempt=attempt,
                fence=1 + attempt,
                dispatched_at_ms=at,
                advance=False,
                expected_next_run_at=None,
                new_next_run_at=None,
            )
        ]
    )
    assert out.run_id is not None
    return out.run_id


def end(
    store: Store,
    run_id: int,
    state: RunState,
    *,
    started: int,
    finished: int,
    fence: int = 1,
    error: str | None = None,
) -> None:
    store.mark_running([RunStart(run_id=run_id, fence=fence, worker_id="w", started_at_ms=started)])
    [out] = store.complete_runs(
        [
            Completion(
                run_id=run_id,
                fence=fence,
                state=state,
                finished_at_ms=finished,
                error=error,
                worker_id="w",
            )
        ]
    )
    assert out.applied


def missed(store: Store, job_id: int, at: int, recorded: int) -> None:
    why = MissedReason.OVERLAP
    store.record_missed(
        [MissedFire(job_id=job_id, scheduled_for=at, reason=why, recorded_at_ms=recorded)]
    )


def two_tenants(store: Store) -> tuple[int, int, int]:
    """Jobs a (acme, handler reports.build), b (acme, paused), c (globex,
    handler mail.send): ids."""
    a, _ = store.submit_job(interval_job("nightly-report"))
    b, _ = store.submit_job(interval_job("hourly-report"))
    c_new = interval_job("mailer", tenant="globex")
    c, _ = store.submit_job(replace(c_new, spec=replace(c_new.spec, handler="mail.send")))
    store.set_job_state(b.job_id, JobState.PAUSED, next_run_at=None, now_ms=2_000)
    return a.job_id, b.job_id, c.job_id


def test_jobs_by_state_for_every_tenant_and_for_one(store: Store) -> None:
    two_tenants(store)
    assert store.count_jobs_by_state() == {JobState.ACTIVE: 2, JobState.PAUSED: 1}
    assert store.count_jobs_by_state("acme") == {JobState.ACTIVE: 1, JobState.PAUSED: 1}
    assert store.count_jobs_by_state("globex") == {JobState.ACTIVE: 1}
    assert store.count_jobs_by_state("nobody") == {}


def test_outcome_counts_bucket_runs_by_their_end_with_missed_fires(store: Store) -> None:
    a, _, c = two_tenants(store)
    t0 = 100 * MINUTE
    r1 = fire(store, a, t0)
    end(store, r1, RunState.SUCCEEDED, started=t0, finished=t0 + 1_000)
    r2 = fire(store, a, t0 + MINUTE)
    end(store, r2, RunState.FAILED, started=t0 + MINUTE, finished=t0 + MINUTE + 5)
    r3 = fire(store, c, t0 + 2 * MINUTE)
    end(store, r3, RunState.SUCCEEDED, started=t0, finished=t0 + MINUTE + 7)
    old = fire(store, c, t0 - 5 * MINUTE)
    end(store, old, RunState.SUCCEEDED, started=t0 - 5 * MINUTE, finished=t0 - 4 * MINUTE)
    fire(store, c, t0 + 3 * MINUTE)  # in flight: not counted
    missed(store, a, t0 - 10 * MINUTE, recorded=t0 + 30)
    missed(store, c, t0 - 9 * MINUTE, recorded=t0 - MINUTE)  # recorded before the window

    got = store.outcome_counts(since_ms=t0, bucket_ms=MINUTE)
    assert [(g.bucket_ms - t0, g.outcome, g.count) for g in got] == [
        (0, "missed", 1),
        (0, "succeeded", 1),
        (MINUTE, "failed", 1),
        (MINUTE, "succeeded", 1),
    ]
    acme = store.outcome_counts(since_ms=t0, bucket_ms=MINUTE, tenant="acme")
    assert [(g.bucket_ms - t0, g.outcome, g.count) for g in acme] == [
        (0, "missed", 1),
        (0, "succeeded", 1),
        (MINUTE, "failed", 1),
    ]
    hour = store.outcome_counts(since_ms=0, bucket_ms=60 * MINUTE, tenant="globex")
    assert [(g.bucket_ms, g.outcome, g.count) for g in hour] == [
        (60 * MINUTE, "missed", 1),
        (60 * MINUTE, "succeeded", 2),
    ]


def test_the_feed_pages_newest_first_and_filters(store: Store) -> None:
    a, b, c = two_tenants(store)
    ids = []
    for k, (job, state) in enumerate(
        [(a, RunState.SUCCEEDED), (c, RunState.FAILED), (b, RunState.FAILED), (a, RunState.FAILED)]
    ):
        run = fire(store, job, (k + 1) * MINUTE)
        end(store, run, state, started=run, finished=(k + 1) * MINUTE + 10, error=f"boom {k}")
        ids.append(run)
    in_flight = fire(store, c, 10 * MINUTE)

    first = store.recent_runs(limit=3)
    feed = first.runs
    assert [f.run.run_id for f in feed] == [in_flight, ids[3], ids[2]]
    assert first.next_before == ids[2]
    assert (feed[1].tenant, feed[1].job_name, feed[1].handler) == (
        "acme",
        "nightly-report",
        "reports.build",
    )
    assert feed[1].run.error == "boom 3" and feed[1].run.state is RunState.FAILED
    rest = store.recent_runs(before_run_id=first.next_before)
    assert [f.run.run_id for f in rest.runs] == [ids[1], ids[0]]
    assert rest.next_before is None

    def listed(**filters: Any) -> list[int]:
        return [f.run.run_id for f in store.recent_runs(**filters).runs]

    assert listed(outcome=RunState.FAILED) == [ids[3], ids[2], ids[1]]
    assert listed(tenant="globex") == [in_flight, ids[1]]
    assert listed(handler="mail.send") == [in_flight, ids[1]]
    assert listed(job_name="nightly") == [ids[3], ids[0]]
    assert listed(tenant="acme", outcome=RunState.FAILED, job_name="hourly") == [ids[2]]
    assert listed(tenant="globex", handler="reports.build") == []


@pytest.mark.parametrize("handler", ["rapports.générer", 'say "hi"\\now', "h"])
def test_the_feed_finds_a_handler_whatever_characters_it_holds(store: Store, handler: str) -> None:
    """The handler filter searches the spec's text before reading its JSON:
    escaped characters and letters outside ASCII are found as written."""
    a, _, c = two_tenants(store)
    job = interval_job("odd-handler")
    d, _ = store.submit_job(replace(job, spec=replace(job.spec, handler=handler)))
    ran = [fire(store, job_id, MINUTE) for job_id in (a, d.job_id, c)]
    assert [f.run.run_id for f in store.recent_runs(handler=handler).runs] == [ran[1]]
    assert [f.handler for f in store.recent_runs(handler=handler).runs] == [handler]


def test_a_feed_page_reads_a_bounded_range_of_runs_and_says_where_to_go_on(
    store: Store,
) -> None:
    a, _, c = two_tenants(store)
    ids = [fire(store, a if k != 1 else c, (k + 1) * MINUTE) for k in range(6)]
    assert ids == sorted(ids)
    # Two run ids a call: globex's one run is further back than that.
    page = store.recent_runs(tenant="globex", scan=2)
    assert (page.runs, page.next_before) == ([], ids[3] + 1)
    seen: list[int] = []
    token = None
    for _ in range(10):
        page = store.recent_runs(tenant="globex", scan=2, before_run_id=token)
        seen += [f.run.run_id for f in page.runs]
        token = page.next_before
        if token is None:
            break
    assert seen == [ids[1]] and token is None
    # Every run, two at a time: each page full, in order, to the oldest.
    seen, token = [], None
    for _ in range(10):
        page = store.recent_runs(scan=2, limit=2, before_run_id=token)
        seen += [f.run.run_id for f in page.runs]
        token = page.next_before
        if token is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert store.recent_runs(before_run_id=ids[0]).runs == []


def test_a_jobs_last_fires_show_each_fires_latest_attempt_and_the_missed(store: Store) -> None:
    a, _, c = two_tenants(store)
    first = fire(store, a, MINUTE)
    end(store, first, RunState.FAILED, started=MINUTE, finished=MINUTE + 5, error="boom")
    retry = fire(store, a, MINUTE, attempt=1)
    end(store, retry, RunState.SUCCEEDED, started=MINUTE + 9, finished=MINUTE + 20, fence=2)
    missed(store, a, 2 * MINUTE, recorded=2 * MINUTE)
    last = fire(store, a, 3 * MINUTE)
    end(store, last, RunState.TIMED_OUT, started=3 * MINUTE, finished=4 * MINUTE, error="late")
    fire(store, c, MINUTE)  # another job's

    fires = store.recent_fires(a)
    assert [(f.scheduled_for, f.outcome, f.attempt, f.run_id, f.detail) for f in fires] == [
        (3 * MINUTE, "timed_out", 0, last, "late"),
        (2 * MINUTE, "missed", 0, None, "overlap"),
        (MINUTE, "succeeded", 1, retry, None),
    ]
    assert [f.scheduled_for for f in store.recent_fires(a, limit=2)] == [3 * MINUTE, 2 * MINUTE]
    assert store.recent_fires(10**12) == []


def test_run_stats_count_a_jobs_runs_that_ended_in_the_window(store: Store) -> None:
    a, _, c = two_tenants(store)
    for k in range(1, 101):
        run = fire(store, a, k * MINUTE)
        state = RunState.FAILED if k % 10 == 0 else RunState.SUCCEEDED
        end(store, run, state, started=k * MINUTE, finished=k * MINUTE + k)
    other = fire(store, c, MINUTE)
    end(store, other, RunState.SUCCEEDED, started=MINUTE, finished=MINUTE + 9_999)

    stats = store.run_stats(a, since_ms=0)
    assert (stats.runs, stats.succeeded, stats.p50_ms, stats.p99_ms) == (100, 90, 50, 99)
    later = store.run_stats(a, since_ms=91 * MINUTE)
    assert (later.runs, later.succeeded, later.p50_ms, later.p99_ms) == (10, 9, 95, 100)
    none = store.run_stats(a, since_ms=10**9)
    assert (none.runs, none.succeeded, none.p50_ms, none.p99_ms) == (0, 0, None, None)


def test_run_stats_count_the_fires_of_the_window_not_the_runs_that_ended_in_it(
    store: Store,
) -> None:
    """A day's figures are those of the day's fires (a range of the job's
    fire key): an old fire that ended inside the window is not one of them,
    a fire of the window counts with every attempt once it ended, and a run
    still in flight does not count."""
    a, _, _ = two_tenants(store)
    old = fire(store, a, MINUTE)  # fired before the window, ended in it
    end(store, old, RunState.SUCCEEDED, started=MINUTE, finished=100 * MINUTE)
    first = fire(store, a, 90 * MINUTE)
    end(store, first, RunState.FAILED, started=90 * MINUTE, finished=90 * MINUTE + 10)
    retry = fire(store, a, 90 * MINUTE, attempt=1)
    end(store, retry, RunState.SUCCEEDED, started=91 * MINUTE, finished=91 * MINUTE + 30, fence=2)
    fire(store, a, 95 * MINUTE)  # in flight

    stats = store.run_stats(a, since_ms=89 * MINUTE)
    assert (stats.runs, stats.succeeded, stats.p50_ms, stats.p99_ms) == (2, 1, 10, 30)


ENDINGS = [RunState.SUCCEEDED] * 6 + [
    RunState.FAILED,
    RunState.TIMED_OUT,
    RunState.LOST,
    RunState.DEAD_LETTERED,
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_counts_agree_with_a_count_of_the_runs_however_they_were_written(
    store: Store, seed: int
) -> None:
    """Runs of three tenants end in batches over 40 minutes (some ended
    twice: the second is recognised, not counted again; some never), and
    fires are recorded missed (some twice); every window, width and tenant
    counts what a count over the runs and missed fires finds."""
    rng = random.Random(seed)
    tenants = ["acme", "globex", "initech"]
    jobs = [
        (store.submit_job(interval_job(f"job-{k}", tenant=tenants[k % 3]))[0].job_id, k % 3)
        for k in range(9)
    ]
    t0 = 1_000 * MINUTE
    claims = [
        FireClaim(
            job_id=jobs[k % 9][0],
            scheduled_for=t0 + k * 1_000,
            attempt=0,
            fence=1,
            dispatched_at_ms=t0 + k * 1_000,
            advance=False,
            expected_next_run_at=None,
            new_next_run_at=None,
        )
        for k in range(300)
    ]
    runs = [out.run_id or 0 for out in store.claim_fires(claims)]
    assert 0 not in runs
    ended: list[tuple[int, str, int]] = []  # (tenant, outcome, end)
    todo = list(range(len(runs)))
    rng.shuffle(todo)
    sent: list[Completion] = []
    while todo:
        batch = [todo.pop() for _ in range(min(len(todo), rng.randint(1, 40)))]
        completions = []
        for i in batch:
            if rng.random() < 0.1:
                continue  # still in flight: never counted
            state = rng.choice(ENDINGS)
            at = t0 + rng.randrange(40 * MINUTE)
            completions.append(
                Completion(run_id=runs[i], fence=1, state=state, finished_at_ms=at, worker_id="w")
            )
            ended.append((i % 9 % 3, state.value, at))
        again = rng.sample(sent, min(len(sent), rng.randint(0, 3)))  # already ended
        outs = store.complete_runs([*completions, *again])
        assert all(o.applied for o in outs)
        sent += completions
    skipped: list[tuple[int, str, int]] = []
    for k in range(60):
        job_id, tenant = jobs[k % 9]
        at = t0 + rng.randrange(40 * MINUTE)
        fires = [MissedFire(job_id=job_id, scheduled_for=k, reason=MissedReason.OVERLAP,
                            recorded_at_ms=at)]  # fmt: skip
        store.record_missed(fires * rng.randint(1, 2))
        store.record_missed(fires)  # recorded already: not counted again
        skipped.append((tenant, MISSED_OUTCOME, at))

    def expected(since: int, width: int, tenant: int | None) -> list[tuple[int, str, int]]:
        counted = Counter(
            (at // width * width, outcome)
            for t, outcome, at in ended + skipped
            if at >= since and tenant in (None, t)
        )
        return sorted((b, o, n) for (b, o), n in counted.items())

    for width in (MINUTE, 15 * MINUTE, 60 * MINUTE, 90_000):
        for since in (t0, t0 + 7 * MINUTE, t0 + 7 * MINUTE + 12_345, 0):
            for whose in (None, 0, 2):
                name = None if whose is None else tenants[whose]
                got = store.outcome_counts(since_ms=since, bucket_ms=width, tenant=name)
                assert [(g.bucket_ms, g.outcome, g.count) for g in got] == expected(
                    since, width, whose
                ), (width, since, whose)
