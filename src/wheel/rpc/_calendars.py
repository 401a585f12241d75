"""AdminService's calendar calls. A tenant's credential manages its own
tenant's calendars (scope ``jobs:write``; reading ``jobs:read``: the
interceptor checks the scope), an operator's any tenant's; without
``--auth`` the request's tenant stands ("default" when empty). Another
tenant's calendar answers NOT_FOUND, as one that does not exist."""

from __future__ import annotations

import grpc

from wheel.engine.calendars import Calendar, parse_calendar
from wheel.engine.spec import DEFAULT_LIMITS, no_nul
from wheel.errors import InvalidArgument, LimitExceeded, NotFound
from wheel.node import Node
from wheel.rpc._common import _call
from wheel.rpc._guard import Guard
from wheel.rpc._secrets import tenant_of
from wheel.rpc.v1 import admin_service_pb2 as pb
from wheel.store.base import CalendarRecord

__all__ = ["CalendarsAdmin", "calendar_to_proto"]


def calendar_to_proto(r: CalendarRecord) -> pb.Calendar:
    c = Calendar.from_json(r.body)
    return pb.Calendar(
        tenant=r.tenant,
        name=r.name,
        dates=c.dates,
        ranges=[pb.DateRange(from_date=a, to_date=b) for a, b in c.ranges],
        weekdays=c.weekdays,
        version=r.version,
        updated_ms=r.updated_at_ms,
    )


def _name(field: str, name: str) -> str:
    if not name:
        raise InvalidArgument(field, "must not be empty")
    limit = DEFAULT_LIMITS.max_calendar_name_len
    if len(name) > limit:
        raise LimitExceeded(field, f"{len(name)} characters is over the limit of {limit}")
    no_nul(field, name)
    return name


class CalendarsAdmin:
    """The calendars' calls, which ``AdminServicer`` hands on."""

    def __init__(self, node: Node, guard: Guard) -> None:
        self.node = node
        self.guard = guard

    async def SetCalendar(
        self, request: pb.SetCalendarRequest, context: grpc.aio.ServicerContext
    ) -> pb.Calendar:
        async def work() -> pb.Calendar:
            c = request.calendar
            tenant = tenant_of(await self.guard.principal(context), c.tenant, "calendar.tenant")
            name = _name("calendar.name", c.name)
            calendar = parse_calendar(
                list(c.dates),
                [(r.from_date, r.to_date) for r in c.ranges],
                list(c.weekdays),
            )
            return calendar_to_proto(await self.node.set_calendar(tenant, name, calendar))

        return await _call(context, work())

    async def GetCalendar(
        self, request: pb.GetCalendarRequest, context: grpc.aio.ServicerContext
    ) -> pb.Calendar:
        async def work() -> pb.Calendar:
            tenant = tenant_of(await self.guard.principal(context), request.tenant, "tenant")
            name = _name("name", request.name)
            record = await self.node.get_calendar(tenant, name)
            if record is None:
                raise NotFound(f"tenant {tenant!r} has no calendar {name!r}")
            return calendar_to_proto(record)

        return await _call(context, work())

    async def ListCalendars(
        self, request: pb.ListCalendarsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCalendarsResponse:
        async def work() -> pb.ListCalendarsResponse:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            records = await self.node.list_calendars(tenant)
            return pb.ListCalendarsResponse(calendars=[calendar_to_proto(r) for r in records])

        return await _call(context, work())

    async def DeleteCalendar(
        self, request: pb.DeleteCalendarRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteCalendarResponse:
        async def work() -> pb.DeleteCalendarResponse:
            tenant = tenant_of(await self.guard.principal(context), request.tenant, "tenant")
            name = _name("name", request.name)
            return pb.DeleteCalendarResponse(deleted=await self.node.delete_calendar(tenant, name))

        return await _call(context, work())
