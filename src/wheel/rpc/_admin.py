"""AdminService: what operators look at."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import grpc

from wheel.errors import InvalidArgument
from wheel.node import Node
from wheel.rpc._calendars import CalendarsAdmin
from wheel.rpc._common import _call, _page_size
from wheel.rpc._guard import Guard
from wheel.rpc._limits import LimitsAdmin
from wheel.rpc._operator import _token
from wheel.rpc._peers import Peers, forwarded_by
from wheel.rpc._secrets import SecretsAdmin
from wheel.rpc._tenancy import TenancyAdmin
from wheel.rpc._workers import membership_to_proto
from wheel.rpc.convert import wire_attempt
from wheel.rpc.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    cluster_pb2,
)
from wheel.store.base import AuditEntry

log = logging.getLogger("wheel.rpc")

# ListInFlight answers at most this many runs a call.
MAX_IN_FLIGHT_LISTED = 1000


class AdminServicer(TenancyAdmin, admin_service_pb2_grpc.AdminServiceServicer):
    def __init__(self, node: Node, guard: Guard | None = None, peers: Peers | None = None) -> None:
        """``peers``: how to reach the other members, for the calls that
        answer for the whole cluster (``ListInFlight``)."""
        self.node = node
        self.guard = guard or Guard(None)
        self.peers = peers
        self.secrets = SecretsAdmin(node, self.guard)
        self.calendars = CalendarsAdmin(node, self.guard)
        self.limits = LimitsAdmin(node, self.guard, peers)

    # -- concurrency keys and rate limits (wheel.rpc._limits) ---------------------------

    async def SetLimit(
        self, request: admin_service_pb2.SetLimitRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.LimitInfo:
        return await self.limits.SetLimit(request, context)

    async def ListLimits(
        self, request: admin_service_pb2.ListLimitsRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.ListLimitsResponse:
        return await self.limits.ListLimits(request, context)

    async def DeleteLimit(
        self, request: admin_service_pb2.DeleteLimitRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.DeleteLimitResponse:
        return await self.limits.DeleteLimit(request, context)

    # -- signing secrets (wheel.rpc._secrets) -------------------------------------------

    async def SetSecret(
        self, request: admin_service_pb2.SetSecretRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.SetSecretResponse:
        return await self.secrets.SetSecret(request, context)

    async def RotateSecret(
        self, request: admin_service_pb2.RotateSecretRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.SetSecretResponse:
        return await self.secrets.RotateSecret(request, context)

    async def ListSecrets(
        self, request: admin_service_pb2.ListSecretsRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.ListSecretsResponse:
        return await self.secrets.ListSecrets(request, context)

    async def DeleteSecret(
        self, request: admin_service_pb2.DeleteSecretRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.DeleteSecretResponse:
        return await self.secrets.DeleteSecret(request, context)

    # -- the audit trail (wheel.rpc._audit writes it) ----------------------------------

    async def ListAudit(
        self, request: admin_service_pb2.ListAuditRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.ListAuditResponse:
        async def work() -> admin_service_pb2.ListAuditResponse:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            if request.since_ms < 0:
                raise InvalidArgument("since_ms", f"{request.since_ms} is negative")
            if request.job_id < 0:
                raise InvalidArgument("job_id", f"{request.job_id} is negative")
            size = _page_size(request.page_size)
            entries = await self.node.list_audit(
                since_ms=request.since_ms or None,
                job_id=request.job_id or None,
                tenant=tenant,
                before_id=_token(request.page_token),
                limit=size,
            )
            more = len(entries) == size
            return admin_service_pb2.ListAuditResponse(
                entries=[audit_to_proto(e) for e in entries],
                next_page_token=str(entries[-1].entry_id) if more else "",
            )

        return await _call(context, work())

    # -- calendars (wheel.rpc._calendars) -------------------------------------------------

    async def SetCalendar(
        self, request: admin_service_pb2.SetCalendarRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.Calendar:
        return await self.calendars.SetCalendar(request, context)

    async def GetCalendar(
        self, request: admin_service_pb2.GetCalendarRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.Calendar:
        return await self.calendars.GetCalendar(request, context)

    async def ListCalendars(
        self, request: admin_service_pb2.ListCalendarsRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.ListCalendarsResponse:
        return await self.calendars.ListCalendars(request, context)

    async def DeleteCalendar(
        self, request: admin_service_pb2.DeleteCalendarRequest, context: grpc.aio.ServicerContext
    ) -> admin_service_pb2.DeleteCalendarResponse:
        return await self.calendars.DeleteCalendar(request, context)

    async def GetClusterStatus(
        self,
        request: admin_service_pb2.GetClusterStatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_service_pb2.ClusterStatus:
        st = self.node.status()
        s = st.stats
        status = admin_service_pb2.ClusterStatus(
            node_id=st.node_id,
            dispatch_lag_p50_ms=st.lag_p50_ms,
            dispatch_lag_p99_ms=st.lag_p99_ms,
            jobs=st.jobs,
            pending_timers=st.pending_timers,
            in_flight=st.in_flight,
            backlog=st.backlog,
            overdue_backlog=st.overdue_backlog,
            workers=len(st.workers),
            worker_capacity=st.worker_capacity,
            dispatched_total=s.dispatched,
            completed_total=s.completed,
            missed_total=s.missed,
            dead_lettered_total=s.dead_lettered,
            reaper_paused=st.reaper_paused,
            alerts_firing=st.alerts_firing,
        )
        owners = self.node.shard_owners()
        held = Counter(owners.values())
        for member in self.node.members():
            status.nodes.add(
                node_id=member.node_id,
                address=member.address,
                shards_owned=held.get(member.node_id, 0),
            )
        for w in st.workers:
            status.worker_list.add(
                worker_id=w.worker_id,
                capacity=w.capacity,
                held=w.held,
                pools=w.pools,
                handlers=w.handlers,
                draining=w.draining,
                silent=w.silent,
            )
        for u in st.unserved:
            status.unserved.add(pool=u.pool, handler=u.handler, waiting=u.waiting)
        if request.include_shards:
            # A row per shard with an owner in this node's view, and per shard
            # this node holds (its epoch; 0: not held here) even when the view
            # has moved on: a holder that has not heard of its loss yet.
            for shard in sorted(owners.keys() | st.shards.keys()):
                status.shards.add(
                    shard=shard,
                    owner=owners.get(shard, ""),
                    epoch=st.shards.get(shard, 0),
                    dispatching_since_ms=st.dispatching_since.get(shard, 0),
                )
            for shard, epoch, at_ms in st.released:
                status.released.add(shard=shard, epoch=epoch, at_ms=at_ms)
        return status

    async def GetLagHistory(
        self,
        request: admin_service_pb2.GetLagHistoryRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_service_pb2.LagHistory:
        out = admin_service_pb2.LagHistory(node_id=self.node.config.node_id)
        for m in self.node.lag_history():
            out.minutes.add(
                minute_ms=m.minute_ms,
                count=m.count,
                p50_ms=m.p50_ms,
                p99_ms=m.p99_ms,
                max_ms=m.max_ms,
            )
        return out

    async def ListInFlight(
        self,
        request: admin_service_pb2.ListInFlightRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_service_pb2.ListInFlightResponse:
        limit = request.limit
        if limit < 0 or limit > MAX_IN_FLIGHT_LISTED:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"limit: {limit} is not between 0 and {MAX_IN_FLIGHT_LISTED}",
            )
        limit = limit or 100
        runs, total = self.node.in_flight(limit)
        me = self.node.config.node_id
        out = admin_service_pb2.ListInFlightResponse(total=total)
        for r in runs:
            out.runs.add(
                run_id=r.run_id,
                job_id=r.job_id,
                scheduled_for_ms=r.scheduled_for,
                attempt=wire_attempt(r.attempt),
                fence=r.fence,
                worker_id=r.worker_id,
                phase=r.phase,
                node_id=me,
            )
        others = [m for m in self.node.members() if m.node_id != me and m.address]
        if self.peers is None or not others or forwarded_by(context) is not None:
            return out
        # The other members' runs, asked side by side; one that does not
        # answer is named, and the list is the others'.
        request = admin_service_pb2.ListInFlightRequest(limit=limit)
        answers = await asyncio.gather(
            *(self.peers.ask_admin(m.address, "ListInFlight", request, context) for m in others),
            return_exceptions=True,
        )
        merged = list(out.runs)
        for member, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, grpc.aio.AioRpcError):
                    log.warning("in-flight runs of %s: %r", member.node_id, answer)
                out.unreachable.append(member.node_id)
                continue
            out.total += answer.total
            merged.extend(answer.runs)
        merged.sort(key=lambda r: r.run_id)
        del out.runs[:]
        out.runs.extend(merged[:limit])
        return out

    async def GetMembership(
        self,
        request: admin_service_pb2.GetMembershipRequest,
        context: grpc.aio.ServicerContext,
    ) -> cluster_pb2.Membership:
        return membership_to_proto(self.node.membership())

    async def ListAlerts(
        self,
        request: admin_service_pb2.ListAlertsRequest,
        context: grpc.aio.ServicerContext,
    ) -> admin_service_pb2.ListAlertsResponse:
        out = admin_service_pb2.ListAlertsResponse(
            firing=sorted(k.value for k, n in self.node.alerts_firing().items() if n)
        )
        for raised in self.node.list_alerts(request.since_ms, max(0, request.limit)):
            alert = raised.alert
            out.alerts.add(
                at_ms=raised.at_ms,
                kind=alert.kind.value,
                message=alert.message,
                node_id=raised.node_id,
                job_id=alert.job_id or 0,
                run_id=alert.run_id or 0,
                fence=alert.fence or 0,
                worker_id=alert.worker or "",
            )
        return out


def audit_to_proto(e: AuditEntry) -> admin_service_pb2.AuditEntry:
    return admin_service_pb2.AuditEntry(
        entry_id=e.entry_id,
        at_ms=e.at_ms,
        actor=e.actor,
        tenant=e.tenant,
        address=e.address,
        action=e.action,
        target=e.target,
        job_id=e.job_id or 0,
        details_json=e.details,
    )
