"""What the node's health watch reports, on its own with a real store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from wheel.engine.model import AlertKind
from wheel.errors import StoreError
from wheel.node import NodeConfig
from wheel.node._ops import Ops
from wheel.node._values import Clock
from wheel.store.open import open_store


def first_report(tmp_path: Path, failure: StoreError | None) -> list[AlertKind]:
    """The alerts a node's first health report raises, after ``failure`` of
    a store batch (if any)."""
    store = open_store(f"sqlite:///{tmp_path / 'wheel.db'}")

    async def report() -> list[AlertKind]:
        ops = Ops(
            NodeConfig(retain_ms=None),
            store,
            Clock(),
            None,
            ready=asyncio.Event(),
            driver=lambda: None,
            stopping=lambda: False,
            source=None,  # type: ignore[arg-type]  # read only by a scrape
        )
        if failure is not None:
            ops.store_failed(failure)
        await ops._report_health()
        return [raised.alert.kind for raised in ops.alerts]

    try:
        return asyncio.run(report())
    finally:
        store.close()


def test_a_store_lost_before_the_first_report_raises_its_alert(tmp_path: Path) -> None:
    # The health service says SERVING from the node's state when it starts,
    # before the watch's first report: a store lost in between (a loaded
    # machine delays that report) must still raise the alert.
    failure = StoreError("connection refused")
    assert first_report(tmp_path, failure) == [AlertKind.STORE_UNREACHABLE]


def test_a_first_report_of_a_store_that_answers_raises_nothing(tmp_path: Path) -> None:
    assert first_report(tmp_path, None) == []
