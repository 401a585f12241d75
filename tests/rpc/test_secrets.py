"""Signing secrets over real gRPC on a node's process: AdminService's calls
(names checked, tenants kept apart, values never shown but once), and runs
of HTTP targets handed out on a raw worker stream signed the Standard
Webhooks way, checked with the reference ``standardwebhooks`` library."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import prometheus_client
import pytest
from standardwebhooks.webhooks import Webhook

from tests.rpc.test_api import InProcessServer, now_ms, once, spec, submit
from tests.rpc.test_protocol_abuse import RawWorker, ack, complete
from wheel.app import AppConfig
from wheel.auth import JOBS_READ, JOBS_WRITE
from wheel.cli import main
from wheel.cli.admin import init_admin_token
from wheel.engine.owner import OwnerConfig
from wheel.node import NodeConfig, SecretsKey
from wheel.rpc.v1 import admin_service_pb2 as admin
from wheel.rpc.v1 import admin_service_pb2_grpc, jobs_pb2
from wheel.rpc.v1 import worker_service_pb2 as wpb
from wheel.store.base import Store


class SecretsServer(InProcessServer):
    """``InProcessServer`` with a data directory (where its secrets key is
    made), or a key file given, and optionally ``--auth``."""

    def __init__(self, data_dir: Path, *, key_file: Path | None = None, auth: bool = False) -> None:
        super().__init__(data_dir, OwnerConfig(lease_ms=5_000, grace_lease_ms=2_000))
        self.key_file = key_file
        self.auth = auth
        self.admin_token_file = data_dir / "admin.token"

    async def _start(self) -> None:
        from wheel.app import running

        def first_token(store: Store) -> None:
            init_admin_token(store, str(self.admin_token_file), now_ms())

        config = AppConfig(
            store_url=f"sqlite:///{self.data_dir / 'wheel.db'}",
            node=NodeConfig(owner=self.owner),
            listen="127.0.0.1:0",
            drain_s=0.5,
            data_dir=self.data_dir,
            secrets_key_file=self.key_file,
            auth=self.auth,
            on_store=first_token if self.auth else None,
        )
        app = await self._stack.enter_async_context(running(config))
        self.node, self.server, self.port = app.node, app.server, app.port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SecretsServer]:
    s = SecretsServer(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def admin_stub(server: SecretsServer) -> Iterator[admin_service_pb2_grpc.AdminServiceStub]:
    channel = grpc.insecure_channel(server.target)
    try:
        yield admin_service_pb2_grpc.AdminServiceStub(channel)
    finally:
        channel.close()


# How far apart the node's clock and the test's may read.
CLOCKS_MS = 50


def http_job(api: Any, secret: str, body: bytes = b'{"order": 7}', **kw: Any) -> int:
    """A job of an HTTP target signed by ``secret`` firing now (its runs'
    payload an HttpCall)."""
    msg = spec(name=f"hook-{secret}", payload=body, schedule=once(now_ms()), **kw)
    msg.handler = ""
    msg.http.CopyFrom(jobs_pb2.HttpTarget(url="http://127.0.0.1:9/hook", signing_secret=secret))
    return int(submit(api, msg).job.job_id)


class _Jobs:
    """What ``submit`` needs of an ``Api``: a JobService stub."""

    def __init__(self, target: str) -> None:
        from wheel.rpc.v1 import job_service_pb2_grpc

        self.channel = grpc.insecure_channel(target)
        self.jobs = job_service_pb2_grpc.JobServiceStub(self.channel)


@pytest.fixture
def api(server: SecretsServer) -> Iterator[_Jobs]:
    jobs = _Jobs(server.target)
    try:
        yield jobs
    finally:
        jobs.channel.close()


def assignment_of(worker: RawWorker, job_id: int, timeout: float = 10) -> wpb.Assignment:
    msg = worker.expect(
        "assignments",
        timeout,
        where=lambda m: any(a.job_id == job_id for a in m.assignments.assignments),
    )
    return next(a for a in msg.assignments.assignments if a.job_id == job_id)  # type: ignore[no-any-return]


def headers_of(a: wpb.Assignment) -> dict[str, str]:
    return {h.name: h.value for h in a.signed_headers}


def body_of(a: wpb.Assignment) -> bytes:
    return bytes(jobs_pb2.HttpCall.FromString(a.payload).body)


# -- AdminService ---------------------------------------------------------------------


def test_a_generated_secret_is_shown_once_and_never_listed(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub,
) -> None:
    made = admin_stub.SetSecret(admin.SetSecretRequest(name="hook", generate=True), timeout=10)
    assert made.value.startswith("whsec_")
    assert (made.info.tenant, made.info.name, made.info.version) == ("default", "hook", 1)
    assert made.info.key_id and made.info.retires_at_ms == 0
    listed = admin_stub.ListSecrets(admin.ListSecretsRequest(), timeout=10)
    assert [(s.name, s.version) for s in listed.secrets] == [("hook", 1)]
    assert made.value.removeprefix("whsec_") not in str(listed)
    # A given value is never echoed back.
    given = admin_stub.SetSecret(
        admin.SetSecretRequest(name="hook", value=b"whsec_" + b"QUFB" * 8), timeout=10
    )
    assert given.value == "" and given.info.version == 2


def test_rotate_keeps_the_older_version_for_the_overlap(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub,
) -> None:
    admin_stub.SetSecret(admin.SetSecretRequest(name="hook", generate=True), timeout=10)
    before = now_ms()
    rotated = admin_stub.RotateSecret(
        admin.RotateSecretRequest(name="hook", generate=True, overlap_ms=60_000), timeout=10
    )
    assert rotated.value.startswith("whsec_") and rotated.info.version == 2
    listed = admin_stub.ListSecrets(admin.ListSecretsRequest(), timeout=10).secrets
    assert [s.version for s in listed] == [1, 2]
    # The node's clock and this process's may read a few ms apart.
    assert before + 60_000 - CLOCKS_MS <= listed[0].retires_at_ms <= now_ms() + 60_000 + CLOCKS_MS
    assert listed[1].retires_at_ms == 0
    deleted = admin_stub.DeleteSecret(admin.DeleteSecretRequest(name="hook"), timeout=10)
    assert deleted.deleted == 2
    assert not admin_stub.ListSecrets(admin.ListSecretsRequest(), timeout=10).secrets


_Set = admin.SetSecretRequest
_Rotate = admin.RotateSecretRequest
_BAD = "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("call", "request_", "code", "field"),
    [
        ("SetSecret", _Set(name="", generate=True), _BAD, "name"),
        ("SetSecret", _Set(name="a b", generate=True), _BAD, "name"),
        ("SetSecret", _Set(name="x" * 129, generate=True), _BAD, "name"),
        ("SetSecret", _Set(name="hook"), _BAD, "value"),
        ("SetSecret", _Set(name="hook", value=b"short"), _BAD, "value"),
        ("SetSecret", _Set(name="hook", value=b"whsec_!!"), _BAD, "value"),
        ("SetSecret", _Set(name="hook", generate=True, value=b"k" * 32), _BAD, "value"),
        ("SetSecret", _Set(tenant="*", name="hook", generate=True), _BAD, "tenant"),
        ("RotateSecret", _Rotate(name="absent", generate=True), "NOT_FOUND", "absent"),
        ("RotateSecret", _Rotate(name="kept", generate=True, overlap_ms=-1), _BAD, "overlap_ms"),
        ("DeleteSecret", admin.DeleteSecretRequest(name="no/slash"), _BAD, "name"),
    ],
)
def test_a_bad_request_names_its_field_and_changes_nothing(
    admin_stub: admin_service_pb2_grpc.AdminServiceStub,
    call: str,
    request_: Any,
    code: str,
    field: str,
) -> None:
    admin_stub.SetSecret(admin.SetSecretRequest(name="kept", generate=True), timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        getattr(admin_stub, call)(request_, timeout=10)
    assert info.value.code().name == code
    assert field in info.value.details()
    if isinstance(request_, admin.SetSecretRequest) and request_.value:
        assert request_.value.decode(errors="replace") not in info.value.details()
    listed = admin_stub.ListSecrets(admin.ListSecretsRequest(), timeout=10).secrets
    assert [(s.name, s.version) for s in listed] == [("kept", 1)]


def test_a_tenant_sees_and_touches_only_its_own_secrets(tmp_path: Path) -> None:
    server = SecretsServer(tmp_path, auth=True)
    server.start()
    channel = grpc.insecure_channel(server.target)
    try:
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        root = server.admin_token_file.read_text().strip()

        def as_(token: str) -> list[tuple[str, str]]:
            return [("authorization", f"Bearer {token}")]

        def tenant_token(tenant: str, *scopes: str) -> str:
            made = stub.CreateToken(
                admin.CreateTokenRequest(tenant=tenant, scopes=list(scopes)),
                metadata=as_(root),
                timeout=10,
            )
            return str(made.token)

        acme = tenant_token("acme", JOBS_READ, JOBS_WRITE)
        zeta = tenant_token("zeta", JOBS_READ, JOBS_WRITE)
        reader = tenant_token("acme", JOBS_READ)
        # The credential's tenant, whatever the request leaves empty.
        mine = stub.SetSecret(
            admin.SetSecretRequest(name="hook", generate=True), metadata=as_(acme), timeout=10
        )
        assert mine.info.tenant == "acme"
        stub.SetSecret(
            admin.SetSecretRequest(name="hook", generate=True), metadata=as_(zeta), timeout=10
        )
        for call, req in (
            ("SetSecret", admin.SetSecretRequest(tenant="zeta", name="hook", generate=True)),
            ("RotateSecret", admin.RotateSecretRequest(tenant="zeta", name="hook")),
            ("DeleteSecret", admin.DeleteSecretRequest(tenant="zeta", name="hook")),
        ):
            with pytest.raises(grpc.RpcError) as info:
                getattr(stub, call)(req, metadata=as_(acme), timeout=10)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, call
            assert "tenant" in info.value.details()
        # Listing another tenant's gives the caller's own.
        seen = stub.ListSecrets(
            admin.ListSecretsRequest(tenant="zeta"), metadata=as_(acme), timeout=10
        ).secrets
        assert [(s.tenant, s.name) for s in seen] == [("acme", "hook")]
        # Writing needs jobs:write; reading jobs:read is enough to list.
        with pytest.raises(grpc.RpcError) as info:
            stub.SetSecret(
                admin.SetSecretRequest(name="x", generate=True), metadata=as_(reader), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert len(stub.ListSecrets(admin.ListSecretsRequest(), metadata=as_(reader)).secrets) == 1
        # The operator sees every tenant's, and names any.
        every = stub.ListSecrets(admin.ListSecretsRequest(), metadata=as_(root), timeout=10)
        assert [(s.tenant, s.name) for s in every.secrets] == [("acme", "hook"), ("zeta", "hook")]
        gone = stub.DeleteSecret(
            admin.DeleteSecretRequest(tenant="zeta", name="hook"), metadata=as_(root), timeout=10
        )
        assert gone.deleted == 1
    finally:
        channel.close()
        server.stop()


# -- signing at hand-out ----------------------------------------------------------------


def test_a_hand_out_is_signed_and_verifies_with_the_reference_library(
    server: SecretsServer, admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: _Jobs
) -> None:
    secret = admin_stub.SetSecret(
        admin.SetSecretRequest(name="hook", generate=True), timeout=10
    ).value
    job_id = http_job(api, "hook")
    worker = RawWorker(server.target, "w1", capacity=4, handlers=["http"])
    try:
        a = assignment_of(worker, job_id)
        headers = headers_of(a)
        assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
        assert a.sign_error == ""
        # webhook-id is the fire's idempotency key.
        assert headers["webhook-id"] == a.idempotency_key == f"{job_id}:{a.scheduled_for_ms}"
        assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
        assert Webhook(secret).verify(body_of(a), headers) == {"order": 7}
        # Another secret's signature does not verify.
        with pytest.raises(Exception, match="signature"):
            Webhook("whsec_" + "QUFB" * 8).verify(body_of(a), headers)
    finally:
        worker.close()


def test_a_rotated_secret_signs_with_both_versions(
    server: SecretsServer, admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: _Jobs
) -> None:
    old = admin_stub.SetSecret(admin.SetSecretRequest(name="hook", generate=True), timeout=10)
    new = admin_stub.RotateSecret(admin.RotateSecretRequest(name="hook", generate=True))
    job_id = http_job(api, "hook")
    worker = RawWorker(server.target, "w1", capacity=4, handlers=["http"])
    try:
        a = assignment_of(worker, job_id)
        headers = headers_of(a)
        assert len(headers["webhook-signature"].split(" ")) == 2
        for secret in (old.value, new.value):
            Webhook(secret).verify(body_of(a), headers)
    finally:
        worker.close()


def test_a_submit_naming_no_secret_of_its_tenant_is_refused(
    server: SecretsServer, api: _Jobs
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        http_job(api, "never-set")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.http.signing_secret" in str(info.value.details())


def test_a_secret_deleted_under_its_job_gives_a_sign_error_naming_it(
    server: SecretsServer, admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: _Jobs
) -> None:
    admin_stub.SetSecret(admin.SetSecretRequest(name="short-lived", generate=True))
    worker = RawWorker(server.target, "w1", capacity=0, handlers=["http"])
    try:
        job_id = http_job(api, "short-lived")
        admin_stub.DeleteSecret(admin.DeleteSecretRequest(name="short-lived"))
        worker.send(wpb.WorkerMessage(credit=wpb.Credit(add=4)))
        a = assignment_of(worker, job_id)
        assert not a.signed_headers
        assert "'short-lived'" in a.sign_error and "unknown" in a.sign_error
    finally:
        worker.close()


def test_a_secret_set_after_a_miss_signs_the_next_hand_out(
    server: SecretsServer, admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: _Jobs
) -> None:
    """The node's cache is read again after a local change: a job that could
    not sign signs once its secret exists."""
    admin_stub.SetSecret(admin.SetSecretRequest(name="late", generate=True))
    worker = RawWorker(server.target, "w1", capacity=0, handlers=["http"])
    try:
        first = http_job(api, "late")
        admin_stub.DeleteSecret(admin.DeleteSecretRequest(name="late"))
        worker.send(wpb.WorkerMessage(credit=wpb.Credit(add=4)))
        assert assignment_of(worker, first).sign_error
        secret = admin_stub.SetSecret(admin.SetSecretRequest(name="late", generate=True)).value
        second = http_job(api, "late")
        a = assignment_of(worker, second)
        Webhook(secret).verify(body_of(a), headers_of(a))
    finally:
        worker.close()


def test_every_attempt_of_a_fire_carries_its_id_and_its_own_timestamp(
    server: SecretsServer, admin_stub: admin_service_pb2_grpc.AdminServiceStub, api: _Jobs
) -> None:
    secret = admin_stub.SetSecret(admin.SetSecretRequest(name="hook", generate=True)).value
    retry = jobs_pb2.RetryPolicy(max_attempts=3, initial_backoff_ms=1_500, multiplier=1.0)
    job_id = http_job(api, "hook", retry=retry)
    worker = RawWorker(server.target, "w1", capacity=4, handlers=["http"])
    try:
        first = assignment_of(worker, job_id)
        worker.send(ack((first.run_id, first.fence)))
        worker.send(complete(first.run_id, first.fence, wpb.OUTCOME_RETRYABLE))
        second = assignment_of(worker, job_id, timeout=15)
        assert second.run_id != first.run_id and second.fence > first.fence
        assert second.scheduled_for_ms == first.scheduled_for_ms
        h1, h2 = headers_of(first), headers_of(second)
        assert h1["webhook-id"] == h2["webhook-id"]
        # The retry waited 1.5 s: its hand-out is a later second.
        assert int(h2["webhook-timestamp"]) > int(h1["webhook-timestamp"])
        assert h1["webhook-signature"] != h2["webhook-signature"]
        for a in (first, second):
            Webhook(secret).verify(body_of(a), headers_of(a))
    finally:
        worker.close()


def test_a_node_with_another_key_reports_it_and_does_not_sign(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    key_a, key_b = tmp_path / "a.key", tmp_path / "b.key"
    id_a = SecretsKey.load_or_create(key_a).key_id
    id_b = SecretsKey.load_or_create(key_b).key_id
    data = tmp_path / "node"
    data.mkdir()
    first = SecretsServer(data, key_file=key_a).start()
    try:
        channel = grpc.insecure_channel(first.target)
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        made = stub.SetSecret(admin.SetSecretRequest(name="hook", generate=True), timeout=10)
        assert made.info.key_id == id_a
        channel.close()
    finally:
        first.stop()
    second = SecretsServer(data, key_file=key_b).start()
    jobs = _Jobs(second.target)
    worker = RawWorker(second.target, "w1", capacity=4, handlers=["http"])
    try:
        for _ in range(2):
            a = assignment_of(worker, http_job(jobs, "hook"))
            assert not a.signed_headers
            assert id_a in a.sign_error and id_b in a.sign_error
            assert "--secrets-key-file" in a.sign_error
        errors = [
            r for r in caplog.records if r.levelno >= logging.ERROR and id_a in r.getMessage()
        ]
        assert len(errors) == 1, [r.getMessage() for r in errors]
    finally:
        worker.close()
        jobs.channel.close()
        second.stop()


# -- the value appears nowhere -----------------------------------------------------------


def test_a_secret_value_is_absent_from_logs_listings_metrics_and_the_store(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    server = SecretsServer(tmp_path).start()
    jobs = _Jobs(server.target)
    target = ["--target", server.target]
    try:
        assert main(["secret", "set", "hook", "--generate", *target]) == 0
        out = capsys.readouterr()
        secret = out.out.strip()
        assert secret.startswith("whsec_") and "\n" not in secret
        assert secret not in out.err
        value_file = tmp_path / "given.secret"
        given = "whsec_" + "Z2l2ZW4t" * 4
        value_file.write_text(given + "\n")
        assert main(["secret", "set", "given", "--value-file", str(value_file), *target]) == 0
        assert capsys.readouterr().out.startswith("set default       given ")
        assert main(["secret", "rotate", "hook", "--overlap", "1h", *target]) == 0
        rotated = capsys.readouterr().out.strip()
        assert rotated.startswith("whsec_") and rotated != secret
        assert main(["secret", "list", "--json", *target]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [(s["name"], s["version"]) for s in listed] == [
            ("given", 1),
            ("hook", 1),
            ("hook", 2),
        ]
        assert listed[1]["retires_at"] is not None and listed[2]["retires_at"] is None
        assert main(["secret", "list", *target]) == 0
        assert main(["secret", "delete", "given", *target]) == 0
        assert main(["secret", "delete", "given", *target]) == 1
        job_id = http_job(jobs, "hook")
        worker = RawWorker(server.target, "w1", capacity=4, handlers=["http"])
        try:
            a = assignment_of(worker, job_id)
            Webhook(rotated).verify(body_of(a), headers_of(a))
        finally:
            worker.close()
        assert server.node is not None
        metrics = prometheus_client.generate_latest(server.node.metrics.registry).decode()
        printed = capsys.readouterr()
        seen = "\n".join([caplog.text, printed.out, printed.err, metrics, json.dumps(listed)])
        store_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("wheel.db*"))
        for value in (secret, rotated, given):
            body = value.removeprefix("whsec_")
            assert body not in seen
            assert body.encode() not in store_bytes
            key = _key_bytes(value)
            assert key not in store_bytes
    finally:
        jobs.channel.close()
        server.stop()


def _key_bytes(value: str) -> bytes:
    from wheel.webhooks import parse_secret

    return parse_secret(value)


def test_a_whsec_text_in_a_log_record_is_redacted() -> None:
    from wheel.logs import redact

    assert redact("sent whsec_QUJDRA== to x") == "sent whsec_[redacted] to x"
