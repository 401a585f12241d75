"""HTTP targets end to end, with real processes: a node (`wheelctl serve`,
console on, 2 s leases), `wheelctl worker --http` processes, a signing
secret the node generated (`wheelctl secret set --generate`), and a real
HTTP server on loopback that verifies every request with the Standard
Webhooks reference library (``standardwebhooks``), never with wheel's code.

The node, the secret, the receiver and the module's shared worker serve
every test; each test has its own paths on the receiver, and the tests that
need workers of their own have their own pools. The last test reads every
log and answer the others left, looking for the secret's value."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from testkit.procs import WorkerProc, wait_for, wheelctl
from testkit.webhook_receiver import Received, Receiver, Reply
from tests.console.http import ConsoleNode, call
from wheel.client import Client

pytestmark = pytest.mark.slow

LEASE_MS = 2_000
GRACE_MS = 1_000
SECRET = "hooks"
# Retries come soon: a test waits for them.
QUICK_RETRY = ("--initial-backoff", "200ms", "--max-backoff", "500ms")


class Env:
    """What the module's tests share, and every answer they were given."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = ConsoleNode(
            root / "data",
            args=("--lease-ms", str(LEASE_MS), "--grace-lease-ms", str(GRACE_MS)),
        )
        self.out = root / "workers" / "out"
        self.out.parent.mkdir()
        self.workers: list[WorkerProc] = []
        # Every output of wheelctl and the console, for the secret's check.
        self.answers: list[tuple[str, str]] = []
        self.jobs: list[int] = []
        self.secret = ""
        # Values of later versions (rotations), for the same check.
        self.rotated: list[str] = []
        self.receiver = Receiver()

    @property
    def target(self) -> str:
        return self.node.target

    def ctl(self, *args: str, keep: bool = True) -> str:
        done = wheelctl(*args, "--target", self.target, check=False, timeout=60)
        if keep:
            self.answers.append((" ".join(args), done.stdout + done.stderr))
        assert done.returncode == 0, f"wheelctl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def worker(self, worker_id: str, *flags: str) -> WorkerProc:
        w = WorkerProc(self.target, self.out, worker_id, flags=("--http", *flags))
        self.workers.append(w)
        wait_for(w.connected, 30, f"{worker_id} to connect")
        return w

    def submit(self, path: str, *flags: str, name: str = "hook") -> int:
        out = self.ctl(
            "submit", "--name", name, "--http-url", self.receiver.url(path),
            "--signing-secret", SECRET, "--at", "+0s", "--json", *QUICK_RETRY, *flags,
        )  # fmt: skip
        job_id = int(json.loads(out)["job_id"])
        self.jobs.append(job_id)
        return job_id

    def runs(self, job_id: int) -> list[dict[str, Any]]:
        """The job's runs as ``wheelctl runs --json`` gives them, oldest attempt first."""
        runs: list[dict[str, Any]] = json.loads(self.ctl("runs", str(job_id), "--json", "--all"))
        return sorted((r for r in runs if r["run_id"]), key=lambda r: r["attempt"])

    def wait_states(self, job_id: int, states: list[str], timeout: float = 20) -> list[Any]:
        """The job's runs as ``runs --json`` gives them, once their states
        (oldest attempt first) are ``states``."""

        def reached() -> bool:
            with Client(self.target) as client:
                runs = sorted((r.attempt, r.state.value) for r in client.runs(job_id) if r.run_id)
            return [state for _, state in runs] == states

        try:
            wait_for(reached, timeout, f"job {job_id}'s runs: {states}")
        except AssertionError:
            raise AssertionError(f"job {job_id}: {self.runs(job_id)}") from None
        runs = self.runs(job_id)
        assert [r["state"] for r in runs] == states, runs
        return runs


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("http-targets"))
    e.node.start()
    try:
        # Generated on the node and printed once: this answer is the one
        # place the value may appear, so it is not kept for the check.
        printed = e.ctl("secret", "set", SECRET, "--generate", keep=False)
        found = re.findall(r"whsec_[A-Za-z0-9+/=]+", printed)
        assert len(found) == 1, printed
        e.secret = found[0]
        e.receiver.add_secret(e.secret)
        e.receiver.start()
        e.worker("http-1", "--allow-private-targets", "--capacity", "32")
        yield e
    finally:
        e.receiver.release()
        for w in e.workers:
            w.stop(signal.SIGKILL)
        e.node.stop()
        e.receiver.stop()


