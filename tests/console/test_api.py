"""The console's JSON API over real HTTP to a real node process: pages and
cursors, filters, the API's own auth and tenancy, and the read-only rule."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from testkit.procs import WorkerProc, wait_for
from tests.console.http import Answer, ConsoleNode, call
from wheel.client import Client, HttpTarget, JobState
from wheel.errors import InvalidArgument

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleNode]:
    """One read-only console with auth on, shared by the module's tests."""
    tmp = tmp_path_factory.mktemp("console-api")
    admin_file = tmp / "admin.token"
    server = ConsoleNode(tmp / "data", args=("--auth", "--init-admin-token", str(admin_file)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tokens(node: ConsoleNode) -> dict[str, str]:
    admin = (node.data_dir.parent / "admin.token").read_text().strip()
    with Client(node.target, token=admin) as client:
        acme, _ = client.create_token(tenant="acme", scopes=["jobs:read", "jobs:write"])
        globex, _ = client.create_token(tenant="globex", scopes=["jobs:read", "jobs:write"])
    return {"admin": admin, "acme": acme, "globex": globex}


@pytest.fixture(scope="module")
def acme_jobs(node: ConsoleNode, tokens: dict[str, str]) -> dict[str, int]:
    """acme's jobs by name (one paused) and one of globex's."""
    names = ["batch-3", "batch-1", "report", "batch-2", "batch-0", "batch-4"]
    out: dict[str, int] = {}
    with Client(node.target, token=tokens["acme"]) as client:
        for name in names:
            priority = 0 if name == "report" else 5
            every = timedelta(hours=1)
            out[name] = client.submit(name=name, handler="h", every=every, priority=priority).job_id
        client.pause(out["batch-2"])
    with Client(node.target, token=tokens["globex"]) as client:
        out["globex"] = client.submit(name="batch-9", handler="h", every=timedelta(hours=1)).job_id
    return out


def jobs(node: ConsoleNode, token: str, **query: Any) -> Answer:
    return call(f"{node.url}/api/jobs?{urlencode(query)}", token=token)


def test_a_call_without_a_token_is_401_before_the_node_is_asked(node: ConsoleNode) -> None:
    answer = call(f"{node.url}/api/jobs")
    assert answer.status == 401
    assert "bearer token" in answer.body["error"]
    config = call(f"{node.url}/api/config")  # what the page needs to ask for one
    assert (config.status, config.body["auth"], config.body["actions"]) == (200, True, False)


def test_a_token_the_node_does_not_know_is_401_from_the_api(node: ConsoleNode) -> None:
    answer = call(f"{node.url}/api/jobs", token="wheel_not-a-token")
    assert answer.status == 401
    assert answer.body["error"]


def test_jobs_come_in_pages_whose_cursor_leads_to_the_next(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    seen: list[str] = []
    token = ""
    for _ in range(10):
        answer = jobs(node, tokens["acme"], page_size=2, page_token=token)
        assert answer.status == 200, answer.body
        assert len(answer.body["jobs"]) <= 2
        seen += [j["job_id"] for j in answer.body["jobs"]]
        token = answer.body["next_page_token"]
        if not token:
            break
    mine = [v for k, v in acme_jobs.items() if k != "globex"]
    assert seen == [str(i) for i in sorted(mine)]


def test_a_name_search_pages_by_name_and_combines_with_a_state_filter(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    names: list[str] = []
    token = ""
    while True:
        answer = jobs(node, tokens["acme"], name="batch-", page_size=2, page_token=token)
        assert answer.status == 200, answer.body
        names += [j["name"] for j in answer.body["jobs"]]
        token = answer.body["next_page_token"]
        if not token:
            break
    # acme's only: globex's batch-9 is not among them.
    assert names == ["batch-0", "batch-1", "batch-2", "batch-3", "batch-4"]
    paused = jobs(node, tokens["acme"], name="batch", state="paused").body["jobs"]
    assert [(j["name"], j["state"]) for j in paused] == [("batch-2", "paused")]
    assert jobs(node, tokens["acme"], name="nothing-like-it").body["jobs"] == []


def test_an_operator_filters_by_tenant_and_a_tenant_sees_only_its_own(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    listed = jobs(node, tokens["admin"], tenant="globex").body["jobs"]
    assert [(j["job_id"], j["tenant"]) for j in listed] == [(str(acme_jobs["globex"]), "globex")]
    theirs = jobs(node, tokens["globex"]).body["jobs"]
    assert {j["tenant"] for j in theirs} == {"globex"}
    # Another tenant's job is not found, as the API says.
    answer = call(f"{node.url}/api/jobs/{acme_jobs['report']}", token=tokens["globex"])
    assert answer.status == 404
    answer = call(f"{node.url}/api/jobs/{acme_jobs['report']}/runs", token=tokens["globex"])
    assert answer.status == 404


def test_a_job_shows_its_spec_and_next_fires(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    answer = call(f"{node.url}/api/jobs/{acme_jobs['report']}?next_fires=3", token=tokens["acme"])
    assert answer.status == 200, answer.body
    job = answer.body
    assert (job["name"], job["tenant"], job["state"]) == ("report", "acme", "active")
    assert job["schedule_text"] == "every 3600s (fixed rate)"
    fires = [f["ms"] for f in job["next_fires"]]
    assert len(fires) == 3 and [b - a for a, b in pairwise(fires)] == [3_600_000] * 2
    # Every time in one form: ISO 8601 in UTC with Z and milliseconds.
    for t in [*job["next_fires"], job["created_at"], job["updated_at"]]:
        utc = datetime.fromtimestamp(t["ms"] / 1000, UTC)
        assert t["iso"] == utc.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def test_a_jobs_priority_is_in_its_spec_and_its_list_row(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    report = call(f"{node.url}/api/jobs/{acme_jobs['report']}", token=tokens["acme"]).body
    assert report["priority"] == 0
    rows = {r["name"]: r for r in jobs(node, tokens["acme"], name="report").body["jobs"]}
    assert rows["report"]["priority"] == 0
    [batch] = jobs(node, tokens["acme"], name="batch-1").body["jobs"]
    assert batch["priority"] == 5


def test_actions_on_a_read_only_console_are_refused_with_403_and_change_nothing(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    job_id = acme_jobs["report"]
    for path in (f"/api/jobs/{job_id}/pause", f"/api/jobs/{job_id}/dead-letters/redrive"):
        answer = call(f"{node.url}{path}", token=tokens["acme"], method="POST", body={})
        assert answer.status == 403, (path, answer.body)
        assert "read-only" in answer.body["error"] and "--console-actions" in answer.body["error"]
    with Client(node.target, token=tokens["acme"]) as client:
        assert client.get(job_id).state is JobState.ACTIVE
    # A method the API has no route for is 405, in JSON too.
    dead = call(f"{node.url}/api/dead-letters", token=tokens["acme"]).body
    assert (dead["runs"], dead["redrive"]) == ([], False)
    answer = call(f"{node.url}/api/jobs", token=tokens["acme"], method="DELETE")
    assert answer.status == 405
    assert answer.body["status"] == 405


def test_bad_query_values_are_400_naming_the_field(
    node: ConsoleNode, tokens: dict[str, str]
) -> None:
    for query, field in (
        ({"page_size": 0}, "page_size"),
        ({"page_size": "ten"}, "page_size"),
        ({"state": "sleeping"}, "state"),
        ({"page_token": "not-a-token"}, "page_token"),
        ({"name": "x" * 201}, "name_prefix"),
    ):
        answer = jobs(node, tokens["acme"], **query)
        assert answer.status == 400, (query, answer.body)
        assert field in answer.body["error"], answer.body
    answer = call(f"{node.url}/api/jobs/abc", token=tokens["acme"])
    assert (answer.status, "job_id" in answer.body["error"]) == (400, True)


def test_the_node_panels_need_the_admin_scope_the_api_asks_for(
    node: ConsoleNode, tokens: dict[str, str]
) -> None:
    for path in ("/api/lag", "/api/in-flight", "/api/workers", "/api/cluster"):
        answer = call(f"{node.url}{path}", token=tokens["acme"])
        assert answer.status == 403, (path, answer.body)
        assert "admin" in answer.body["error"]
        assert call(f"{node.url}{path}", token=tokens["admin"]).status == 200, path
    lag = call(f"{node.url}/api/lag", token=tokens["admin"]).body["minutes"]
    assert len(lag) == 60
    starts = [m["minute"]["ms"] for m in lag]
    assert all(b - a == 60_000 for a, b in pairwise(starts))
    cluster = call(f"{node.url}/api/cluster", token=tokens["admin"]).body
    assert len(cluster["shard_owners"]) == 256 and set(cluster["shard_owners"]) == {"node-1"}
    assert [m["node_id"] for m in cluster["members"]] == ["node-1"]


def test_the_page_and_its_assets_are_served_with_a_strict_policy(node: ConsoleNode) -> None:
    page = call(f"{node.url}/")
    assert page.status == 200 and "/static/console.js" in page.body
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    for name in ("console.js", "console.css"):
        assert call(f"{node.url}/static/{name}").status == 200
    assert call(f"{node.url}/static/secret.txt").status == 404


@pytest.fixture(scope="module")
def acting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleNode]:
    """A console with actions on (no auth: loopback only)."""
    server = ConsoleNode(
        tmp_path_factory.mktemp("console-act") / "data", args=("--console-actions",)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_with_actions_on_a_pause_goes_through_the_api(acting: ConsoleNode) -> None:
    with Client(acting.target) as client:
        job_id = client.submit(name="acted", handler="h", every=timedelta(hours=1)).job_id
    url = f"{acting.url}/api/jobs/{job_id}/pause"
    # Not JSON: what a form from another site would send. Refused.
    answer = call(url, method="POST", body={}, content_type="text/plain")
    assert answer.status == 415
    answer = call(url, method="POST", body={})
    assert answer.status == 200, answer.body
    assert answer.body["state"] == "paused"
    with Client(acting.target) as client:
        assert client.get(job_id).state is JobState.PAUSED
    assert call(f"{acting.url}/api/config").body["actions"] is True


def test_a_job_with_an_http_target_shows_it_in_the_list_and_in_its_spec(
    acting: ConsoleNode,
) -> None:
    target = HttpTarget("https://hooks.example.com/x", headers={"X-Team": "ops"}, timeout=5)
    with Client(acting.target) as client:
        job_id = client.submit(
            name="hooked", every=timedelta(hours=1), http=target, payload=b"body"
        ).job_id
    job = call(f"{acting.url}/api/jobs/{job_id}").body
    assert job["handler"] == "http" and job["payload"]["text"] == "body"
    assert job["http"] == {
        "url": "https://hooks.example.com/x",
        "method": "POST",
        "headers": {"X-Team": "ops"},
        "timeout": 5.0,
        "signing_secret": None,
        "retry_4xx": False,
        "follow_redirects": False,
    }
    rows = call(f"{acting.url}/api/jobs?name=hooked").body["jobs"]
    assert [(r["job_id"], r["http_url"]) for r in rows] == [
        (str(job_id), "https://hooks.example.com/x")
    ]


def test_with_actions_on_a_dead_letter_is_listed_and_redriven_as_a_new_attempt(
    acting: ConsoleNode, tmp_path: Path
) -> None:
    worker = WorkerProc(acting.target, tmp_path / "runs.txt", "act-w", "e2e_handlers:scripted")
    try:
        with Client(acting.target) as client:
            job_id = client.submit(
                name="doomed",
                handler="scripted",
                at=timedelta(0),
                payload={"permanent": True},
                retry=1,
            ).job_id
            wait_for(
                lambda: list(client.runs(job_id, states=["dead_lettered"])), 30, "a dead letter"
            )
        listed = call(f"{acting.url}/api/dead-letters").body
        [dead] = [r for r in listed["runs"] if r["job_id"] == str(job_id)]
        assert listed["redrive"] is True
        assert "scripted permanent failure" in dead["error"]
        assert dead["attempt"] == 1  # attempts count from 1
        assert call(f"{acting.url}/api/jobs/{job_id}/dead-letters").body["runs"] == [dead]
        # The one-shot whose only fire was dead-lettered is failed, and listed so.
        assert call(f"{acting.url}/api/jobs/{job_id}").body["state"] == "failed"
        failed = call(f"{acting.url}/api/jobs?state=failed").body["jobs"]
        assert str(job_id) in {j["job_id"] for j in failed}
        bad = call(
            f"{acting.url}/api/jobs/{job_id}/dead-letters/redrive",
            method="POST",
            body={"run_id": "x"},
        )
        assert bad.status == 400 and "run_id" in bad.body["error"]
        answer = call(
            f"{acting.url}/api/jobs/{job_id}/dead-letters/redrive",
            method="POST",
            body={"run_id": dead["run_id"]},
        )
        assert answer.status == 200, answer.body
        [again] = answer.body["runs"]
        assert again["scheduled_for"] == dead["scheduled_for"]
        assert int(again["fence"]) > int(dead["fence"]) and again["run_id"] != dead["run_id"]
        assert again["attempt"] == 2
        with Client(acting.target) as client:
            wait_for(
                lambda: len(list(client.runs(job_id, states=["dead_lettered"]))) == 2,
                30,
                "the redriven attempt to end (it fails for good again)",
            )
    finally:
        worker.stop()


def test_the_sync_client_pages_searches_and_reads_the_node_panels(
    node: ConsoleNode, tokens: dict[str, str], acme_jobs: dict[str, int]
) -> None:
    with Client(node.target, token=tokens["acme"]) as client:
        assert [j.name for j in client.jobs(name_prefix="batch-", page_size=2)] == [
            f"batch-{i}" for i in range(5)
        ]
        first = client.jobs_page(page_size=4)
        assert len(first.items) == 4 and first.next_page_token
        rest = client.jobs_page(page_size=4, page_token=first.next_page_token)
        assert [j.job_id for j in first.items + rest.items] == sorted(
            v for k, v in acme_jobs.items() if k != "globex"
        )
        assert rest.next_page_token == ""
        runs = client.runs_page(acme_jobs["report"], page_size=10)
        assert (runs.items, runs.next_page_token) == ([], "")
    with Client(node.target, token=tokens["admin"]) as client:
        minutes = client.lag_history()
        assert len(minutes) == 60 and minutes[0].minute < minutes[-1].minute
        held = client.in_flight(limit=10)
        assert (held.runs, held.total) == ([], 0)
        with pytest.raises(InvalidArgument, match="limit"):
            client.in_flight(limit=5_000)


def test_a_job_shows_the_calendars_it_skips(node: ConsoleNode, tokens: dict[str, str]) -> None:
    with Client(node.target, token=tokens["acme"]) as client:
        client.set_calendar("weekend", weekdays=["sat", "sun"])
        job_id = client.submit(
            name="weekdays", handler="h", cron="0 9 * * *", skip_calendars=["weekend"]
        ).job_id
    answer = call(f"{node.url}/api/jobs/{job_id}?next_fires=5", token=tokens["acme"])
    assert answer.status == 200, answer.body
    assert answer.body["skip_calendars"] == ["weekend"]
    days = [
        datetime.fromtimestamp(f["ms"] / 1000, UTC).weekday() for f in answer.body["next_fires"]
    ]
    assert len(days) == 5 and not {5, 6} & set(days)


def test_limits_show_each_tenant_its_own_keys_with_runs_in_flight_and_waiting(
    node: ConsoleNode, tokens: dict[str, str]
) -> None:
    with Client(node.target, token=tokens["acme"]) as client:
        client.set_limit("db", max_concurrent=2, rate=5)
    with Client(node.target, token=tokens["globex"]) as client:
        client.set_limit("api", max_concurrent=1)
    answer = call(f"{node.url}/api/limits", token=tokens["acme"])
    assert answer.status == 200
    assert answer.body["limits"] == [
        {
            "tenant": "acme", "key": "db", "max_concurrent": 2, "rate": 5,
            "rate_period_ms": 1000, "burst": 5, "in_flight": 0, "waiting": 0,
        }
    ]  # fmt: skip
    every = call(f"{node.url}/api/limits", token=tokens["admin"]).body["limits"]
    assert [(x["tenant"], x["key"]) for x in every] == [("acme", "db"), ("globex", "api")]
