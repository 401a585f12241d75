"""The console's overview, feed of recent runs and job history in a real
headless Chromium against a real node, worker and auth: the overview draws
its charts (uPlot, served from the package) from runs of several outcomes,
a dead letter and a missed fire; the feed filters; a job shows its last
fires; a tenant sees only its own numbers; times switch zone; refreshing
pauses while the tab is hidden. Screenshots of the three pages are kept as
docs/overview.png, docs/feed.png and docs/job.png (docs/operating.md)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import WorkerProc, wait_for
from tests.console.http import ConsoleNode
from tests.console.test_browser import sign_in
from wheel.client import Client, Retry

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The tab as hidden or visible, as the browser tells a page so.
SHOWN = (
    "Object.defineProperty(document, 'visibilityState', {value: '%s', configurable: true});"
    " document.dispatchEvent(new Event('visibilitychange'));"
)


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A node with auth and a worker; acme's runs of every outcome, globex's
    one success."""
    tmp = tmp_path_factory.mktemp("overview-browser")
    node = ConsoleNode(tmp / "data", args=("--auth", "--init-admin-token", str(tmp / "admin")))
    node.start()
    worker = None
    try:
        admin = (tmp / "admin").read_text().strip()
        with Client(node.target, token=admin) as client:
            acme, _ = client.create_token(tenant="acme", scopes=["jobs:read", "jobs:write"])
            globex, _ = client.create_token(tenant="globex", scopes=["jobs:read", "jobs:write"])
            runner, _ = client.create_token(tenant="*", scopes=["worker"], worker_id="glance-w")
        worker = WorkerProc(
            node.target,
            tmp / "runs.txt",
            "glance-w",
            "e2e_handlers:slow",
            "e2e_handlers:scripted",
            env={"WHEEL_TOKEN": runner},
        )
        with Client(node.target, token=acme) as client:
            doomed = client.submit(
                name="invoice-export",
                handler="scripted",
                at=timedelta(0),
                payload={"permanent": True},
                retry=1,
            ).job_id
            flaky = client.submit(
                name="ledger-sync",
                handler="scripted",
                at=timedelta(0),
                payload={"fail": 1},
                retry=Retry(max_attempts=2, initial_backoff=timedelta(milliseconds=100)),
            ).job_id
            overlap = client.submit(
                name="warehouse-poll", handler="slow", every=timedelta(seconds=1)
            ).job_id

            def done() -> bool:
                runs = list(client.runs(overlap))
                return (
                    sum(r.state == "succeeded" for r in runs) >= 2
                    and any(r.state == "missed" for r in runs)
                    and bool(list(client.runs(doomed, states=["dead_lettered"])))
                    and bool(list(client.runs(flaky, states=["succeeded"])))
                )

            wait_for(done, 40, "acme's runs of every outcome")
        with Client(node.target, token=globex) as client:
            mailer = client.submit(name="mailer", handler="scripted", at=timedelta(0)).job_id
            wait_for(lambda: list(client.runs(mailer, states=["succeeded"])), 30, "globex's run")
        yield {
            "node": node,
            "admin": admin,
            "acme": acme,
            "globex": globex,
            "overlap": overlap,
            "flaky": flaky,
        }
    finally:
        if worker is not None:
            worker.stop()
        node.stop()


def until(page: Any, expression: str, what: str, timeout: float = 15) -> None:
    """Wait for ``expression`` to hold in the page (polled from here: the
    page's policy refuses the eval Playwright's own waiting uses)."""
    wait_for(lambda: page.evaluate(expression), timeout, what)


def card(page: Any, box: str, label: str) -> str:
    """The number of the card ``label`` in ``box``."""
    return str(page.locator(f"{box} .card", has_text=label).first.locator("b").inner_text())


def test_the_overview_draws_its_charts_from_real_runs_and_refreshes_while_visible(
    browser: Any, scene: dict[str, Any]
) -> None:
    node: ConsoleNode = scene["node"]
    page = sign_in(browser, node.url, scene["admin"])
    # The charts are uPlot's canvases, with a bar or point a minute.
    page.wait_for_selector("#ov-runs canvas")
    page.wait_for_selector("#ov-lag canvas")
    assert int(page.get_attribute("#ov-runs", "data-points") or 0) >= 60
    assert int(page.get_attribute("#ov-lag", "data-points") or 0) >= 60
    assert "Runs per minute, by outcome" in page.inner_text("#ov-runs")
    assert "objective (p99 ≤ 1 s)" in page.inner_text("#ov-lag")
    # Labelled ticks on the lag's log axis (uPlot writes them as text).
    assert " ms" in page.inner_text("#ov-lag .u-axis") or " s" in page.inner_text("#ov-lag")
    assert card(page, "#ov-jobs", "jobs") == "4"
    assert card(page, "#ov-totals", "dead lettered") == "1"
    assert int(card(page, "#ov-totals", "missed")) >= 1
    assert int(card(page, "#ov-totals", "failed")) >= 1
    assert int(card(page, "#ov-totals", "succeeded")) >= 3
    assert "did not succeed" in page.inner_text("#ov-verdict")
    assert card(page, "#ov-workers", "workers connected") == "1"
    assert card(page, "#ov-cluster", "shards") == "256"
    assert page.locator("#ov-firing").count() == 1
    # The day's view: a bar each 15 minutes.
    page.click('#ov-window button[data-window="day"]')
    until(page, "document.querySelector('#ov-runs').dataset.points >= 96", "the day's bars")
    assert "Runs per 15 minutes" in page.inner_text("#ov-runs")
    page.click('#ov-window button[data-window="hour"]')
    until(page, "document.querySelector('#ov-runs').dataset.points <= 61", "the hour's bars")
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / "overview.png"), full_page=True)

    # It refreshes itself while visible ...
    until(page, "Number(document.body.dataset.refreshes || 0) >= 1", "a refresh")
    # ... and asks nothing while the tab is hidden, until it shows again.
    page.evaluate(SHOWN % "hidden")
    before = int(page.evaluate("document.body.dataset.refreshes"))
    until(page, "Number(document.body.dataset.paused || 0) >= 1", "a tick skipped while hidden")
    assert int(page.evaluate("document.body.dataset.refreshes")) == before
    page.evaluate(SHOWN % "visible")
    until(page, f"Number(document.body.dataset.refreshes) > {before}", "a refresh on return")
    page.close()