def one_request(env: Env, path: str) -> Received:
    (r,) = env.receiver.wait_requests(path, 1, 20)
    return r


def test_a_signed_request_verifies_and_carries_its_fire_attempt_and_fence(env: Env) -> None:
    payload = '{"order": 42}'
    job = env.submit("/signed", "--payload", payload, "--http-header", "X-Team: blue")
    r = one_request(env, "/signed")
    (run,) = env.wait_states(job, ["succeeded"])
    assert r.verified, r.verify_error
    assert (r.method, r.body, r.headers["x-team"]) == ("POST", payload.encode(), "blue")
    # webhook-id is the fire's idempotency key, sent as Idempotency-Key too.
    with Client(env.target) as client:
        (stored,) = [x for x in client.runs(job) if x.run_id == run["run_id"]]
    assert r.webhook_id == r.headers["idempotency-key"] == stored.idempotency_key
    assert (r.fence, r.attempt) == (run["fence"], 1)
    assert r.scheduled_for_ms == run["scheduled_for_ms"]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", r.headers["wheel-scheduled-for"]
    )
    # Signed at this attempt: no earlier than its dispatch, no later than its arrival.
    assert run["dispatched_at_ms"] // 1000 <= r.timestamp_s <= r.received_ms // 1000 + 1
    # The run's result: what the endpoint answered.
    result = run["result"]
    assert (result["http_status"], result["response_excerpt"]) == (200, "ok")
    assert 0 <= result["duration_ms"] < 10_000
    whole = json.loads(env.ctl("run", str(run["run_id"]), "--json"))
    assert (whole["run_id"], whole["result"]["http_status"]) == (run["run_id"], 200)


def test_a_503_is_retried_and_the_retry_is_signed_anew_under_the_same_id(env: Env) -> None:
    # Retry-After 1 s: the retry's hand-out is in a later second than the first's.
    env.receiver.script("/flaky", Reply(status=503, headers=(("Retry-After", "1"),)), Reply())
    job = env.submit("/flaky")
    first, second = env.receiver.wait_requests("/flaky", 2, 20)
    runs = env.wait_states(job, ["failed", "succeeded"])
    assert first.verified and second.verified, (first.verify_error, second.verify_error)
    assert first.webhook_id == second.webhook_id == second.headers["idempotency-key"]
    assert (first.attempt, second.attempt) == (1, 2)
    assert second.fence > first.fence
    assert second.timestamp_s > first.timestamp_s
    assert first.headers["webhook-signature"] != second.headers["webhook-signature"]
    assert [r["result"]["http_status"] for r in runs] == [503, 200]
    assert "503" in runs[0]["error"]


def test_a_429_with_retry_after_2_is_retried_no_sooner_than_2_s(env: Env) -> None:
    env.receiver.script("/limited", Reply(status=429, headers=(("Retry-After", "2"),)), Reply())
    job = env.submit("/limited")
    first, second = env.receiver.wait_requests("/limited", 2, 20)
    env.wait_states(job, ["failed", "succeeded"])
    # The backoff alone is at most 500 ms.
    assert second.received_ms - first.received_ms >= 2_000
    assert first.webhook_id == second.webhook_id


def test_a_404_is_dead_lettered_at_once(env: Env) -> None:
    env.receiver.script("/missing", *[Reply(status=404, body=b"no such hook")] * 5)
    job = env.submit("/missing", "--max-attempts", "5")
    (run,) = env.wait_states(job, ["dead_lettered"])
    assert run["attempt"] == 1 and "404" in run["error"]
    assert (run["result"]["http_status"], run["result"]["response_excerpt"]) == (
        404,
        "no such hook",
    )
    letters = json.loads(env.ctl("dlq", "list", "--job", str(job), "--json"))
    assert [(d["run_id"], d["state"]) for d in letters] == [(run["run_id"], "dead_lettered")]
    # No retry comes (one would within the 500 ms backoff).
    with pytest.raises(AssertionError):
        env.receiver.wait_requests("/missing", 2, 1.5)


def test_a_hung_endpoint_times_out_and_is_retried(env: Env) -> None:
    env.receiver.script("/hung", Reply(delay_s=8), Reply())
    job = env.submit("/hung", "--http-timeout", "1s")
    first, second = env.receiver.wait_requests("/hung", 2, 20)
    runs = env.wait_states(job, ["failed", "succeeded"])
    assert "timed out" in runs[0]["error"], runs[0]["error"]
    assert second.received_ms - first.received_ms >= 1_000
    assert (first.webhook_id, first.attempt, second.attempt) == (second.webhook_id, 1, 2)


