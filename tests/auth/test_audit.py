"""The audit trail of a real node process run with --auth: each
administrative change made through wheelctl is listed by ``wheelctl audit``
with the token that made it, the address it came from, the tenant and what
changed; a secret's value and a token's secret never appear; entries filter
by job, time and tenant, and only an operator's token reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.auth.test_cli_auth import node, wheelctl  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def ok(*args: str, token: str) -> str:
    done = wheelctl(*args, token=token)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


def audit(target: str, token: str, *flags: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(
        ok("audit", "--target", target, "--json", *flags, token=token)
    )
    return entries


def test_every_administrative_change_is_listed_with_who_and_from_where(
    node: tuple[str, Path],  # noqa: F811 - the fixture imported above
) -> None:
    target, token_file = node
    admin = token_file.read_text().strip()
    acme = ok(
        "token", "create", "--target", target, "--tenant", "acme", "--scope", "jobs:read",
        "--scope", "jobs:write", "--label", "acme-app", token=admin,
    ).strip()  # fmt: skip
    acme_id = acme.split("_")[1]
    submitted = ok(
        "submit", "--target", target, "--name", "nightly", "--handler", "h",
        "--cron", "0 3 * * *", "--json", token=acme,
    )  # fmt: skip
    job = json.loads(submitted)["job_id"]
    for command in ("pause", "resume"):
        ok(command, str(job), "--target", target, token=acme)
    ok("update", str(job), "--target", target, "--payload", "v2", "--max-attempts", "3", token=acme)
    secret = ok(
        "secret", "set", "stripe", "--tenant", "acme", "--generate", "--target", target,
        token=admin,
    )  # fmt: skip
    value = next(w for w in secret.split() if w.startswith("whsec_"))
    ok("tenant", "set", "acme", "--max-jobs", "10", "--target", target, token=admin)
    ok("calendar", "set", "holidays", "--date", "2026-12-25", "--target", target, token=acme)
    ok("limit", "set", "db", "--max-concurrent", "2", "--target", target, token=acme)
    ok("cancel", str(job), "--target", target, token=acme)
    ok("token", "revoke", acme_id, "--target", target, token=admin)

    entries = audit(target, admin)
    assert [e["action"] for e in entries] == [
        "RevokeToken", "CancelJob", "SetLimit", "SetCalendar", "SetTenantQuota", "SetSecret",
        "UpdateJob", "ResumeJob", "PauseJob", "CreateToken",
    ]  # fmt: skip
    by = {e["action"]: e for e in entries}
    admin_id = admin.split("_")[1]
    pause = by["PauseJob"]
    assert (pause["actor"], pause["tenant"], pause["target"], pause["job_id"]) == (
        f"token {acme_id}",
        "acme",
        f"job {job}",
        job,
    )
    assert pause["details"] == {"state": "paused"}
    assert all(e["address"].startswith(("ipv4:127.0.0.1:", "ipv6:")) for e in entries), entries
    assert entries == sorted(entries, key=lambda e: -e["entry_id"])
    assert by["UpdateJob"]["details"]["fields"] == ["payload", "retry"]
    assert by["UpdateJob"]["details"]["payload_changed"] is True
    assert by["CreateToken"]["actor"] == f"token {admin_id}"
    assert by["CreateToken"]["target"] == f"token {acme_id}"
    assert by["CreateToken"]["details"]["label"] == "acme-app"
    assert by["SetSecret"]["target"] == "secret stripe"
    assert by["SetSecret"]["details"] == {"generated": True, "version": 1}
    assert by["SetTenantQuota"]["details"]["max_jobs"] == 10
    assert (by["SetLimit"]["target"], by["SetLimit"]["details"]["max_concurrent"]) == (
        "limit db",
        2,
    )
    assert (by["SetCalendar"]["target"], by["SetCalendar"]["tenant"]) == (
        "calendar holidays",
        "acme",
    )
    # Never a secret's value nor a token's secret, in any form.
    text = ok("audit", "--target", target, token=admin)
    raw = json.dumps(entries)
    for leaked in (value, value.removeprefix("whsec_"), acme, acme.split("_")[-1]):
        assert leaked not in raw and leaked not in text
    assert "PauseJob" in text and f"token {acme_id}" in text

    # Filters: a job's entries, and a window of time.
    assert [e["action"] for e in audit(target, admin, "--job", str(job))] == [
        "CancelJob", "UpdateJob", "ResumeJob", "PauseJob",
    ]  # fmt: skip
    assert len(audit(target, admin, "--since", "1h")) == len(entries)
    assert audit(target, admin, "--limit", "2") == entries[:2]

    # By tenant (every entry here is acme's); and only an operator reads it.
    assert audit(target, admin, "--tenant", "acme") == entries
    assert audit(target, admin, "--tenant", "beta") == []
    reader = ok(
        "token", "create", "--target", target, "--tenant", "acme", "--scope", "jobs:read",
        token=admin,
    ).strip()  # fmt: skip
    refused = wheelctl("audit", "--target", target, token=reader)
    assert refused.returncode == 2 and "scope 'admin'" in refused.stderr
