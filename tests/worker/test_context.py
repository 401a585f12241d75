"""What a handler reads from its RunContext, and its log records' run ids."""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from wheel.worker import Permanent, RunContext, RunLogFilter
from wheel.worker._api import current_run, run_context


def _ctx(payload: bytes = b"", deadline: float = math.inf) -> RunContext:
    return run_context(
        run_id=7,
        job_id=11,
        handler="send_report",
        tenant="t",
        payload=payload,
        idempotency_key="11:1765000000000",
        fence=3,
        attempt=2,
        scheduled_for_ms=1_765_000_000_123,
        timeout_ms=0,
        deadline=deadline,
    )


def test_json_parses_the_payload_and_says_clearly_when_it_is_not_json() -> None:
    assert _ctx(b'{"to": ["ann"], "n": 2}').json() == {"to": ["ann"], "n": 2}
    with pytest.raises(Permanent, match=r"the payload of run 7 is not JSON .*b'\{not json'"):
        _ctx(b"{not json").json()
    with pytest.raises(Permanent, match="not JSON"):
        _ctx(b"\xff\xfe").json()
    with pytest.raises(Permanent, match="not JSON"):
        _ctx(b"").json()


def test_scheduled_for_is_an_aware_utc_datetime_of_scheduled_for_ms() -> None:
    at = _ctx().scheduled_for
    assert at == datetime(2025, 12, 6, 5, 46, 40, 123_000, tzinfo=UTC)
    assert at.tzinfo is UTC


def test_remaining_counts_down_to_the_monotonic_deadline() -> None:
    assert _ctx().remaining == math.inf
    left = _ctx(deadline=time.monotonic() + 5).remaining
    assert 4 < left <= 5


def test_ctx_log_and_the_filter_add_job_run_and_attempt_to_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = _ctx()
    caplog.handler.addFilter(RunLogFilter())
    with caplog.at_level(logging.INFO):
        ctx.log.info("via the adapter")
        logging.getLogger("app").info("outside any run")
        token = current_run.set(ctx)
        try:
            logging.getLogger("app").info("inside the run")
            # Ids a record brings itself are kept.
            logging.getLogger("app").info("its own", extra={"run_id": 99})
        finally:
            current_run.reset(token)
    got = {r.getMessage(): (r.name, getattr(r, "run_id", None)) for r in caplog.records}
    assert got == {
        "via the adapter": ("wheel.handler.send_report", 7),
        "outside any run": ("app", None),
        "inside the run": ("app", 7),
        "its own": ("app", 99),
    }
    inside = next(r for r in caplog.records if r.getMessage() == "inside the run")
    assert (inside.job_id, inside.attempt) == (11, 2)  # type: ignore[attr-defined]


def test_run_handles_sigterm_and_sigint_only_while_it_runs_unless_told_not_to() -> None:
    import asyncio
    import signal

    from tests.worker.scripted import node, running, scenario
    from wheel.worker import Worker

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    seen: dict[str, object] = {}

    async def go() -> None:
        async with node() as (svc, target):
            async with running(Worker(target)):
                await svc.accept()
                seen["handled"] = signal.getsignal(signal.SIGTERM)
            seen["after"] = signal.getsignal(signal.SIGTERM)
            w = Worker(target)
            task = asyncio.create_task(w.run(handle_signals=False))
            await svc.accept()
            seen["opted_out"] = signal.getsignal(signal.SIGTERM)
            w.stop()
            await asyncio.wait_for(task, 5)

    scenario(go)
    # asyncio's own handler is in place while the worker handles the signal.
    assert seen["handled"] != before[signal.SIGTERM]
    assert seen["after"] == seen["opted_out"] == before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_bugs_error_keeps_its_last_frames_within_the_limit_and_no_credentials() -> None:
    from wheel.worker._runs import MAX_ERROR_CHARS, error_text

    # 200 distinct frames (repeated ones are folded into one line anyway).
    source = "".join(f"def f{i}():\n    f{i + 1}()\n" for i in range(200))
    source += 'def f200():\n    raise ConnectionError("postgresql://app:s3cret@db/app refused")\n'
    scope: dict[str, Any] = {}
    exec(compile(source, "deep.py", "exec"), scope)
    try:
        scope["f0"]()
    except ConnectionError as exc:
        text = error_text(exc)
    first, _, rest = text.partition("\n")
    assert first.startswith("ConnectionError: postgresql://app:[redacted]@db/app refused (at ")
    assert first.endswith("(at deep.py:402, in f200)") and "s3cret" not in text
    assert len(text) <= MAX_ERROR_CHARS
    # The earliest frames are cut, the raising one kept last.
    assert re.match(r"Traceback \(most recent call last, \d+ earlier frames cut\):\n", rest)
    assert rest.endswith('File "deep.py", line 402, in f200')
