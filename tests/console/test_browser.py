"""The web console in a real headless Chromium (Debian's, driven by
Playwright) against a real node, worker and auth: the page signs in, lists a
job submitted over gRPC, opens it, and shows its runs and a missed fire with
its reason; another tenant's token shows none of it. The screenshot of the
job's page is kept as docs/console.png (docs/operating.md shows it)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import WorkerProc, wait_for
from tests.console.http import ConsoleNode, call
from tests.rpc.test_protocol_abuse import RawWorker, accepted_for
from wheel.client import Client
from wheel.rpc.v1 import worker_service_pb2 as pb

pytestmark = pytest.mark.slow

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console.png"


def sign_in(browser: Any, url: str, token: str, **context: Any) -> Any:
    """A new tab (its own sessionStorage) signed in with ``token``, on the
    overview (the landing page); ``context``: Playwright's page options."""
    page = browser.new_page(viewport={"width": 1360, "height": 900}, **context)
    page.goto(url + "/")
    page.wait_for_selector("#signin:not([hidden])")
    page.fill("#token", token)
    page.click("#signin-form button")
    page.wait_for_selector('body[data-loaded="#/overview"]')
    return page


def test_the_console_shows_a_jobs_runs_and_missed_fires_and_hides_it_from_other_tenants(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = ConsoleNode(
        tmp_path / "data", args=("--auth", "--init-admin-token", str(tmp_path / "admin.token"))
    )
    node.start()
    worker = None
    try:
        admin = (tmp_path / "admin.token").read_text().strip()
        with Client(node.target, token=admin) as client:
            acme, _ = client.create_token(tenant="acme", scopes=["jobs:read", "jobs:write"])
            globex, _ = client.create_token(tenant="globex", scopes=["jobs:read"])
            runner, _ = client.create_token(tenant="*", scopes=["worker"], worker_id="console-w")
        monkeypatch.setenv("WHEEL_TOKEN", runner)
        worker = WorkerProc(
            node.target,
            tmp_path / "runs.txt",
            "console-w",
            "e2e_handlers:slow",
            "e2e_handlers:scripted",
        )
        with Client(node.target, token=acme) as client:
            # One attempt that fails for good: a dead letter.
            doomed = client.submit(
                name="console-doomed",
                handler="scripted",
                at=timedelta(0),
                payload={"permanent": True},
                retry=1,
            )
            # Every second, running 1.6 s: the fire after each run's start is
            # skipped as an overlap, and recorded missed with that reason.
            job = client.submit(name="console-overlap", handler="slow", every=timedelta(seconds=1))

            def history() -> bool:
                runs = list(client.runs(job.job_id))
                return any(r.state == "succeeded" for r in runs) and any(
                    r.missed_reason == "overlap" for r in runs
                )

            wait_for(history, 30, "a finished run and an overlap miss")
            wait_for(
                lambda: list(client.runs(doomed.job_id, states=["dead_lettered"])),
                30,
                "the dead letter",
            )

        page = sign_in(browser, node.url, acme)
        page.goto(f"{node.url}/#/jobs")
        page.wait_for_selector('body[data-loaded="#/jobs"]')
        row = page.locator(f'#jobs tr[data-job="{job.job_id}"]')
        assert "console-overlap" in row.inner_text()
        assert "acme" in row.inner_text()
        row.locator("a").first.click()
        page.wait_for_selector(f'body[data-loaded="#/job/{job.job_id}"]')
        assert page.inner_text("#job-title") == f"console-overlap (job {job.job_id})"
        assert "every 1s (fixed rate)" in page.inner_text("#job-spec")
        assert page.locator("#job-next li").count() == 10
        succeeded = page.locator('#runs tr[data-state="succeeded"]')
        assert succeeded.count() >= 1
        assert "console-w" in succeeded.first.inner_text()
        missed = page.locator('#runs tr[data-state="missed"]')
        assert missed.count() >= 1
        assert "missed: overlap" in missed.first.inner_text()
        assert page.inner_text("#mode") == "read-only"
        assert page.locator("#job-actions button").count() == 0
        assert "no dead letters" in page.inner_text("#job-dead tbody")
        SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=False)
        # The dead letter, with its error, and no redrive on a read-only console.
        page.goto(f"{node.url}/#/job/{doomed.job_id}")
        page.wait_for_selector(f'body[data-loaded="#/job/{doomed.job_id}"]')
        dead = page.inner_text("#job-dead tbody")
        assert "scripted permanent failure" in dead and "console-w" in dead
        assert page.locator("#job-dead button.redrive").count() == 0
        page.close()

        # Another tenant: the job is not in its list, and not found by id.
        other = sign_in(browser, node.url, globex)
        other.goto(f"{node.url}/#/jobs")
        other.wait_for_selector('body[data-loaded="#/jobs"]')
        assert other.locator("#jobs tr[data-job]").count() == 0
        assert "no jobs match" in other.inner_text("#jobs tbody")
        other.goto(f"{node.url}/#/job/{job.job_id}")
        other.wait_for_selector(f'body[data-loaded="#/job/{job.job_id}"]')
        assert "not" in other.inner_text("#error").lower()
        assert "console-overlap" not in other.inner_text("main")
        other.close()

        # The operator's view: the worker with its handlers, its run in flight,
        # and the concurrency keys.
        with Client(node.target, token=admin) as client:
            client.set_limit("console-db", tenant="acme", max_concurrent=4)
        ops = sign_in(browser, node.url, admin)
        ops.goto(f"{node.url}/#/runtime")
        ops.wait_for_selector('body[data-loaded="#/runtime"]')
        workers = ops.inner_text("#workers tbody")
        assert "console-w" in workers and "e2e_handlers" not in workers
        limits = ops.inner_text("#limits tbody")
        assert "console-db" in limits and "acme" in limits
        held = call(f"{node.url}/api/in-flight", token=admin).body
        assert held["total"] == len(held["runs"]) <= 1
        assert all(r["job_id"] == str(job.job_id) for r in held["runs"])
        # The runs handed out are in the lag history's minutes.
        lag = call(f"{node.url}/api/lag", token=admin).body["minutes"]
        assert sum(m["count"] for m in lag) >= 2
        assert max(m["max_ms"] for m in lag) >= max(m["p50_ms"] for m in lag) >= 0
        ops.close()
    finally:
        if worker is not None:
            worker.stop()
        node.stop()


