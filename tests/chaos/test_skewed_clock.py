"""A node whose host clock is wrong still fires on time. Found by the chaos
benchmark's clock steps (``--faults clock_step``): a node ran on its host's
wall time, so one started 3 s ahead started runs 3 s early. A node now reads
the store's clock at start and runs on it (``Node._anchor_clock``), so its
host's clock -- skewed by the ``--clock-skew-file`` test hook here --
no longer decides when a fire is due.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from testkit.cluster import Cluster, utc
from testkit.e2e_handlers import effects
from testkit.procs import wait_for
from testkit.services import EtcdServer
from wheel.client import Client, JobRequest

SKEW_MS = 3_000
# How far ahead the tests' fires are due: past the skew, so a node on its
# host's clock would start them early but after they were submitted.
LEAD_MS = SKEW_MS + 1_000


@pytest.fixture(scope="module")
def skewed(
    tmp_path_factory: pytest.TempPathFactory, module_etcd_server: EtcdServer, module_pg_dsn: str
) -> Iterator[Cluster]:
    """A one-node cluster whose node's clock reads SKEW_MS ahead (the
    ``--clock-skew-file`` test hook), and one worker; one for the
    module, each test judging only its own jobs."""
    root = tmp_path_factory.mktemp("skewed")
    skew = root / "skew"
    skew.write_text(str(SKEW_MS))
    c = Cluster(
        root, module_etcd_server, module_pg_dsn, size=1, workers=1,
        node_flags=lambda _: ("--clock-skew-file", str(skew)),
    )  # fmt: skip
    try:
        c.start()
        yield c
    finally:
        c.stop()


def starts_of(cluster: Cluster, jobs: set[int], count: int) -> list[tuple[int, int]]:
    """(scheduled_for ms, first start ms by the worker's clock) of ``count``
    fires of ``jobs``."""
    first: dict[int, int] = {}

    def all_started() -> bool:
        for e in effects(cluster.out):
            if e["kind"] == "start" and e["job"] in jobs:
                t = int(e["t"] * 1000)
                first[e["scheduled_for"]] = min(t, first.get(e["scheduled_for"], t))
        return len(first) >= count

    wait_for(all_started, 30, f"{count} fires to start")
    return sorted(first.items())


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.etcd
def test_a_node_whose_clock_runs_ahead_never_starts_a_run_early(skewed: Cluster) -> None:
    at = time.time_ns() // 1_000_000 + LEAD_MS
    requests = [
        JobRequest(name=f"at-{i}", handler="chaos", at=utc(at + 200 * i), idempotency_key=f"at-{i}")
        for i in range(5)
    ]
    with Client(skewed.targets, timeout=5.0) as client:
        jobs = {r.job_id for r in client.submit_many(requests) if not isinstance(r, Exception)}
    assert len(jobs) == 5
    for scheduled_for, started in starts_of(skewed, jobs, 5):
        assert started >= scheduled_for, f"started {scheduled_for - started} ms early"


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.etcd
def test_a_node_whose_clock_runs_ahead_fires_on_the_stores_time_and_says_so(
    skewed: Cluster,
) -> None:
    """Neither early nor late by the skew: within the ordinary dispatch lag
    of the true due time; the node's log says how far its host was off."""
    at = time.time_ns() // 1_000_000 + LEAD_MS
    with Client(skewed.targets, timeout=5.0) as client:
        job = client.submit(
            name="every", handler="chaos", every=timedelta(seconds=1), start=utc(at)
        )
    for scheduled_for, started in starts_of(skewed, {job.job_id}, 3):
        assert 0 <= started - scheduled_for < 1_000, (scheduled_for, started)
    logs = "".join(p.read_text() for p in skewed.root.glob("node-*/server-*.log"))
    offs = [int(m) for m in re.findall(r"this host's clock is \+(\d+) ms off the store's", logs)]
    assert offs and all(abs(off - SKEW_MS) <= 100 for off in offs), offs  # a few ms either way
