"""A cluster over TLS everywhere: two ``wheelctl serve --cluster`` nodes with
mutual TLS (clients, workers and each other), etcd serving TLS with client
certificates required, and PostgreSQL. A submit through one node for a
shard another owns fires, and a call that must run on the owner (a trigger)
is forwarded to it over the nodes' mutual TLS."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.conftest import EtcdServer
from tests.e2e.procs import wait_for
from tests.pki import Pki
from wheel.client import ChannelSecurity, Client, RunState
from wheel.errors import WheelError

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


@pytest.fixture
def tls_etcd(tmp_path: Path, pki: Pki) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "etcd" / "data", tls=(pki.node.cert, pki.node.key, pki.ca))
    server.data_dir.parent.mkdir(parents=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def tls_cluster(tmp_path: Path, tls_etcd: EtcdServer, pg_dsn: str, pki: Pki) -> Iterator[Cluster]:
    node_args = [
        "--tls-cert", str(pki.node.cert), "--tls-key", str(pki.node.key),
        "--client-ca", str(pki.ca),
        "--etcd-ca", str(pki.ca), "--etcd-cert", str(pki.client.cert),
        "--etcd-key", str(pki.client.key),
    ]  # fmt: skip
    cluster = Cluster(
        tmp_path / "cluster",
        tls_etcd,
        pg_dsn,
        size=2,
        workers=1,
        node_args=node_args,
        security=ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key),
        worker_env={
            "WHEEL_TLS_CA": str(pki.ca),
            "WHEEL_TLS_CERT": str(pki.client.cert),
            "WHEEL_TLS_KEY": str(pki.client.key),
        },
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _succeeded(client: Client, job_id: int) -> int:
    try:
        return sum(1 for r in client.runs(job_id) if r.state == RunState.SUCCEEDED)
    except WheelError:
        return 0


def test_a_submit_through_one_node_fires_on_the_owner_and_a_trigger_is_forwarded(
    tls_cluster: Cluster, pki: Pki
) -> None:
    a, b = tls_cluster.nodes
    security = ChannelSecurity.from_files(ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    with Client(a.target, security=security) as client:
        owners = client.membership()
        # One-shots due soon, and far-off jobs to trigger, until one of each is b's.
        soon, later = None, None
        for i in range(64):
            job = client.submit(name=f"soon-{i}", handler="scripted", at=timedelta(seconds=1))
            far = client.submit(name=f"far-{i}", handler="scripted", at=timedelta(hours=1))
            member, far_member = owners.owner_of(job.job_id), owners.owner_of(far.job_id)
            if soon is None and member is not None and member.node_id == b.node_id:
                soon = job.job_id
            if later is None and far_member is not None and far_member.node_id == b.node_id:
                later = far.job_id
            if soon is not None and later is not None:
                break
        assert soon is not None and later is not None
        wait_for(lambda: _succeeded(client, soon), 20, "the job a submitted for b's shard to fire")
        # A trigger must run on the owner: a forwards it to b, over mutual TLS.
        client.trigger(later)
        wait_for(lambda: _succeeded(client, later), 20, "the forwarded trigger to fire")
    executions = {e.job_id: e for e in tls_cluster.truth.executions()}
    for job_id in (soon, later):
        run = executions[job_id]
        assert run.state == "succeeded"
        # Its fence's epoch is one b acquired: b dispatched it.
        assert tls_cluster.truth.shard_epochs()[run.shard][1] == b.node_id
