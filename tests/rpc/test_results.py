"""Run results and Retry-After end to end on a real node: a raw worker stream
completes runs with results and a retry_after, and ListRuns, GetRun, the
Python client and ``wheelctl runs``/``run`` show them; the retry waits at
least the retry_after; a result the node refuses (too big, not a JSON
object) becomes an error on the run and the stream goes on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest

from tests.rpc.test_api import (
    Api,
    InProcessServer,
    all_runs,
    connect,
    now_ms,
    once,
    spec,
    submit,
    wait_for,
)
from tests.rpc.test_protocol_abuse import RawWorker, accepted_for, ack
from wheel.cli import main
from wheel.client import Client, RunState
from wheel.errors import NotFound
from wheel.rpc.v1 import job_service_pb2, jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as pb
from wheel.runresult import MAX_RESULT_BYTES

HTTP_503 = {"http_status": 503, "duration_ms": 12, "response_excerpt": "<b>busy</b>"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = InProcessServer(tmp_path_factory.mktemp("results")).start()
    try:
        with connect(server) as a:
            yield a
    finally:
        server.stop()


def finish(
    run_id: int,
    fence: int,
    outcome: int,
    *,
    result: str = "",
    retry_after_ms: int = 0,
    error: str = "",
) -> pb.WorkerMessage:
    return pb.WorkerMessage(
        complete=pb.Complete(
            completions=[
                pb.Completion(
                    run_id=run_id,
                    fence=fence,
                    outcome=outcome,  # type: ignore[arg-type]
                    error=error,
                    result_json=result,
                    retry_after_ms=retry_after_ms,
                )
            ]
        )
    )


def one_shot(api: Api, name: str, pool: str, attempts: int = 3) -> int:
    msg = spec(
        name=name,
        handler="h",
        pool=pool,
        schedule=once(now_ms()),
        retry=jobs_pb2.RetryPolicy(max_attempts=attempts),
    )
    return int(submit(api, msg).job.job_id)


def next_assignment(worker: RawWorker, job_id: int, timeout: float = 10) -> pb.Assignment:
    msg = worker.expect(
        "assignments",
        timeout=timeout,
        where=lambda m: any(a.job_id == job_id for a in m.assignments.assignments),
    )
    [a] = [a for a in msg.assignments.assignments if a.job_id == job_id]
    assert isinstance(a, pb.Assignment)
    return a


def test_results_and_retry_after_reach_list_runs_get_run_the_client_and_the_cli(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = RawWorker(api.server.target, "w-results", pool="results")
    try:
        job_id = one_shot(api, "results", "results")
        first = next_assignment(worker, job_id)
        worker.send(ack((first.run_id, first.fence)))
        worker.send(
            finish(
                first.run_id,
                first.fence,
                pb.OUTCOME_RETRYABLE,
                result=json.dumps(HTTP_503),
                retry_after_ms=2_000,
                error="http 503",
            )
        )
        failed_at = time.monotonic()
        worker.expect("results", where=accepted_for(first.run_id))
        second = next_assignment(worker, job_id, timeout=15)
        waited = time.monotonic() - failed_at
        # No backoff of its own: the retry waited for the Retry-After alone.
        assert waited >= 2.0, waited
        assert second.attempt == first.attempt + 1 and second.fence > first.fence
        worker.send(
            finish(
                second.run_id,
                second.fence,
                pb.OUTCOME_SUCCEEDED,
                result=json.dumps({"value": {"rows": 3}}),
            )
        )
        worker.expect("results", where=accepted_for(second.run_id))
    finally:
        worker.close()

    def both_ended() -> list[jobs_pb2.Run]:
        runs = all_runs(api, job_id)
        return runs if [r.state for r in runs] == [jobs_pb2.RUN_STATE_SUCCEEDED,
                                                   jobs_pb2.RUN_STATE_FAILED] else []  # fmt: skip

    [ok, failed] = wait_for(both_ended, 10, "both runs to end")
    assert json.loads(failed.result_json) == HTTP_503
    assert json.loads(ok.result_json) == {"value": {"rows": 3}}
    got = api.jobs.GetRun(job_service_pb2.GetRunRequest(run_id=failed.run_id), timeout=10)
    assert got == failed
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.GetRun(job_service_pb2.GetRunRequest(run_id=987_654_321), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        api.jobs.GetRun(job_service_pb2.GetRunRequest(run_id=-1), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("run_id:")

    # The Python client: the result as a dict, None for a missed fire.
    with Client(api.server.target) as client:
        assert client.get_run(failed.run_id).result == HTTP_503
        assert [r.result for r in client.runs(job_id)] == [{"value": {"rows": 3}}, HTTP_503]
        with pytest.raises(NotFound):
            client.get_run(987_654_321)

    # wheelctl runs: the object in --json, a summary in the table.
    target = ["--target", api.server.target]
    assert main(["runs", str(job_id), "--json", *target]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["result"] for r in listed] == [{"value": {"rows": 3}}, HTTP_503]
    assert main(["runs", str(job_id), *target]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "RESULT" in table[0]
    assert "http 503 12ms" in next(x for x in table if f" {failed.run_id} " in x)
    assert '{"rows":3}' in next(x for x in table if f" {ok.run_id} " in x)
    # wheelctl run: one run whole, the result pretty-printed.
    assert main(["run", str(failed.run_id), "--json", *target]) == 0
    one = json.loads(capsys.readouterr().out)
    assert (one["run_id"], one["job_id"], one["state"]) == (failed.run_id, job_id, "failed")
    assert (one["result"], one["error"], one["attempt"]) == (HTTP_503, "http 503", 1)
    assert one["idempotency_key"] == failed.idempotency_key
    assert main(["run", str(failed.run_id), *target]) == 0
    text = capsys.readouterr().out
    assert f"run {failed.run_id} of job {job_id}" in text
    assert '  "http_status": 503,' in text and "http 503" in text
    assert main(["run", "987654321", *target]) != 0
    assert "run 987654321 does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sent", "why"),
    [
        ("[1, 2]", "a JSON list, not an object"),
        ("{not json", "not JSON"),
        ('{"x": NaN}', "not JSON"),
        (json.dumps({"value": "x" * MAX_RESULT_BYTES}), "over the limit of 65536"),
    ],
)
def test_a_result_the_node_refuses_becomes_an_error_on_the_run_and_the_stream_goes_on(
    api: Api, sent: str, why: str
) -> None:
    pool = f"refused-{abs(hash(sent)) % 10**6}"
    worker = RawWorker(api.server.target, f"w-{pool}", pool=pool)
    try:
        job_id = one_shot(api, "refused", pool)
        a = next_assignment(worker, job_id)
        worker.send(finish(a.run_id, a.fence, pb.OUTCOME_SUCCEEDED, result=sent))
        worker.expect("results", where=accepted_for(a.run_id))
        # The same stream completes the next run as usual.
        again = one_shot(api, "after", pool)
        b = next_assignment(worker, again)
        worker.send(finish(b.run_id, b.fence, pb.OUTCOME_SUCCEEDED, result='{"value": 1}'))
        worker.expect("results", where=accepted_for(b.run_id))
    finally:
        worker.close()
    [run] = wait_for(
        lambda: [r for r in all_runs(api, job_id) if r.state == jobs_pb2.RUN_STATE_SUCCEEDED],
        10,
        "the run to succeed",
    )
    error = json.loads(run.result_json)["error"]
    assert error.startswith("result refused:") and why in error
    wait_for(
        lambda: [json.loads(r.result_json) for r in all_runs(api, again)] == [{"value": 1}],
        10,
        "the next run's result",
    )
    with Client(api.server.target) as client:
        assert client.get_run(run.run_id).state is RunState.SUCCEEDED
