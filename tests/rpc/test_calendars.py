"""Calendars over real gRPC on a node's process: AdminService's calls (days
checked and named, tenants kept apart), submits and updates naming them,
and a preview that skips their days."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.rpc.test_api import cron, every, spec, submit
from tests.rpc.test_secrets import SecretsServer, _Jobs
from wheel.auth import JOBS_READ, JOBS_WRITE
from wheel.rpc.v1 import admin_service_pb2 as admin
from wheel.rpc.v1 import admin_service_pb2_grpc, job_service_pb2, jobs_pb2

DAY_MS = 86_400_000
_BAD = "INVALID_ARGUMENT"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SecretsServer]:
    s = SecretsServer(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def admin_stub(server: SecretsServer) -> Iterator[admin_service_pb2_grpc.AdminServiceStub]:
    channel = grpc.insecure_channel(server.target)
    try:
        yield admin_service_pb2_grpc.AdminServiceStub(channel)
    finally:
        channel.close()


@pytest.fixture
def api(server: SecretsServer) -> Iterator[_Jobs]:
    jobs = _Jobs(server.target)
    try:
        yield jobs
    finally:
        jobs.channel.close()


def _set(stub: Any, name: str, **days: Any) -> admin.Calendar:
    ranges = [admin.DateRange(from_date=a, to_date=b) for a, b in days.pop("ranges", [])]
    cal = admin.Calendar(name=name, ranges=ranges, **days)
    return stub.SetCalendar(admin.SetCalendarRequest(calendar=cal), timeout=10)  # type: ignore[no-any-return]


def _skipping(names: list[str]) -> jobs_pb2.JobSpec:
    msg = spec()
    msg.skip_calendars.extend(names)
    return msg


def test_set_get_list_and_delete_a_calendar(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub,
) -> None:
    made = _set(
        admin_stub,
        "holidays",
        dates=["2026-12-25", "2026-12-24", "2026-12-25"],
        ranges=[("2026-12-30", "2027-01-02")],
        weekdays=["Sunday"],
    )
    assert (made.tenant, made.name, made.version) == ("default", "holidays", 1)
    # Normalised: dates sorted and once, weekdays by their short names.
    assert list(made.dates) == ["2026-12-24", "2026-12-25"]
    assert [(r.from_date, r.to_date) for r in made.ranges] == [("2026-12-30", "2027-01-02")]
    assert list(made.weekdays) == ["sun"]
    got = admin_stub.GetCalendar(admin.GetCalendarRequest(name="holidays"), timeout=10)
    assert got == made
    again = _set(admin_stub, "holidays", weekdays=["sat"])
    assert again.version == 2 and list(again.dates) == []
    listed = admin_stub.ListCalendars(admin.ListCalendarsRequest(), timeout=10).calendars
    assert [(c.name, c.version) for c in listed] == [("holidays", 2)]
    gone = admin_stub.DeleteCalendar(admin.DeleteCalendarRequest(name="holidays"), timeout=10)
    assert gone.deleted
    assert not admin_stub.DeleteCalendar(admin.DeleteCalendarRequest(name="holidays")).deleted
    with pytest.raises(grpc.RpcError) as info:
        admin_stub.GetCalendar(admin.GetCalendarRequest(name="holidays"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("days", "field"),
    [
        ({"name": "", "weekdays": ["sat"]}, "calendar.name"),
        ({"name": "a\0b", "weekdays": ["sat"]}, "calendar.name"),
        ({"name": "x" * 201, "weekdays": ["sat"]}, "calendar.name"),
        ({"name": "c", "tenant": "*", "weekdays": ["sat"]}, "calendar.tenant"),
        ({"name": "c", "dates": ["2026-02-30"]}, "calendar.dates[0]"),
        ({"name": "c", "dates": ["2026-12-01", "tomorrow"]}, "calendar.dates[1]"),
        ({"name": "c", "ranges": [("2026-12-02", "2026-12-01")]}, "calendar.ranges[0].to"),
        ({"name": "c", "weekdays": ["sat", "caturday"]}, "calendar.weekdays[1]"),
        ({"name": "c"}, "calendar"),
    ],
)
def test_a_bad_calendar_names_its_field_and_changes_nothing(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub, days: dict[str, Any], field: str
) -> None:
    _set(admin_stub, "kept", weekdays=["sun"])
    with pytest.raises(grpc.RpcError) as info:
        _set(admin_stub, **days)
    assert info.value.code().name == _BAD
    assert str(info.value.details()).startswith(f"{field}:")
    listed = admin_stub.ListCalendars(admin.ListCalendarsRequest(), timeout=10).calendars
    assert [(c.name, c.version) for c in listed] == [("kept", 1)]


def test_a_submit_naming_an_unknown_calendar_is_refused_naming_the_field(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: Any
) -> None:
    _set(admin_stub, "weekend", weekdays=["sat", "sun"])
    with pytest.raises(grpc.RpcError) as info:
        submit(api, _skipping(["weekend", "holidays"]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value.details()).startswith("spec.skip_calendars[1]:")
    with pytest.raises(grpc.RpcError) as info:
        submit(api, _skipping(["weekend", "weekend"]))
    assert str(info.value.details()).startswith("spec.skip_calendars[1]:")
    job = submit(api, _skipping(["weekend"])).job
    assert list(job.spec.skip_calendars) == ["weekend"]
    read = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
    assert list(read.spec.skip_calendars) == ["weekend"]
    # An update names the field too, and takes a known one.
    update = job_service_pb2.UpdateJobRequest(
        job_id=job.job_id, spec=_skipping(["nope"]), fields=["skip_calendars"]
    )
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.UpdateJob(update, timeout=10)
    assert str(info.value.details()).startswith("spec.skip_calendars[0]:")
    _set(admin_stub, "nope", dates=["2030-01-01"])
    changed = api.jobs.UpdateJob(update, timeout=10).job
    assert list(changed.spec.skip_calendars) == ["nope"]


def test_a_calendar_of_another_tenant_is_not_found_nor_skipped(tmp_path: Path) -> None:
    server = SecretsServer(tmp_path, auth=True)
    server.start()
    channel = grpc.insecure_channel(server.target)
    try:
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        root = server.admin_token_file.read_text().strip()

        def as_(token: str) -> list[tuple[str, str]]:
            return [("authorization", f"Bearer {token}")]

        def tenant_token(tenant: str, *scopes: str) -> str:
            made = stub.CreateToken(
                admin.CreateTokenRequest(tenant=tenant, scopes=list(scopes)),
                metadata=as_(root),
                timeout=10,
            )
            return str(made.token)

        acme = tenant_token("acme", JOBS_READ, JOBS_WRITE)
        zeta = tenant_token("zeta", JOBS_READ, JOBS_WRITE)
        reader = tenant_token("acme", JOBS_READ)
        cal = admin.Calendar(name="hol", weekdays=["sun"])
        mine = stub.SetCalendar(
            admin.SetCalendarRequest(calendar=cal), metadata=as_(acme), timeout=10
        )
        assert mine.tenant == "acme"
        with pytest.raises(grpc.RpcError) as info:
            stub.GetCalendar(admin.GetCalendarRequest(name="hol"), metadata=as_(zeta), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as info:
            stub.SetCalendar(
                admin.SetCalendarRequest(calendar=cal), metadata=as_(reader), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        other = admin.Calendar(tenant="zeta", name="hol", weekdays=["sun"])
        with pytest.raises(grpc.RpcError) as info:
            stub.SetCalendar(
                admin.SetCalendarRequest(calendar=other), metadata=as_(acme), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        listed = stub.ListCalendars(admin.ListCalendarsRequest(), metadata=as_(zeta), timeout=10)
        assert not listed.calendars
        every_one = stub.ListCalendars(admin.ListCalendarsRequest(), metadata=as_(root))
        assert [(c.tenant, c.name) for c in every_one.calendars] == [("acme", "hol")]
    finally:
        channel.close()
        server.stop()


def test_preview_skips_the_calendar_days_and_shows_each_skipped_day(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: Any
) -> None:
    _set(admin_stub, "xmas", dates=["2030-12-25"], ranges=[("2030-12-28", "2030-12-29")])
    start = int(datetime(2030, 12, 24, tzinfo=UTC).timestamp() * 1000)
    request = job_service_pb2.PreviewScheduleRequest(
        schedule=every(DAY_MS // 2, start_at_ms=start), from_ms=start, count=5
    )
    request.skip_calendars.append("xmas")
    got = api.jobs.PreviewSchedule(request, timeout=10)
    half = DAY_MS // 2
    assert list(got.fires_ms) == [
        start,
        start + half,
        start + 2 * DAY_MS,
        start + 5 * half,
        start + 3 * DAY_MS,
    ]
    assert list(got.skipped_ms) == [start + DAY_MS]
    request.skip_calendars.append("nope")
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.PreviewSchedule(request, timeout=10)
    assert str(info.value.details()).startswith("spec.skip_calendars[1]:")


def test_a_job_s_next_fires_leave_out_its_skipped_days(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: Any
) -> None:
    today = datetime.now(UTC).date()
    skipped = {str(today), str(today + timedelta(days=1))}
    _set(admin_stub, "soon", dates=sorted(skipped))
    msg = _skipping(["soon"])
    msg.schedule.CopyFrom(cron("0 12 * * *"))
    made = submit(api, msg).job
    read = api.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=made.job_id), timeout=10)
    for job in (made, read):
        days = [str(datetime.fromtimestamp(ms / 1000, UTC).date()) for ms in job.next_fires_ms]
        assert len(days) == 5 and not skipped & set(days), days
