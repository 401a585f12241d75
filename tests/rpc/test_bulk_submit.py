"""A bulk submit (SubmitJobs) as a batch: its jobs validated and queued one by
one, stored in several group commits, answered together in order; the
policies and crons its jobs share made once."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wheel.node._jobs as node_jobs
from tests.rpc.test_api import Api, InProcessServer, connect, cron, every, now_ms, spec
from wheel.errors import InvalidArgument, StoreError
from wheel.rpc import convert
from wheel.rpc._common import status_of
from wheel.rpc.v1 import job_service_pb2, jobs_pb2

HOUR_MS = 3_600_000


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(tmp_path).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def _names(api: Api) -> list[str]:
    listed = api.jobs.ListJobs(job_service_pb2.ListJobsRequest(page_size=100), timeout=10)
    return sorted(j.spec.name for j in listed.jobs)


def test_a_bulk_submit_over_several_writes_answers_each_job_in_order(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three jobs a store write: the batch's ten good jobs take four writes,
    # the second of which fails. Each job it carried answers with that
    # failure, the rest are stored, the bad ones name their field, and every
    # answer stands in its job's place.
    monkeypatch.setattr(node_jobs, "MAX_SUBMIT_BATCH", 3)
    node = api.server.node
    assert node is not None
    real = node.store.submit_jobs
    writes: list[list[str]] = []
    lock = threading.Lock()

    def flaky(news: Any) -> Any:
        with lock:
            writes.append([n.spec.name for n in news])
            second = len(writes) == 2
        if second:
            raise StoreError("the store went away for a moment")
        return real(news)

    node.store.submit_jobs = flaky  # type: ignore[method-assign]
    start = now_ms() + HOUR_MS
    items = [
        job_service_pb2.SubmitJobRequest(spec=spec(name=f"g{i}", schedule=every(HOUR_MS, start)))
        for i in range(10)
    ]
    items.insert(4, job_service_pb2.SubmitJobRequest(spec=spec(name="bad", schedule=every(1))))
    items.insert(9, job_service_pb2.SubmitJobRequest(spec=spec(name="x" * 300)))
    try:
        results = api.jobs.SubmitJobs(
            job_service_pb2.SubmitJobsRequest(jobs=items), timeout=30
        ).results
    finally:
        node.store.submit_jobs = real  # type: ignore[method-assign]
    assert len(writes) == 4 and [len(w) for w in writes] == [3, 3, 3, 1]
    failed = set(writes[1])
    assert len(results) == 12
    for item, result in zip(items, results, strict=True):
        name = item.spec.name
        if name == "bad":
            assert result.error_code == "INVALID_ARGUMENT"
            assert "spec.schedule.interval.period_ms" in result.error_message
        elif name.startswith("x"):
            assert result.error_code in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
            assert "spec.name" in result.error_message
        elif name in failed:
            assert result.error_code == status_of(StoreError("")).name, (name, result)
            assert "went away" in result.error_message
        else:
            assert result.error_code == "", (name, result)
            assert result.response.created
            assert result.response.job.spec.name == name
    stored = sorted(f"g{i}" for i in range(10) if f"g{i}" not in failed)
    assert _names(api) == stored
    # The failed jobs go in when sent again.
    again = [i for i in items if i.spec.name in failed]
    out = api.jobs.SubmitJobs(job_service_pb2.SubmitJobsRequest(jobs=again), timeout=30)
    assert all(r.error_code == "" and r.response.created for r in out.results)
    assert _names(api) == sorted(f"g{i}" for i in range(10))


def test_an_empty_bulk_submit_and_one_of_bad_jobs_only_answer_at_once(api: Api) -> None:
    empty = api.jobs.SubmitJobs(job_service_pb2.SubmitJobsRequest(), timeout=10)
    assert list(empty.results) == []
    bad = [
        job_service_pb2.SubmitJobRequest(spec=spec(name="")),
        job_service_pb2.SubmitJobRequest(spec=spec(name="c", schedule=cron("61 * * * *"))),
    ]
    out = api.jobs.SubmitJobs(job_service_pb2.SubmitJobsRequest(jobs=bad), timeout=10)
    assert [r.error_code for r in out.results] == ["INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert _names(api) == []


def _msg(**kw: Any) -> jobs_pb2.JobSpec:
    msg = jobs_pb2.JobSpec(name="j", handler="h", **kw)
    msg.schedule.cron.expr = "0 3 * * *"
    msg.schedule.cron.time_zone = "Asia/Tokyo"
    return msg


def test_jobs_with_the_same_policies_and_cron_share_them_and_bad_ones_are_refused_each_time() -> (
    None
):
    a = convert.spec_from_proto(_msg(), now_ms=0, sent=True)
    b = convert.spec_from_proto(_msg(), now_ms=0, sent=True)
    assert a.catch_up is b.catch_up and a.overlap is b.overlap and a.retry is b.retry
    assert a.schedule is b.schedule and a == b
    other = _msg()
    other.retry.max_attempts = 7
    c = convert.spec_from_proto(other, now_ms=0, sent=True)
    assert c.retry.max_attempts == 7 and c.retry is not a.retry and c.catch_up == a.catch_up
    for _ in range(2):  # a refusal is never kept as a value
        bad = _msg()
        bad.catch_up.mode = 99  # type: ignore[assignment]
        with pytest.raises(InvalidArgument, match=re.escape("spec.catch_up.mode")):
            convert.spec_from_proto(bad, now_ms=0, sent=True)
        zone = _msg()
        zone.schedule.cron.time_zone = "Mars/Olympus"
        with pytest.raises(InvalidArgument, match=re.escape("spec.schedule.cron.time_zone")):
            convert.spec_from_proto(zone, now_ms=0, sent=True)
    # A zone read back as stored is not checked: not the same entry as a sent one.
    stored = _msg()
    stored.schedule.cron.time_zone = "Mars/Olympus"
    assert convert.spec_from_proto(stored, now_ms=0).schedule.time_zone == "Mars/Olympus"  # type: ignore[union-attr]
    with pytest.raises(InvalidArgument, match=re.escape("spec.schedule.cron.time_zone")):
        convert.spec_from_proto(stored, now_ms=0, sent=True)


def test_the_shared_policies_stay_bounded() -> None:
    for n in range(convert._SHARED_MAX + 10):
        msg = _msg()
        msg.retry.max_attempts = 1 + n % 100
        msg.timeout_ms = 1_000
        msg.overlap.max_buffered = 1 + n
        spec_ = convert.spec_from_proto(msg, now_ms=0, sent=True)
        assert spec_.overlap.max_buffered == 1 + n
    assert len(convert._policies_made) <= convert._SHARED_MAX
    bad = _msg()
    bad.overlap.policy = 77  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match=re.escape("spec.overlap.policy")):
        convert.spec_from_proto(bad, now_ms=0, sent=True)
