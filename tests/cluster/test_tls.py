"""A cluster over TLS everywhere: two ``wheelctl serve --cluster`` nodes with
mutual TLS (clients, workers and each other), etcd serving TLS with client
certificates required, and PostgreSQL. A submit through one node for a
shard another owns fires, and a call that must run on the owner (a trigger)
is forwarded to it over the nodes' mutual TLS, before and after the nodes'
certificates are rotated without a restart."""

from __future__ import annotations

import os
import signal
import socket
import ssl
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from testkit.cluster import Cluster, ClusterNode
from testkit.procs import wait_for
from testkit.services import EtcdServer, running_etcd
from tests.pki import Pair, Pki
from wheel.client import ChannelSecurity, Client, RunState
from wheel.errors import WheelError

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.etcd]


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[EtcdServer]:
    """One etcd for the module: each cluster has its own name (key prefix)."""
    with running_etcd(tls=(pki.node.cert, pki.node.key, pki.ca)) as server:
        yield server


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
        name="tls",
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


def _bundle(path: Path, *cas: Path) -> Path:
    path.write_bytes(b"".join(ca.read_bytes() for ca in cas))
    return path


def _put(path: Path, source: Path) -> None:
    """Replace ``path`` with a copy of ``source`` in one step (write aside, rename)."""
    aside = path.with_name(f".{path.name}.new")
    aside.write_bytes(source.read_bytes())
    os.replace(aside, path)


def _certificate(target: str, ca: Path, client: Pair) -> bytes:
    """The certificate a new TLS connection to ``target`` is shown."""
    host, port = target.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.load_cert_chain(client.cert, client.key)
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        cert = tls.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def test_after_a_rotation_on_sighup_calls_between_the_nodes_go_over_the_new_certificates(
    tmp_path: Path, tls_etcd: EtcdServer, pg_dsn: str, pki: Pki
) -> None:
    """Both nodes move to certificates of another CA, and to trusting only it
    in each other (``--peer-tls-ca``); clients and the worker trust both CAs.
    A call forwarded after the reload goes over a channel made with the new
    certificate and the new CA: one made with the old ones cannot verify the
    other node any more."""
    tls = tmp_path / "tls"
    tls.mkdir()
    cert, key, peer_ca = tls / "node.pem", tls / "node.key", tls / "peer-ca.pem"
    for path, source in ((cert, pki.node.cert), (key, pki.node.key), (peer_ca, pki.ca)):
        _put(path, source)
    both = _bundle(tls / "both-cas.pem", pki.ca, pki.other_ca)
    node_args = [
        "--tls-cert", str(cert), "--tls-key", str(key),
        "--client-ca", str(both), "--peer-tls-ca", str(peer_ca),
        "--tls-reload-interval", "off",
        "--etcd-ca", str(pki.ca), "--etcd-cert", str(pki.client.cert),
        "--etcd-key", str(pki.client.key),
    ]  # fmt: skip
    security = ChannelSecurity.from_files(ca=both, cert=pki.client.cert, key=pki.client.key)
    cluster = Cluster(
        tmp_path / "cluster",
        tls_etcd,
        pg_dsn,
        size=2,
        workers=1,
        name="rotation",
        node_args=node_args,
        security=security,
        worker_env={
            "WHEEL_TLS_CA": str(both),
            "WHEEL_TLS_CERT": str(pki.client.cert),
            "WHEEL_TLS_KEY": str(pki.client.key),
        },
    )
    try:
        cluster.start()
        a, b = cluster.nodes
        with Client(a.target, security=security) as client:
            # Far-off jobs of each node's shards, all submitted through a: a
            # tells b of b's (a channel from a to b, made before the
            # rotation); b has never called a.
            owners = client.membership()
            mine: dict[str, int] = {}
            for i in range(64):
                job = client.submit(name=f"far-{i}", handler="scripted", at=timedelta(hours=1))
                owner = owners.owner_of(job.job_id)
                assert owner is not None
                mine.setdefault(owner.node_id, job.job_id)
                if len(mine) == 2:
                    break
            of_a, of_b = mine[a.node_id], mine[b.node_id]
            client.trigger(of_b)  # forwarded from a to b
            wait_for(lambda: _succeeded(client, of_b) == 1, 20, "a's forward to b to fire")

        _put(cert, pki.other_node.cert)
        _put(key, pki.other_node.key)
        _put(peer_ca, pki.other_ca)
        for node in (a, b):
            node.signal(signal.SIGHUP)
        for node in (a, b):
            wait_for(lambda: _reloaded(node), 20, f"{node.node_id} to reload")  # noqa: B023
            assert _certificate(node.target, both, pki.client) == _der(pki.other_node.cert)

        with Client(b.target, security=security) as client:
            client.trigger(of_a)  # forwarded from b to a: a new channel
            wait_for(lambda: _succeeded(client, of_a) == 1, 20, "b's forward to a to fire")
        with Client(a.target, security=security) as client:
            client.trigger(of_b)  # from a to b again: the old channel was retired
            wait_for(lambda: _succeeded(client, of_b) == 2, 20, "a's second forward to fire")
        holders = cluster.ownership().holder_epochs()  # shard -> (node, epoch)
        runs = cluster.truth.executions()
    finally:
        cluster.stop()
    # Each fired once a trigger, on its owner: under the epoch it holds its shard by.
    assert sorted((e.job_id, e.state) for e in runs) == sorted(
        [(of_a, "succeeded"), (of_b, "succeeded"), (of_b, "succeeded")]
    )
    assert {e.job_id: holders[e.shard] for e in runs} == {
        e.job_id: (a.node_id if e.job_id == of_a else b.node_id, e.epoch) for e in runs
    }


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def _reloaded(node: ClusterNode) -> bool:
    log = (node.data_dir.parent / f"server-{node.starts}.log").read_text()
    return "TLS reloaded (SIGHUP): the listeners' certificates" in log