def test_a_tenant_sees_only_its_own_numbers_and_no_operator_panels(
    browser: Any, scene: dict[str, Any]
) -> None:
    node: ConsoleNode = scene["node"]
    page = sign_in(browser, node.url, scene["globex"])
    page.wait_for_selector("#ov-runs canvas")
    assert card(page, "#ov-jobs", "jobs") == "1"
    assert card(page, "#ov-totals", "succeeded") == "1"
    assert card(page, "#ov-totals", "dead lettered") == "0"
    assert card(page, "#ov-totals", "missed") == "0"
    assert "all runs succeeded" in page.inner_text("#ov-verdict")
    for box in ("#ov-lag", "#ov-workers", "#ov-cluster", "#ov-alerts"):
        assert "needs an operator's token" in page.inner_text(box)
    page.goto(f"{node.url}/#/runs")
    page.wait_for_selector('body[data-loaded="#/runs"]')
    assert page.locator("#feed tbody tr[data-run]").all_inner_texts() != []
    assert {t.split("\t")[1] for t in page.locator("#feed tbody tr").all_inner_texts()} == {
        "mailer"
    }
    page.close()


def test_the_feed_filters_and_a_failed_run_links_to_its_job_with_its_error(
    browser: Any, scene: dict[str, Any]
) -> None:
    node: ConsoleNode = scene["node"]
    page = sign_in(browser, node.url, scene["acme"], timezone_id="Asia/Tokyo")
    page.goto(f"{node.url}/#/runs")
    page.wait_for_selector('body[data-loaded="#/runs"]')
    names = {r.split("\t")[1] for r in page.locator("#feed tbody tr").all_inner_texts()}
    assert names == {"invoice-export", "ledger-sync", "warehouse-poll"}
    first = page.locator("#feed tbody tr td").first.inner_text()
    assert first.endswith("Z")  # UTC unless asked
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / "feed.png"), full_page=False)

    page.select_option("#r-outcome", "failed")
    page.click("#feed-filters button")
    until(
        page,
        "[...document.querySelectorAll('#feed tbody tr')].every(r => r.dataset.state === 'failed')",
        "the failed runs only",
    )
    [row] = page.locator("#feed tbody tr").all()
    assert "scripted failure of attempt 1" in row.inner_text()
    assert row.locator("a").get_attribute("href") == f"#/job/{scene['flaky']}"

    page.select_option("#r-outcome", "")
    page.fill("#r-handler", "slow")
    page.click("#feed-filters button")
    until(
        page,
        "[...document.querySelectorAll('#feed tbody tr')].every(r =>"
        " r.cells[3] && r.cells[3].textContent === 'slow')",
        "the runs of handler slow only",
    )
    # The browser's own zone, switched to: Tokyo's offset on every time.
    page.select_option("#zone", "local")
    until(
        page,
        "document.querySelector('#feed tbody tr td').textContent.endsWith('+09:00')",
        "times in Tokyo's zone",
    )
    page.close()


def test_a_jobs_page_shows_its_last_fires_with_missed_reasons_and_its_day(
    browser: Any, scene: dict[str, Any]
) -> None:
    node: ConsoleNode = scene["node"]
    page = sign_in(browser, node.url, scene["acme"])
    page.goto(f"{node.url}/#/job/{scene['overlap']}")
    page.wait_for_selector(f'body[data-loaded="#/job/{scene["overlap"]}"]')
    strip = page.locator("#job-strip .fire")
    assert strip.count() >= 3
    missed = page.locator('#job-strip .fire[data-state="missed"]').first
    assert "missed: overlap" in (missed.get_attribute("title") or "")
    assert page.locator('#job-strip .fire[data-state="succeeded"]').count() >= 2
    assert card(page, "#job-day", "success rate") == "100.0%"
    assert card(page, "#job-day", "p50 duration").endswith(" s")
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / "job.png"), full_page=False)
    page.close()
