"""Calendars through ``Client`` against a real node: set, read, list and
delete them, and jobs that skip them, submitted and updated."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from wheel.client import Calendar, Client
from wheel.errors import InvalidArgument, NotFound


def test_a_calendar_round_trips_and_a_job_skips_it(client: Client) -> None:
    made = client.set_calendar(
        "holidays",
        tenant="cal-a",
        dates=[date(2030, 12, 25), "2030-12-24"],
        ranges=[("2030-12-30", date(2031, 1, 2))],
        weekdays=["sat"],
    )
    assert made == Calendar(
        tenant="cal-a",
        name="holidays",
        dates=("2030-12-24", "2030-12-25"),
        ranges=(("2030-12-30", "2031-01-02"),),
        weekdays=("sat",),
        version=1,
        updated_at=made.updated_at,
    )
    assert client.calendar("holidays", tenant="cal-a") == made
    assert [c.name for c in client.calendars(tenant="cal-a")] == ["holidays"]
    job = client.submit(
        name="skips",
        handler="h",
        every=timedelta(hours=1),
        tenant="cal-a",
        skip_calendars=["holidays"],
    )
    assert job.skip_calendars == ("holidays",)
    assert client.get(job.job_id).skip_calendars == ("holidays",)
    client.set_calendar("weekend", tenant="cal-a", weekdays=["sat", "sun"])
    changed = client.update(job.job_id, skip_calendars=["holidays", "weekend"])
    assert changed.skip_calendars == ("holidays", "weekend")
    assert client.delete_calendar("holidays", tenant="cal-a") is True
    assert client.delete_calendar("holidays", tenant="cal-a") is False
    with pytest.raises(NotFound):
        client.calendar("holidays", tenant="cal-a")


def test_a_job_naming_no_calendar_of_its_tenant_is_refused(client: Client) -> None:
    client.set_calendar("theirs", tenant="cal-b", weekdays=["sun"])
    with pytest.raises(InvalidArgument) as info:
        client.submit(
            name="j",
            handler="h",
            every=timedelta(hours=1),
            tenant="cal-c",
            skip_calendars=["theirs"],
        )
    assert info.value.field == "spec.skip_calendars[0]"
    with pytest.raises(InvalidArgument) as info:
        client.set_calendar("bad", tenant="cal-b", dates=["2030-02-30"])
    assert info.value.field == "calendar.dates[0]"
