"""Any member lists the runs every member of the cluster holds (the console's
in-flight panel, ``Client.in_flight``), each with the member that holds it;
a member that does not answer in time is named, and the rest are listed."""

from __future__ import annotations

import functools
import json
import signal
import time

import pytest

from testkit.cluster import HANDLER, Cluster, now_ms, utc
from testkit.procs import wait_for
from wheel.cli import main
from wheel.client import Client, InFlight, JobRequest
from wheel.engine.model import shard_of

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]

JOBS = 12
HOLD = json.dumps({"sleep_s": 8}).encode()  # running while the test looks


def test_any_member_lists_the_runs_of_every_member_and_names_one_that_does_not_answer(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    holders = cluster.ownership().holder_epochs()
    at = now_ms() + 300
    results = (
        cluster.nodes[0]
        .client()
        .submit_many(
            [
                JobRequest(name=f"held-{i}", handler=HANDLER, at=utc(at), payload=HOLD)
                for i in range(JOBS)
            ]
        )
    )
    owners = {
        r.job_id: holders[shard_of(r.job_id)][0] for r in results if not isinstance(r, Exception)
    }
    assert len(owners) == JOBS, results
    assert len(set(owners.values())) > 1, owners  # 12 jobs on one of 3 nodes: 1 in 177,147

    def ours(held: InFlight) -> dict[int, str]:
        return {r.job_id: r.node_id for r in held.runs if r.job_id in owners and r.worker_id}

    def listed(client: Client) -> InFlight | None:
        held = client.in_flight(limit=1000)
        return held if len(ours(held)) == JOBS else None

    for node in cluster.nodes:
        held: InFlight = wait_for(
            functools.partial(listed, node.client()),
            15,
            f"{node.node_id} to list every member's runs",
        )
        assert ours(held) == owners
        assert held.unreachable == [] and held.total >= JOBS

    # wheelctl inflight says the same, as JSON and as text.
    target = cluster.nodes[1].target
    assert main(["inflight", "--target", target, "--limit", "1000", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert {r["job_id"]: r["node_id"] for r in answer["runs"] if r["job_id"] in owners} == owners
    assert answer["unreachable"] == [] and answer["total"] >= JOBS
    assert main(["inflight", "--target", target, "--limit", "1000"]) == 0
    text = capsys.readouterr().out
    assert all(f"job {j:<10}" in text for j in owners) and "in flight" in text

    stopped = cluster.nodes[2]
    asked = cluster.nodes[0]
    with Client(asked.target, timeout=1.0) as client:
        stopped.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            held = client.in_flight(limit=1000)
            took = time.monotonic() - started
        finally:
            stopped.signal(signal.SIGCONT)
    assert held.unreachable == [stopped.node_id]
    assert took < 1.0
    assert ours(held) == {j: n for j, n in owners.items() if n != stopped.node_id}
