"""AdminService's calls for concurrency keys and rate limits. As with the
signing secrets, a tenant's credential manages its own tenant's limits
(scope ``jobs:write``; listing ``jobs:read``), an operator's any tenant's;
without ``--auth`` the request's tenant stands ("default" when empty)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import grpc

from wheel.engine.spec import JobSpec
from wheel.errors import InvalidArgument
from wheel.node import Node
from wheel.node._limits import LimitView
from wheel.rpc._common import _call
from wheel.rpc._guard import Guard
from wheel.rpc._peers import Peers, forwarded_by
from wheel.rpc._secrets import request_tenant
from wheel.rpc.v1 import admin_service_pb2 as pb
from wheel.rpc.v1 import jobs_pb2
from wheel.store.base import LimitRecord

__all__ = ["LimitsAdmin", "check_key", "keys_known", "limit_info"]

log = logging.getLogger("wheel.rpc")


async def keys_known(node: Node, specs: Iterable[jobs_pb2.JobSpec]) -> set[tuple[str, str]]:
    """Of the (tenant, concurrency key) pairs the specs name, those with a
    limit defined; no store read when none names a key."""
    wanted = {(s.tenant or "default", s.concurrency_key) for s in specs if s.concurrency_key}
    return await node.known_limits(wanted) if wanted else set()


def check_key(spec: JobSpec, known: set[tuple[str, str]]) -> None:
    """A job may name only a key that has a limit (a typo would otherwise
    run unlimited without a word)."""
    key = spec.concurrency_key
    if key and (spec.tenant, key) not in known:
        raise InvalidArgument(
            "spec.concurrency_key",
            f"tenant {spec.tenant!r} has no limit {key!r}"
            f" (make one: wheelctl limit set {key} --max-concurrent N)",
        )


def limit_info(view: LimitView) -> pb.LimitInfo:
    r = view.limit
    return pb.LimitInfo(
        tenant=r.tenant,
        key=r.key,
        max_concurrent=r.max_concurrent,
        rate=r.rate,
        rate_period_ms=r.rate_period_ms if r.rate else 0,
        burst=r.burst,
        in_flight=r.in_flight,
        waiting=view.waiting,
    )


class LimitsAdmin:
    """The limits' calls, which ``AdminServicer`` hands on."""

    def __init__(self, node: Node, guard: Guard, peers: Peers | None = None) -> None:
        """``peers``: how to reach the other members, whose waiting fires
        ``ListLimits`` adds up."""
        self.node = node
        self.guard = guard
        self.peers = peers

    async def SetLimit(
        self, request: pb.SetLimitRequest, context: grpc.aio.ServicerContext
    ) -> pb.LimitInfo:
        async def work() -> pb.LimitInfo:
            tenant = request_tenant(await self.guard.principal(context), request.tenant)
            view = await self.node.set_limit(
                LimitRecord(
                    tenant=tenant,
                    key=request.key,
                    max_concurrent=request.max_concurrent,
                    rate=request.rate,
                    rate_period_ms=request.rate_period_ms or 1000,
                    burst=request.burst,
                )
            )
            return limit_info(view)

        return await _call(context, work())

    async def ListLimits(
        self, request: pb.ListLimitsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListLimitsResponse:
        async def work() -> pb.ListLimitsResponse:
            tenant = Guard.list_tenant(await self.guard.principal(context), request.tenant)
            views = await self.node.list_limits(tenant)
            out = pb.ListLimitsResponse(limits=[limit_info(v) for v in views])
            await self._add_waiting_elsewhere(request, out, context)
            return out

        return await _call(context, work())

    async def _add_waiting_elsewhere(
        self,
        request: pb.ListLimitsRequest,
        out: pb.ListLimitsResponse,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Each key's fires waiting on the other members too: a fire waits on
        the owner of its job's shard. A member that does not answer adds
        nothing (logged)."""
        me = self.node.config.node_id
        others = [m for m in self.node.members() if m.node_id != me and m.address]
        if self.peers is None or not others or forwarded_by(context) is not None:
            return
        answers = await asyncio.gather(
            *(self.peers.ask_admin(m.address, "ListLimits", request, context) for m in others),
            return_exceptions=True,
        )
        here = {(x.tenant, x.key): x for x in out.limits}
        for member, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("limits of %s: %r", member.node_id, answer)
                continue
            for x in answer.limits:
                mine = here.get((x.tenant, x.key))
                if mine is not None:
                    mine.waiting += x.waiting

    async def DeleteLimit(
        self, request: pb.DeleteLimitRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteLimitResponse:
        async def work() -> pb.DeleteLimitResponse:
            tenant = request_tenant(await self.guard.principal(context), request.tenant)
            deleted = await self.node.delete_limit(tenant, request.key)
            return pb.DeleteLimitResponse(deleted=deleted)

        return await _call(context, work())
