"""Runs and completions as packed columns on the worker stream: sent to a
worker whose Hello asks for them, read from one whose node's Welcome offers
them, each way checked as strictly as a message per run."""

from __future__ import annotations

from tests.rpc.test_api import Api, wait_for
from tests.rpc.test_protocol_abuse import (
    RawWorker,
    accepted_for,
    api,
    error_for,
    one_shot,
    states,
)
from wheel.rpc.v1 import worker_service_pb2 as pb

__all__ = ["api"]  # the fixture, used by name


def _columns(*rows: tuple[int, int, int, int, int]) -> pb.WorkerMessage:
    """A Complete carrying ``(run_id, fence, job_id, outcome, ran_ms)`` rows as columns."""
    msg = pb.WorkerMessage()
    cols = msg.complete.columns
    for run_id, fence, job_id, outcome, ran_ms in rows:
        cols.run_id.append(run_id)
        cols.fence.append(fence)
        cols.job_id.append(job_id)
        cols.outcome.append(outcome)
        cols.ran_ms.append(ran_ms)
    return msg


def test_a_worker_asking_for_columns_gets_its_runs_and_completes_them_as_columns(
    api: Api,
) -> None:
    worker = RawWorker(api.server.target, "w", capacity=4, columns=True)
    try:
        assert worker.welcome.columns
        job = one_shot(api)
        msg = worker.expect("assignments").assignments
        assert not msg.assignments  # no message per run
        cols = msg.columns
        assert list(cols.job_id) == [job]
        run_id, fence = cols.run_id[0], cols.fence[0]
        assert cols.attempt[0] == 1 and cols.handler[0] == "h"
        assert cols.idempotency_key[0] == f"{job}:{cols.scheduled_for_ms[0]}"
        worker.send(_columns((run_id, fence, job, pb.OUTCOME_SUCCEEDED, 3)))
        worker.expect("results", where=accepted_for(run_id))
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the column's success")
    finally:
        worker.close()


def test_a_worker_not_asking_for_columns_gets_a_message_per_run(api: Api) -> None:
    worker = RawWorker(api.server.target, "w")
    try:
        job = one_shot(api)
        msg = worker.expect("assignments").assignments
        assert [a.job_id for a in msg.assignments] == [job]
        assert not msg.HasField("columns")
    finally:
        worker.close()


def test_completion_columns_of_different_lengths_or_an_unknown_outcome_are_refused(
    api: Api,
) -> None:
    worker = RawWorker(api.server.target, "w", capacity=4, columns=True)
    try:
        job = one_shot(api)
        cols = worker.expect("assignments").assignments.columns
        run_id, fence = cols.run_id[0], cols.fence[0]
        ragged = _columns((run_id, fence, job, pb.OUTCOME_SUCCEEDED, 0))
        ragged.complete.columns.fence.append(7)
        worker.send(ragged)
        err = worker.expect("error").error
        assert err.code == "INVALID_ARGUMENT" and "different lengths" in err.message
        worker.send(_columns((run_id, fence, job, 99, 0)))
        err = worker.expect("error", where=error_for(run_id)).error
        assert err.code == "INVALID_ARGUMENT" and "outcome" in err.message
        # Neither touched the run: its real completion is still taken.
        worker.send(_columns((run_id, fence, job, pb.OUTCOME_SUCCEEDED, 0)))
        worker.expect("results", where=accepted_for(run_id))
        wait_for(lambda: states(api, job) == [(1, "succeeded")], 10, "the run's success")
    finally:
        worker.close()
