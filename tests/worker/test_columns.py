"""The worker's side of the stream's columns (``wheel.worker._columns``):
runs read the same from messages and columns, completions written as
columns only when the node reads them and nothing but the outcome rides."""

from __future__ import annotations

from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.worker._columns import complete_message, handed_out, run_count


def test_runs_read_alike_from_messages_then_columns_and_an_http_run_keeps_a_message() -> None:
    msg = pb.Assignments()
    msg.assignments.add(
        run_id=1, job_id=10, handler="h", tenant="t", payload=b"p", fence=5, attempt=1,
        idempotency_key="10:100", scheduled_for_ms=100, timeout_ms=7, traceparent="tp",
    )  # fmt: skip
    cols = msg.columns
    for run_id, handler in ((2, "h"), (3, "http")):
        cols.run_id.append(run_id)
        cols.job_id.append(run_id * 10)
        cols.handler.append(handler)
        cols.tenant.append("t")
        cols.payload.append(b"q")
        cols.idempotency_key.append(f"{run_id * 10}:200")
        cols.fence.append(6)
        cols.attempt.append(2)
        cols.scheduled_for_ms.append(200)
        cols.timeout_ms.append(0)
        cols.lease_ms.append(500)
    assert run_count(msg) == 3
    first, second, third = handed_out(msg)
    assert first[:11] == (1, 10, "h", "t", b"p", "10:100", 5, 1, 100, 7, "tp")
    assert first[11] is None
    assert second == (2, 20, "h", "t", b"q", "20:200", 6, 2, 200, 0, "", None)
    http = third[11]
    assert http is not None and (http.run_id, http.handler, http.fence) == (3, "http", 6)


def test_runs_in_columns_carry_their_traceparents_when_the_node_sends_them() -> None:
    msg = pb.Assignments()
    cols = msg.columns
    for run_id, handler in ((2, "h"), (3, "http")):
        cols.run_id.append(run_id)
        cols.job_id.append(run_id * 10)
        cols.handler.append(handler)
        cols.tenant.append("t")
        cols.payload.append(b"q")
        cols.idempotency_key.append(f"{run_id * 10}:200")
        cols.fence.append(6)
        cols.attempt.append(1)
        cols.scheduled_for_ms.append(200)
        cols.timeout_ms.append(0)
        cols.lease_ms.append(500)
        cols.traceparent.append(f"tp-{run_id}")
    first, second = handed_out(msg)
    assert first == (2, 20, "h", "t", b"q", "20:200", 6, 1, 200, 0, "tp-2", None)
    assert second[10] == "tp-3"
    http = second[11]
    assert http is not None and http.traceparent == "tp-3"  # the HTTP executor reads it there


def test_completions_go_as_columns_only_to_a_node_that_reads_them() -> None:
    plain = (1, 5, pb.OUTCOME_SUCCEEDED, "", 10, 3, "", 0)
    failed = (2, 6, pb.OUTCOME_RETRYABLE, "boom", 20, 4, "", 0)
    with_result = (3, 7, pb.OUTCOME_SUCCEEDED, "", 30, 5, '{"a": 1}', 0)
    waits = (4, 8, pb.OUTCOME_RETRYABLE, "", 40, 6, "", 9_000)
    done = [plain, failed, with_result, waits]
    msg = complete_message(done, columns=True).complete
    assert list(msg.columns.run_id) == [1]
    assert (msg.columns.fence[0], msg.columns.job_id[0], msg.columns.ran_ms[0]) == (5, 10, 3)
    assert list(msg.columns.outcome) == [pb.OUTCOME_SUCCEEDED]
    assert [c.run_id for c in msg.completions] == [2, 3, 4]
    assert msg.completions[0].error == "boom"
    assert msg.completions[1].result_json == '{"a": 1}'
    assert msg.completions[2].retry_after_ms == 9_000
    old = complete_message(done, columns=False).complete
    assert not old.HasField("columns")
    assert [c.run_id for c in old.completions] == [1, 2, 3, 4]
