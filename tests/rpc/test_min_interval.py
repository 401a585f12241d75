"""The node's minimum interval (``NodeConfig.min_interval_ms``, ``wheelctl
serve --min-interval``): SubmitJob, SubmitJobs and UpdateJob refuse a
shorter period with INVALID_ARGUMENT naming the field and the minimum, and
change nothing; a seconds-field cron (every second) is within it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.rpc.test_api import Api, InProcessServer, connect, cron, every, spec, submit
from tests.rpc.test_operator_api import update
from wheel.cli import build_parser
from wheel.cli.serve import serve_config
from wheel.node import NodeConfig
from wheel.rpc.v1 import job_service_pb2

FIELD = "spec.schedule.interval.period_ms"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    server = InProcessServer(tmp_path).start()  # the node's default minimum
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def _refused(exc: pytest.ExceptionInfo[grpc.RpcError], minimum_ms: int) -> None:
    err = exc.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = err.details()
    assert FIELD in details and f"minimum interval of {minimum_ms} ms" in details, details


def test_the_default_minimum_is_one_second() -> None:
    assert NodeConfig().min_interval_ms == 1_000


def test_submit_refuses_an_interval_below_the_minimum(api: Api) -> None:
    with pytest.raises(grpc.RpcError) as exc:
        submit(api, spec(name="busy-loop", schedule=every(1)))
    _refused(exc, 1_000)
    with pytest.raises(grpc.RpcError) as exc:
        submit(api, spec(name="just-under", schedule=every(999, mode=1)))
    _refused(exc, 1_000)
    listed = api.jobs.ListJobs(job_service_pb2.ListJobsRequest(), timeout=10)
    assert list(listed.jobs) == []  # nothing was stored
    assert submit(api, spec(name="each-second", schedule=every(1_000))).created
    # A seconds-field cron fires every second: within the minimum.
    assert submit(api, spec(name="cron-seconds", schedule=cron("* * * * * *"))).created


def test_a_bulk_submit_refuses_each_short_interval_alone(api: Api) -> None:
    out = api.jobs.SubmitJobs(
        job_service_pb2.SubmitJobsRequest(
            jobs=[
                job_service_pb2.SubmitJobRequest(spec=spec(name="fine", schedule=every(60_000))),
                job_service_pb2.SubmitJobRequest(spec=spec(name="short", schedule=every(10))),
            ]
        ),
        timeout=10,
    )
    fine, short = out.results
    assert fine.response.created and not fine.error_code
    assert short.error_code == "INVALID_ARGUMENT"
    assert FIELD in short.error_message and "1000 ms" in short.error_message


def test_an_update_to_a_short_interval_is_refused_and_changes_nothing(api: Api) -> None:
    job = submit(api, spec(name="minutely", schedule=every(60_000))).job
    with pytest.raises(grpc.RpcError) as exc:
        update(api, job.job_id, spec(name="minutely", schedule=every(5)), "schedule")
    _refused(exc, 1_000)
    got = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    assert got.spec.schedule.interval.period_ms == 60_000
    # Other fields of a job change as before; a period at the minimum is taken.
    renamed = update(api, job.job_id, spec(name="renamed", schedule=every(5)), "name")
    assert renamed.job.spec.name == "renamed"
    assert renamed.job.spec.schedule.interval.period_ms == 60_000
    faster = update(api, job.job_id, spec(name="renamed", schedule=every(1_000)), "schedule")
    assert faster.job.spec.schedule.interval.period_ms == 1_000


def test_the_minimum_is_a_node_setting(tmp_path: Path) -> None:
    server = InProcessServer(tmp_path, min_interval_ms=5_000).start()
    try:
        with connect(server) as api:
            with pytest.raises(grpc.RpcError) as exc:
                submit(api, spec(name="two-seconds", schedule=every(2_000)))
            _refused(exc, 5_000)
            assert submit(api, spec(name="five-seconds", schedule=every(5_000))).created
    finally:
        server.stop()
    off = InProcessServer(tmp_path / "off", min_interval_ms=0)
    (tmp_path / "off").mkdir()
    off.start()
    try:
        with connect(off) as api:
            assert submit(api, spec(name="tight", schedule=every(50))).created
    finally:
        off.stop()


@pytest.mark.parametrize(
    ("flag", "expected"),
    [(None, 1_000), ("250ms", 250), ("1s", 1_000), ("2m", 120_000), ("0", 0)],
)
def test_serve_takes_the_minimum_as_a_flag(tmp_path: Path, flag: str | None, expected: int) -> None:
    argv = ["serve"] + (["--min-interval", flag] if flag else [])
    ns = build_parser().parse_args(argv)
    assert serve_config(ns, tmp_path).min_interval_ms == expected


def test_serve_refuses_a_minimum_that_is_not_a_duration(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--min-interval", "soon"])
    assert "--min-interval" in capsys.readouterr().err
