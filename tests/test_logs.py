"""wheel's log records: JSON lines that parse and carry the ids of the job
and run they are about, or text lines with those ids appended."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from wheel.engine.model import shard_of
from wheel.logs import FORMATS, JsonFormatter, TextFormatter, configure, ids, redact


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO, logging.Handler]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("wheel.test-logs")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        yield log, out, handler
    finally:
        log.removeHandler(handler)


def test_a_json_record_carries_the_ids_it_was_given_and_the_jobs_shard(
    logger: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    log, out, handler = logger
    handler.setFormatter(JsonFormatter())
    log.warning(
        "run %d lost", 7, extra={**ids(job_id=42, run_id=7, fence=9, worker="w1"), "alert": "x"}
    )
    log.info("nothing about a run")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "run 7 lost" and first["level"] == "WARNING"
    assert first["logger"] == "wheel.test-logs" and first["time"].endswith("Z")
    assert (first["job_id"], first["run_id"], first["shard"], first["fence"], first["worker"]) == (
        42,
        7,
        shard_of(42),
        9,
        "w1",
    )
    assert first["alert"] == "x"
    assert list(first)[4:9] == ["job_id", "run_id", "shard", "fence", "worker"]
    assert set(second) == {"time", "level", "logger", "message"}


def test_a_json_record_keeps_its_traceback_on_one_line(
    logger: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    log, out, handler = logger
    handler.setFormatter(JsonFormatter())
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("it broke", extra=ids(job_id=1))
    [line] = out.getvalue().splitlines()
    record = json.loads(line)
    assert "ValueError: bad" in record["exception"] and record["job_id"] == 1


def test_a_text_record_appends_its_ids(
    logger: tuple[logging.Logger, io.StringIO, logging.Handler],
) -> None:
    log, out, handler = logger
    handler.setFormatter(TextFormatter())
    log.warning("run lost", extra=ids(job_id=3, run_id=4))
    assert (
        out.getvalue()
        .rstrip()
        .endswith(f"wheel.test-logs: run lost job_id=3 run_id=4 shard={shard_of(3)}")
    )


def test_configure_leaves_handlers_someone_installed_unless_forced() -> None:
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    ours = logging.NullHandler()
    for h in saved[0]:
        root.removeHandler(h)
    root.addHandler(ours)
    try:
        configure("json", stream=io.StringIO())
        assert root.handlers == [ours]
        stream = io.StringIO()
        configure("json", stream=stream, force=True)
        [handler] = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        with pytest.raises(ValueError):
            configure("xml", force=True)
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])


@pytest.mark.parametrize(
    "line",
    [
        "metadata (('authorization', 'Bearer tok-123'), ('x', 'y'))",
        "authorization: Bearer tok-123",
        "Authorization=tok-123",
        "sent header authorization: 'tok-123'",
        "call failed with bearer tok-123 attached",
        "store postgresql://wheel:tok-123@db.internal:5432/wheel",
    ],
)
def test_redaction_hides_every_form_of_an_authorization_value(line: str) -> None:
    clean = redact(line)
    assert "tok-123" not in clean and "[redacted]" in clean


@pytest.mark.parametrize("fmt", FORMATS)
def test_configured_logging_never_writes_a_bearer_token(fmt: str) -> None:
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure(fmt, level=logging.DEBUG, stream=out, force=True)
    try:
        log = logging.getLogger("wheel.test-redaction")
        log.debug("call metadata %s", [("authorization", "Bearer tok-456")])
        log.info("done", extra={"header": "authorization: tok-456"})
        try:
            raise RuntimeError("refused: authorization=tok-456")
        except RuntimeError:
            log.exception("call failed")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    written = out.getvalue()
    assert "tok-456" not in written
    assert written.count("[redacted]") >= 3
    assert "call metadata" in written and "refused" in written


def test_redaction_leaves_a_url_without_a_password_alone() -> None:
    for text in ("postgresql://wheel@db:5432/w", "etcd://127.0.0.1:2379/c", "see http://h:80/x"):
        assert redact(text) == text
