"""The overview's JSON API and its gRPC calls over a real node with a real
worker and auth: jobs by state and runs by outcome (succeeded, failed,
dead-lettered, missed) for the tenant of the token only, the feed of recent
runs with its filters and pages, a job's history at a glance, and bad
requests refused naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from testkit.procs import WorkerProc, wait_for
from tests.conftest import epoch_ms
from tests.console.http import ConsoleNode, call
from wheel.client import Client, Retry, RunState
from wheel.errors import InvalidArgument, NotFound

pytestmark = pytest.mark.slow


@dataclass(frozen=True, slots=True, kw_only=True)
class Scene:
    node: ConsoleNode
    tokens: dict[str, str]
    jobs: dict[str, int]


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """acme's runs of every outcome and globex's one success, run by a real
    worker (auth on; read-only console)."""
    tmp = tmp_path_factory.mktemp("overview-api")
    node = ConsoleNode(tmp / "data", args=("--auth", "--init-admin-token", str(tmp / "admin")))
    node.start()
    worker = None
    try:
        admin = (tmp / "admin").read_text().strip()
        with Client(node.target, token=admin) as client:
            acme, _ = client.create_token(tenant="acme", scopes=["jobs:read", "jobs:write"])
            globex, _ = client.create_token(tenant="globex", scopes=["jobs:read", "jobs:write"])
            runner, _ = client.create_token(tenant="*", scopes=["worker"], worker_id="ov-w")
        worker = WorkerProc(
            node.target,
            tmp / "runs.txt",
            "ov-w",
            "e2e_handlers:slow",
            "e2e_handlers:scripted",
            env={"WHEEL_TOKEN": runner},
        )
        jobs: dict[str, int] = {}
        with Client(node.target, token=acme) as client:
            jobs["doomed"] = client.submit(
                name="doomed",
                handler="scripted",
                at=timedelta(0),
                payload={"permanent": True},
                retry=1,
            ).job_id
            jobs["flaky"] = client.submit(
                name="flaky",
                handler="scripted",
                at=timedelta(0),
                payload={"fail": 1},
                retry=Retry(max_attempts=2, initial_backoff=timedelta(milliseconds=100)),
            ).job_id
            # Every second, running 1.6 s: overlapping fires are missed.
            jobs["overlap"] = client.submit(
                name="overlap", handler="slow", every=timedelta(seconds=1)
            ).job_id

            def done() -> bool:
                runs = list(client.runs(jobs["overlap"]))
                return (
                    any(r.state == "succeeded" for r in runs)
                    and any(r.state == "missed" for r in runs)
                    and bool(list(client.runs(jobs["doomed"], states=["dead_lettered"])))
                    and bool(list(client.runs(jobs["flaky"], states=["succeeded"])))
                )

            wait_for(done, 40, "acme's runs of every outcome")
            client.pause(jobs["overlap"])
        with Client(node.target, token=globex) as client:
            jobs["globex"] = client.submit(
                name="mailer", handler="scripted", at=timedelta(0)
            ).job_id
            wait_for(
                lambda: list(client.runs(jobs["globex"], states=["succeeded"])), 30, "globex's run"
            )
        yield Scene(node=node, tokens={"admin": admin, "acme": acme, "globex": globex}, jobs=jobs)
    finally:
        if worker is not None:
            worker.stop()
        node.stop()


def api(scene: Scene, who: str, path: str, **query: Any) -> Any:
    answer = call(f"{scene.node.url}{path}?{urlencode(query)}", token=scene.tokens[who])
    assert answer.status == 200, answer.body
    return answer.body


def test_the_overview_counts_a_tenants_own_jobs_and_runs_by_outcome(scene: Scene) -> None:
    acme = api(scene, "acme", "/api/overview")
    assert acme["window"] == "hour" and acme["bucket_ms"] == 60_000
    assert acme["jobs"]["paused"] == 1 and acme["jobs_total"] == 3
    totals = acme["totals"]
    assert totals["succeeded"] >= 2 and totals["failed"] >= 1
    assert totals["dead_lettered"] == 1 and totals["missed"] >= 1
    assert len(acme["bucket_starts_ms"]) in (60, 61)
    for series in acme["runs"].values():
        assert len(series) == len(acme["bucket_starts_ms"])

    globex = api(scene, "globex", "/api/overview", window="day")
    assert globex["bucket_ms"] == 15 * 60_000
    assert globex["jobs"] == {"completed": 1} and globex["jobs_total"] == 1
    assert globex["totals"]["succeeded"] == 1
    assert globex["totals"]["failed"] == globex["totals"]["dead_lettered"] == 0
    # A tenant naming another tenant still sees its own.
    assert api(scene, "globex", "/api/overview", tenant="acme")["jobs_total"] == 1
    everyone = api(scene, "admin", "/api/overview")
    assert everyone["jobs_total"] == 4
    assert everyone["totals"]["succeeded"] >= totals["succeeded"] + 1
    assert api(scene, "admin", "/api/overview", tenant="globex")["jobs_total"] == 1


def test_the_feed_lists_runs_across_jobs_newest_first_with_filters_and_pages(
    scene: Scene,
) -> None:
    runs = api(scene, "acme", "/api/runs", page_size=500)["runs"]
    assert {r["tenant"] for r in runs} == {"acme"}
    ids = [int(r["run_id"]) for r in runs]
    assert ids == sorted(ids, reverse=True)
    assert {r["job_name"] for r in runs} == {"doomed", "flaky", "overlap"}

    failed = api(scene, "acme", "/api/runs", outcome="failed")["runs"]
    assert [(r["job_name"], r["job_id"]) for r in failed] == [("flaky", str(scene.jobs["flaky"]))]
    assert "scripted failure of attempt 1" in failed[0]["error"]
    dead = api(scene, "acme", "/api/runs", outcome="dead_lettered")["runs"]
    assert [r["job_name"] for r in dead] == ["doomed"]
    assert "scripted permanent failure" in dead[0]["error"]
    slow = api(scene, "acme", "/api/runs", handler="slow")["runs"]
    assert slow and {r["job_name"] for r in slow} == {"overlap"}
    assert {r["job_name"] for r in api(scene, "acme", "/api/runs", job="fl")["runs"]} == {"flaky"}

    first = api(scene, "acme", "/api/runs", page_size=2)
    assert len(first["runs"]) == 2 and first["next_page_token"]
    rest = api(scene, "acme", "/api/runs", page_size=500, page_token=first["next_page_token"])
    assert [r["run_id"] for r in first["runs"] + rest["runs"]] == [r["run_id"] for r in runs]

    # Another tenant's runs are not listed, whatever the request names.
    theirs = api(scene, "globex", "/api/runs", tenant="acme")["runs"]
    assert [r["job_name"] for r in theirs] == ["mailer"]
    operator = api(scene, "admin", "/api/runs", tenant="globex")["runs"]
    assert [r["job_name"] for r in operator] == ["mailer"]


def test_a_jobs_history_shows_its_fires_missed_ones_and_its_day(scene: Scene) -> None:
    overlap = scene.jobs["overlap"]
    got = api(scene, "acme", f"/api/jobs/{overlap}/history")
    fires = got["fires"]
    states = {f["state"] for f in fires}
    assert "succeeded" in states and "missed" in states
    # Each missed fire with the reason the store recorded (the runs listing's):
    # overlap, for fires due while a run went on; on a loaded machine another
    # may come too (paused, for a fire due as the scene paused the job).
    missed = {f["scheduled_for"]["ms"]: f["missed_reason"] for f in fires if f["state"] == "missed"}
    with Client(scene.node.target, token=scene.tokens["acme"]) as client:
        listed = {
            epoch_ms(r.scheduled_for): str(r.missed_reason)
            for r in client.runs(overlap, states=["missed"])
        }
    assert missed and missed == {ms: listed[ms] for ms in missed}
    assert "overlap" in missed.values()
    times = [f["scheduled_for"]["ms"] for f in fires]
    assert times == sorted(times)  # oldest first: the strip reads left to right
    assert got["runs"] >= 1 and got["success_rate"] == 1.0
    assert got["p50_ms"] >= 1_000 and got["p99_ms"] >= got["p50_ms"]

    flaky = api(scene, "acme", f"/api/jobs/{scene.jobs['flaky']}/history")
    [fire] = flaky["fires"]
    assert (fire["state"], fire["attempt"]) == ("succeeded", 2)
    assert (flaky["runs"], flaky["succeeded"]) == (2, 1)

    hidden = call(f"{scene.node.url}/api/jobs/{overlap}/history", token=scene.tokens["globex"])
    assert hidden.status == 404


def test_the_grpc_calls_scope_by_tenant_and_refuse_bad_requests_naming_the_field(
    scene: Scene,
) -> None:
    with Client(scene.node.target, token=scene.tokens["globex"]) as client:
        seen = client.run_overview(tenant="acme", window=timedelta(hours=2))
        assert sum(seen.jobs.values()) == 1
        assert sum(b.count for b in seen.runs if b.outcome is RunState.SUCCEEDED) == 1
        page = client.recent_runs_page(outcome="succeeded")
        assert [r.job_name for r in page.items] == ["mailer"]
        history = client.job_history(scene.jobs["globex"], fires=10)
        assert [f.state for f in history.fires] == [RunState.SUCCEEDED]
        with pytest.raises(NotFound):
            client.job_history(scene.jobs["overlap"])
        with pytest.raises(InvalidArgument, match="outcome"):
            client.recent_runs_page(outcome="missed")
        with pytest.raises(InvalidArgument, match="window_ms"):
            client.run_overview(window=timedelta(days=8))
        with pytest.raises(InvalidArgument, match="bucket_ms"):
            client.run_overview(window=timedelta(days=7), bucket=timedelta(minutes=1))
        with pytest.raises(InvalidArgument, match="fires"):
            client.job_history(scene.jobs["globex"], fires=1001)
    bad = call(f"{scene.node.url}/api/overview?window=week", token=scene.tokens["acme"])
    assert bad.status == 400 and "window" in bad.body["error"]
    bad = call(f"{scene.node.url}/api/runs?outcome=exploded", token=scene.tokens["acme"])
    assert bad.status == 400 and "outcome" in bad.body["error"]
