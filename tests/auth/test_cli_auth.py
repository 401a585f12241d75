"""wheelctl against a real node process run with --auth: the first admin
token, token create/list/revoke and tenant set/list."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.services import free_port


def wheelctl(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "WHEEL_TOKEN"}
    if token is not None:
        env["WHEEL_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "wheel", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    token_file = tmp_path / "admin.token"
    log = open(tmp_path / "node.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wheel",
            "serve",
            "--auth",
            "--init-admin-token",
            str(token_file),
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    target = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "node.log").read_text()
            if token_file.exists() and token_file.read_text().strip():
                probe = wheelctl("status", "--target", target, token=token_file.read_text().strip())
                if probe.returncode == 0:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError("the node did not start")
        yield target, token_file
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.mark.slow
def test_tokens_and_tenants_through_wheelctl(node: tuple[str, Path]) -> None:
    target, token_file = node
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    admin = token_file.read_text().strip()

    # Without a token, and with a bad one: refused, never a crash.
    refused = wheelctl("jobs", "--target", target)
    assert refused.returncode == 2 and "authorization: missing bearer token" in refused.stderr
    assert wheelctl("jobs", "--target", target, "--token", "nope").returncode == 2

    made = wheelctl(
        "token", "create", "--target", target, "--tenant", "acme",
        "--scope", "jobs:read", "--scope", "jobs:write", "--ttl", "30d", token=admin,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    acme = made.stdout.strip()
    assert made.stdout == acme + "\n" and acme.startswith("wheel_")  # the token alone

    sub = wheelctl(
        "submit", "--target", target, "--name", "n", "--handler", "h", "--at", "+1h",
        "--tenant", "beta", "--json", token=acme,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    jobs = wheelctl("jobs", "--target", target, "--token", acme)
    assert jobs.returncode == 0 and " n " in jobs.stdout

    listed = wheelctl("token", "list", "--target", target, token=admin)
    token_id = acme.split("_")[1]
    assert listed.returncode == 0 and token_id in listed.stdout and acme not in listed.stdout
    as_json = wheelctl("token", "list", "--target", target, "--json", token=admin)
    [mine] = [t for t in json.loads(as_json.stdout) if t["token_id"] == token_id]
    assert (mine["tenant"], mine["scopes"], mine["revoked_at_ms"]) == (
        "acme", ["jobs:read", "jobs:write"], None,
    )  # fmt: skip
    assert acme not in as_json.stdout
    # A tenant's token is no admin's.
    assert wheelctl("token", "list", "--target", target, token=acme).returncode == 2

    revoked = wheelctl("token", "revoke", token_id, "--target", target, token=admin)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    after = wheelctl("jobs", "--target", target, token=acme)
    assert after.returncode == 2 and "revoked" in after.stderr

    bad = wheelctl(
        "token", "create", "--target", target, "--tenant", "acme", "--scope", "worker",
        token=admin,
    )  # fmt: skip
    assert bad.returncode == 2 and "worker_id" in bad.stderr

    quota = wheelctl(
        "tenant", "set", "acme", "--max-jobs", "3", "--fires-per-s", "2.5",
        "--target", target, token=admin,
    )  # fmt: skip
    assert quota.returncode == 0, quota.stderr
    wheelctl("tenant", "set", "acme", "--max-in-flight", "4", "--target", target, token=admin)
    shown = wheelctl("tenant", "list", "--target", target, token=admin)
    assert shown.returncode == 0
    assert "acme" in shown.stdout and "max_jobs 3" in shown.stdout
    assert "fires_per_s 2.5" in shown.stdout and "max_in_flight 4" in shown.stdout
    assert "submits_per_s unlimited" in shown.stdout
    shown_json = wheelctl("tenant", "list", "--target", target, "--json", token=admin)
    assert json.loads(shown_json.stdout) == [
        {"tenant": "acme", "max_jobs": 3, "submits_per_s": None, "fires_per_s": 2.5,
         "max_in_flight": 4},
    ]  # fmt: skip
