"""Runs and completions as the stream carries them: a message each, or
packed columns (``RunColumns``, ``CompletionColumns``) when both ends
read them (``Hello.columns``, ``Welcome.columns``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker._http import HANDLER as HTTP_HANDLER
from wheel.worker._runs import Done

# A run handed out: run id, job id, handler, tenant, payload, idempotency
# key, fence, attempt, scheduled_for_ms, timeout_ms, traceparent, and its
# Assignment message where an HTTP target's run needs one (signed headers).
Handed = tuple[int, int, str, str, bytes, str, int, int, int, int, str, "pb.Assignment | None"]


def handed_out(msg: pb.Assignments) -> Iterator[Handed]:
    """The runs of one Assignments message: its messages, then its columns."""
    for a in msg.assignments:
        yield (
            a.run_id,
            a.job_id,
            a.handler,
            a.tenant,
            a.payload,
            a.idempotency_key,
            a.fence,
            a.attempt,
            a.scheduled_for_ms,
            a.timeout_ms,
            a.traceparent,
            a if a.handler == HTTP_HANDLER else None,
        )
    if not msg.HasField("columns"):
        return
    c = msg.columns
    # A node that traces sends each run's traceparent; one that does not, none.
    traceparents = c.traceparent or itertools.repeat("", len(c.run_id))
    rows = zip(
        c.run_id,
        c.job_id,
        c.handler,
        c.tenant,
        c.payload,
        c.idempotency_key,
        c.fence,
        c.attempt,
        c.scheduled_for_ms,
        c.timeout_ms,
        traceparents,
        strict=True,
    )
    for run_id, job_id, handler, tenant, payload, key, fence, attempt, at, timeout, tp in rows:
        # A node sends an HTTP target's runs as messages; one that did not
        # gets them rebuilt here, for the HTTP executor that reads them so.
        a = None
        if handler == HTTP_HANDLER:
            a = pb.Assignment(
                run_id=run_id,
                job_id=job_id,
                handler=handler,
                tenant=tenant,
                payload=payload,
                idempotency_key=key,
                fence=fence,
                attempt=attempt,
                scheduled_for_ms=at,
                timeout_ms=timeout,
                traceparent=tp,
            )
        yield run_id, job_id, handler, tenant, payload, key, fence, attempt, at, timeout, tp, a


def run_count(msg: pb.Assignments) -> int:
    return len(msg.assignments) + len(msg.columns.run_id)


def complete_message(done: Sequence[Done], columns: bool) -> pb.WorkerMessage:
    """One Complete: with ``columns``, the completions that carry nothing
    but their outcome (and ran_ms) as columns, the others as messages."""
    msg = pb.WorkerMessage()
    add = msg.complete.completions.add
    run_ids: list[int] = []
    fences: list[int] = []
    job_ids: list[int] = []
    outcomes: list[int] = []
    ran: list[int] = []
    for run_id, fence, outcome, error, job_id, ran_ms, result, retry_after in done:
        if columns and not error and not result and not retry_after:
            run_ids.append(run_id)
            fences.append(fence)
            job_ids.append(job_id)
            outcomes.append(outcome)
            ran.append(ran_ms)
            continue
        add(
            run_id=run_id,
            fence=fence,
            outcome=outcome,
            error=error,
            job_id=job_id,
            ran_ms=ran_ms,
            result_json=result,
            retry_after_ms=retry_after,
        )
    if run_ids:
        cols = msg.complete.columns
        cols.run_id.extend(run_ids)
        cols.fence.extend(fences)
        cols.job_id.extend(job_ids)
        cols.outcome.extend(outcomes)
        cols.ran_ms.extend(ran)
    return msg