def test_with_actions_on_the_page_pauses_and_resumes_a_job(browser: Any, tmp_path: Path) -> None:
    node = ConsoleNode(tmp_path / "data", args=("--console-actions",))
    node.start()
    try:
        with Client(node.target) as client:
            job = client.submit(name="acted-on", handler="h", every=timedelta(hours=1))
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.goto(f"{node.url}/#/job/{job.job_id}")
        page.wait_for_selector(f'body[data-loaded="#/job/{job.job_id}"]')
        assert page.inner_text("#mode") == "actions on"
        page.click('#job-actions button[data-action="pause"]')
        page.wait_for_selector('#job-actions button[data-action="resume"]')
        assert "paused" in page.inner_text("#job-spec")
        with Client(node.target) as client:
            assert client.get(job.job_id).state == "paused"
        page.click('#job-actions button[data-action="resume"]')
        page.wait_for_selector('#job-actions button[data-action="pause"]')
        with Client(node.target) as client:
            assert client.get(job.job_id).state == "active"
        # The console's own actions are in the audit trail, with the job linked.
        page.goto(f"{node.url}/#/audit")
        page.wait_for_selector('body[data-loaded="#/audit"]')
        actions = page.locator("#audit tbody tr td:nth-child(2)").all_inner_texts()
        assert actions[:2] == ["ResumeJob", "PauseJob"], actions
        assert page.locator(f'#audit a[href="#/job/{job.job_id}"]').count() == 2
        assert '"state":"paused"' in page.inner_text("#audit tbody")
        page.close()
    finally:
        node.stop()


def test_a_runs_result_shows_as_text_summed_up_and_whole_on_expand(
    browser: Any, tmp_path: Path
) -> None:
    """The result is the endpoint's data: markup in it is shown, never run."""
    node = ConsoleNode(tmp_path / "data")
    node.start()
    worker = None
    try:
        with Client(node.target) as client:
            job = client.submit(name="with-result", handler="h", at=timedelta(0), pool="res")
        worker = RawWorker(node.target, "w-res", pool="res")
        a = worker.expect("assignments").assignments.assignments[0]
        excerpt = '<img src=x onerror="document.body.dataset.owned=1"><b>hi</b>'
        result = json.dumps({"http_status": 201, "duration_ms": 7, "response_excerpt": excerpt})
        worker.send(
            pb.WorkerMessage(
                complete=pb.Complete(
                    completions=[
                        pb.Completion(
                            run_id=a.run_id,
                            fence=a.fence,
                            outcome=pb.OUTCOME_SUCCEEDED,
                            result_json=result,
                        )
                    ]
                )
            )
        )
        worker.expect("results", where=accepted_for(a.run_id))
        with Client(node.target) as client:
            wait_for(lambda: client.get_run(a.run_id).result, 10, "the run's result")
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        page.goto(f"{node.url}/#/job/{job.job_id}")
        page.wait_for_selector(f'body[data-loaded="#/job/{job.job_id}"]')
        cell = page.locator('#runs tr[data-state="succeeded"] td.result')
        assert cell.locator("summary").inner_text() == "http 201 7ms"
        assert json.loads(cell.get_attribute("title") or "")["response_excerpt"] == excerpt
        cell.locator("summary").click()
        assert json.loads(cell.locator("pre").inner_text())["response_excerpt"] == excerpt
        assert cell.locator("img, b").count() == 0
        assert page.evaluate("document.body.dataset.owned") is None
        page.close()
    finally:
        if worker is not None:
            worker.close()
        node.stop()
