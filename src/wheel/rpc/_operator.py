"""JobService's operator calls: a job's spec updated in place (and its
history of updates), schedule previews, and dead letters listed and run
again. Part of ``JobServicer``; calls that change a job go to the owner of
its shard (forwarded once), as pauses and triggers do."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, cast

import grpc

from wheel import http_targets
from wheel.engine.fires import preview
from wheel.engine.records import JobChange
from wheel.engine.spec import JobSpec
from wheel.errors import InvalidArgument
from wheel.rpc import convert
from wheel.rpc._common import _call, _idempotency_key, _job_id, _page_size
from wheel.rpc._guard import Guard
from wheel.rpc._limits import check_key, keys_known
from wheel.rpc.v1 import job_service_pb2, jobs_pb2

if TYPE_CHECKING:
    from wheel.node import Node

# The JobSpec fields an update may change: all but the tenant.
UPDATABLE = (
    "name",
    "handler",
    "payload",
    "http",
    "schedule",
    "jitter_ms",
    "catch_up",
    "overlap",
    "retry",
    "timeout_ms",
    "side_effect",
    "pool",
    "priority",
    "skip_calendars",
    "active_from_ms",
    "active_until_ms",
    "max_fires",
    "concurrency_key",
)
MAX_PREVIEW = 1000
# Preview from at most this far ahead of now (a year of 2100 is a typo).
MAX_PREVIEW_FROM_MS = 100 * 366 * 86_400_000


class OperatorCalls:
    """UpdateJob, ListJobUpdates, PreviewSchedule, ListDeadLetters and
    RedriveDeadLetters of ``JobServicer``."""

    node: Node
    guard: Guard

    if TYPE_CHECKING:

        async def _visible(self, job_id: int, context: grpc.aio.ServicerContext) -> None: ...

        async def _elsewhere(
            self, job_id: int, method: str, request: Any, context: grpc.aio.ServicerContext
        ) -> Any: ...

    async def UpdateJob(
        self, request: job_service_pb2.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.UpdateJobResponse:
        async def work() -> job_service_pb2.UpdateJobResponse:
            job_id = _job_id(request.job_id)
            _idempotency_key(request.idempotency_key)
            fields = list(request.fields) or list(UPDATABLE)
            for name in fields:
                if name not in UPDATABLE:
                    raise InvalidArgument(
                        "fields", f"{name!r} is not one of {', '.join(UPDATABLE)}"
                    )
            principal = await self.guard.principal(context)
            record = self.guard.check_job(principal, await self.node.get_job(job_id))
            # Validated here as well as on the owner: a bad spec is refused
            # by the node it was sent to, before any forward.
            if "http" in fields and request.spec.http.signing_secret:
                await self.node.learn_secrets(
                    [(record.spec.tenant, request.spec.http.signing_secret)]
                )
            if "skip_calendars" in fields:
                await self.node.learn_calendars(
                    [(record.spec.tenant, n) for n in request.spec.skip_calendars]
                )
            spec = _merged(
                record.spec,
                request.spec,
                fields,
                self.node.now_ms(),
                secret_known=self.node.knows_secret,
                calendar_known=self.node.knows_calendar,
            )
            if "concurrency_key" in fields and spec.concurrency_key:
                # A key named must have a limit, as on a submit; one the job
                # keeps may have lost its limit since (it runs unlimited).
                check_key(spec, await keys_known(self.node, [convert.spec_to_proto(spec)]))
            # Into a pool its tenant may use, as a submit.
            probe = jobs_pb2.JobSpec(tenant=spec.tenant, pool=spec.pool)
            self.guard.own_submit(principal, job_service_pb2.SubmitJobRequest(spec=probe))
            answer = await self._elsewhere(job_id, "UpdateJob", request, context)
            if answer is not None:
                return cast(job_service_pb2.UpdateJobResponse, answer)
            digest = hashlib.sha256(
                request.spec.SerializeToString(deterministic=True)
                + "\0".join(sorted(fields)).encode()
            ).hexdigest()
            by = "" if principal is None else f"{principal.tenant}/{principal.token_id}"
            result = await self.node.update_job(
                job_id,
                spec,
                idempotency_key=request.idempotency_key or None,
                body_hash=digest,
                updated_by=by,
                if_version=request.if_version if request.HasField("if_version") else None,
            )
            job = result.job
            return job_service_pb2.UpdateJobResponse(
                job=convert.job_to_proto(job, next_fires_ms=self.node.next_fires(job_id, 5, job)),
                update=change_to_proto(result.change),
                updated=result.applied,
            )

        return await _call(context, work())

    async def ListJobUpdates(
        self, request: job_service_pb2.ListJobUpdatesRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.ListJobUpdatesResponse:
        async def work() -> job_service_pb2.ListJobUpdatesResponse:
            job_id = _job_id(request.job_id)
            size = _page_size(request.page_size)
            before = _token(request.page_token)
            await self._visible_or_missing(job_id, context)
            changes = await self.node.list_job_updates(job_id, before_version=before, limit=size)
            token = str(changes[-1].version) if len(changes) == size else ""
            return job_service_pb2.ListJobUpdatesResponse(
                updates=[change_to_proto(c) for c in changes], next_page_token=token
            )

        return await _call(context, work())

    async def PreviewSchedule(
        self, request: job_service_pb2.PreviewScheduleRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.PreviewScheduleResponse:
        async def work() -> job_service_pb2.PreviewScheduleResponse:
            if not 0 <= request.count <= MAX_PREVIEW:
                raise InvalidArgument("count", f"must be within [0, {MAX_PREVIEW}]")
            now = self.node.now_ms()
            if request.from_ms < 0:
                raise InvalidArgument("from_ms", f"{request.from_ms} is before the epoch")
            if request.from_ms - now > MAX_PREVIEW_FROM_MS:
                raise InvalidArgument("from_ms", "is more than a hundred years ahead")
            after = (request.from_ms or now) - 1  # fires at or after from_ms
            source = request.WhichOneof("source")
            if source == "job_id":
                job_id = _job_id(request.job_id)
                record = self.guard.check_job(
                    await self.guard.principal(context), await self.node.get_job(job_id)
                )
                spec = record.spec
            elif source in ("schedule", "spec"):
                msg = jobs_pb2.JobSpec(name="preview", handler="preview")
                if source == "schedule":
                    msg.schedule.CopyFrom(request.schedule)
                else:  # a schedule with its bounds
                    msg.MergeFrom(request.spec)
                    msg.ClearField("http")
                    msg.handler = msg.handler if msg.handler not in ("", "http") else "preview"
                for name in request.skip_calendars:
                    if name not in msg.skip_calendars:
                        msg.skip_calendars.append(name)
                principal = await self.guard.principal(context)
                if principal is not None and not principal.operator:
                    msg.tenant = principal.tenant
                await self.node.learn_calendars(
                    [(msg.tenant or "default", n) for n in msg.skip_calendars]
                )
                spec = convert.spec_from_proto(
                    msg, now_ms=now, sent=True, calendar_known=self.node.knows_calendar
                )
            else:
                raise InvalidArgument("source", "give a schedule, a spec or a job_id")
            days = self.node.calendar_days(spec.tenant, spec.skip_calendars)
            fires, skipped = preview(spec, after, request.count or 10, days)
            return job_service_pb2.PreviewScheduleResponse(fires_ms=fires, skipped_ms=skipped)

        return await _call(context, work())

    async def ListDeadLetters(
        self, request: job_service_pb2.ListDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> job_service_pb2.ListDeadLettersResponse:
        async def work() -> job_service_pb2.ListDeadLettersResponse:
            size = _page_size(request.page_size)
            before = _token(request.page_token)
            principal = await self.guard.principal(context)
            job_id: int | None = None
            if request.job_id:
                job_id = _job_id(request.job_id)
                self.guard.check_job(principal, await self.node.get_job(job_id))
            tenant = None
            if principal is not None and not principal.operator and job_id is None:
                tenant = principal.tenant
            runs = await self.node.list_dead_letters(
                job_id=job_id, tenant=tenant, before_run_id=before, limit=size
            )
            token = str(runs[-1].run_id) if len(runs) == size else ""
            return job_service_pb2.ListDeadLettersResponse(
                runs=[convert.run_to_proto(r) for r in runs], next_page_token=token
            )

        return await _call(context, work())

    async def RedriveDeadLetters(
        self,
        request: job_service_pb2.RedriveDeadLettersRequest,
        context: grpc.aio.ServicerContext,
    ) -> job_service_pb2.RedriveDeadLettersResponse:
        async def work() -> job_service_pb2.RedriveDeadLettersResponse:
            job_id = _job_id(request.job_id)
            if request.run_id < 0:
                raise InvalidArgument("run_id", f"{request.run_id} is not a run id")
            before = _token(request.page_token)
            if before is not None and request.run_id:
                raise InvalidArgument("page_token", "goes with a whole job's redrive, not run_id")
            await self._visible_or_missing(job_id, context)
            answer = await self._elsewhere(job_id, "RedriveDeadLetters", request, context)
            if answer is not None:
                return cast(job_service_pb2.RedriveDeadLettersResponse, answer)
            done = await self.node.redrive(job_id, request.run_id or None, before_run_id=before)
            more = done.more_before_run_id
            return job_service_pb2.RedriveDeadLettersResponse(
                runs=[convert.run_to_proto(r) for r in done.runs],
                next_page_token="" if more is None else str(more),
            )

        return await _call(context, work())

    async def _visible_or_missing(self, job_id: int, context: grpc.aio.ServicerContext) -> None:
        """NOT_FOUND for a job that does not exist or that the caller may not see."""
        self.guard.check_job(await self.guard.principal(context), await self.node.get_job(job_id))


def _merged(
    old: JobSpec,
    new: jobs_pb2.JobSpec,
    fields: list[str],
    now_ms: int,
    *,
    secret_known: http_targets.SecretKnown | None = None,
    calendar_known: convert.CalendarKnown | None = None,
) -> JobSpec:
    """``old`` with the fields named taken from ``new``, validated (a bad
    field is named as in a submit: ``spec.schedule.cron.expr``...)."""
    merged = convert.spec_to_proto(old)
    for name in fields:
        if name == "skip_calendars":
            del merged.skip_calendars[:]
            merged.skip_calendars.extend(new.skip_calendars)
        elif name in ("schedule", "catch_up", "overlap", "retry", "http"):
            if new.HasField(name):
                getattr(merged, name).CopyFrom(getattr(new, name))
            else:
                merged.ClearField(name)
        elif name == "priority":
            # Unset (not 0) when not sent: the default, 5.
            if new.HasField("priority"):
                merged.priority = new.priority
            else:
                merged.ClearField("priority")
        else:
            setattr(merged, name, getattr(new, name))
    merged.tenant = old.tenant
    # Between an HTTP target and a Python handler (UpdateJobRequest's rules):
    # a handler named moves the job off its target, a target named moves it
    # onto one. The payload (the body) stays unless it is named too.
    if "handler" in fields and merged.handler not in ("", http_targets.HANDLER):
        if "http" not in fields:
            merged.ClearField("http")
    elif "http" in fields and merged.HasField("http"):
        merged.handler = http_targets.HANDLER
    # A schedule kept is taken as stored; one sent is checked as a submit's.
    # The target is checked either way (the job's timeout bounds it), its
    # signing secret only when the target is sent.
    return convert.spec_from_proto(
        merged,
        now_ms=now_ms,
        sent="schedule" in fields,
        target_sent=True,
        secret_sent="http" in fields,
        secret_known=secret_known,
        calendar_known=calendar_known if "skip_calendars" in fields else None,
    )


def change_to_proto(change: JobChange) -> job_service_pb2.JobUpdate:
    return job_service_pb2.JobUpdate(
        job_id=change.job_id,
        version=change.version,
        updated_at_ms=change.updated_at_ms,
        old_spec=convert.spec_to_proto(http_targets.history_spec(change.old_spec)),
        new_spec=convert.spec_to_proto(http_targets.history_spec(change.new_spec)),
        payload_changed=change.payload_changed,
        updated_by=change.updated_by,
        idempotency_key=change.idempotency_key or "",
    )


def _token(token: str) -> int | None:
    """A page token of these calls: the last item's key, or none."""
    if not token:
        return None
    try:
        value = int(token)
    except ValueError:
        raise InvalidArgument("page_token", "is not a token this server issued") from None
    if value <= 0:
        raise InvalidArgument("page_token", "is not a token this server issued")
    return value