def test_a_worker_killed_mid_request_leaves_the_fire_to_another_under_a_higher_fence(
    env: Env,
) -> None:
    pool = ("--pool", "killed")
    doomed = env.worker("kill-1", "--allow-private-targets", *pool)
    env.receiver.script("/held", Reply(hold=True), Reply())
    job = env.submit("/held", *pool)
    first = one_request(env, "/held")
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait(10)
    env.worker("kill-2", "--allow-private-targets", *pool)
    # Handed out again once the dead worker's lease ran out.
    _, second = env.receiver.wait_requests("/held", 2, LEASE_MS / 1000 + 15)
    env.receiver.release()
    runs = env.wait_states(job, ["lost", "succeeded"])
    assert first.verified and second.verified, (first.verify_error, second.verify_error)
    assert second.webhook_id == first.webhook_id
    assert second.fence > first.fence
    assert (second.fence, second.attempt) == (runs[1]["fence"], runs[1]["attempt"])
    assert second.timestamp_s >= first.timestamp_s


def test_a_target_on_loopback_is_refused_by_a_worker_not_allowed_private_targets(
    env: Env,
) -> None:
    pool = ("--pool", "strict")
    env.worker("strict-1", *pool)
    by_ip = env.submit("/private", *pool, "--max-attempts", "3")
    # A name that resolves to 127.0.0.1 is checked after resolution.
    url = env.receiver.url("/private").replace("127.0.0.1", "localhost")
    out = env.ctl(
        "submit", "--name", "by-name", "--http-url", url, "--at", "+0s", "--json",
        "--max-attempts", "3", *QUICK_RETRY, *pool,
    )  # fmt: skip
    by_name = int(json.loads(out)["job_id"])
    env.jobs.append(by_name)
    for job in (by_ip, by_name):
        (run,) = env.wait_states(job, ["dead_lettered"])
        error = run["error"]
        # Why: the address it resolved to, and the flag that would allow it.
        assert "--allow-private-targets" in error, error
        assert "127.0.0.1" in error or "::1" in error, error
    assert env.receiver.requests("/private") == []


def test_a_rotated_secret_signs_with_the_old_and_the_new_version_during_the_overlap(
    env: Env,
) -> None:
    printed = env.ctl("secret", "rotate", SECRET, "--generate", keep=False)
    (new,) = re.findall(r"whsec_[A-Za-z0-9+/=]+", printed)
    assert new != env.secret
    env.rotated.append(new)
    env.submit("/rotated")
    r = one_request(env, "/rotated")
    assert len(r.headers["webhook-signature"].split(" ")) == 2
    # Each version alone verifies it: a receiver may move to the new one at
    # any time in the overlap.
    for secret in (env.secret, new):
        Webhook(secret).verify(r.body, r.headers, json_parse=False)
    versions = [s["version"] for s in json.loads(env.ctl("secret", "list", "--json"))]
    assert sorted(versions) == [1, 2]


def test_the_secrets_value_is_in_no_log_listing_or_console_answer(env: Env) -> None:
    """Last: it reads what the tests before it left."""
    if not env.jobs:
        env.submit("/signed")
    listed = json.loads(env.ctl("secret", "list", "--json"))
    assert SECRET in json.dumps(listed)
    env.ctl("jobs", "--json")
    for job in env.jobs:
        env.ctl("job", str(job), "--json")
        env.ctl("runs", str(job), "--json", "--all")
        for path in (f"/api/jobs/{job}", f"/api/jobs/{job}/runs"):
            answer = call(env.node.url + path)
            assert answer.status == 200, (path, answer.body)
            env.answers.append((path, json.dumps(answer.body)))
    answer = call(env.node.url + "/api/jobs")
    env.answers.append(("/api/jobs", json.dumps(answer.body)))
    env.answers.append(
        ("/api/dead-letters", json.dumps(call(env.node.url + "/api/dead-letters").body))
    )
    logs = sorted(env.root.rglob("*.log"))
    assert any(p.name.startswith("server-") for p in logs) and any(
        p.name == "http-1.log" for p in logs
    )
    values = [env.secret, *env.rotated]
    for where, text in [*env.answers, *((str(p), p.read_text(errors="replace")) for p in logs)]:
        for value in values:
            assert value not in text and value.removeprefix("whsec_") not in text, where
    # The signatures the receiver checked were made with it all along.
    assert env.receiver.tally.verified > 0
    assert env.receiver.tally.bad_signatures == 0
