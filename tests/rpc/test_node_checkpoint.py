"""The node's LMDB log on a running server: one entry per store batch, a
snapshot once enough job records were logged, and a restart from both."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.rpc.test_api import InProcessServer, WorkerThread, connect, every, spec, submit, wait_for

JOBS = 20


def test_the_log_takes_a_batch_an_entry_and_a_snapshot_after_enough_job_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wheel")
    checkpoint_dir = str(tmp_path / "checkpoint")
    server = InProcessServer(
        tmp_path, checkpoint_dir=checkpoint_dir, snapshot_every_records=300, min_interval_ms=0
    ).start()
    try:
        node = server.node
        assert node is not None
        with connect(server) as api, WorkerThread(server.target, "w1", h=lambda ctx: None):
            for i in range(JOBS):
                submit(api, spec(name=f"every-{i}", schedule=every(40)))
            wait_for(
                lambda: f"snapshot of {JOBS} jobs" in caplog.text, 20, "a snapshot of the jobs"
            )
            # Every fire moved a job and so logged a record; a batch carries many.
            entries, logged = server.call(lambda: node._checkpointing.logged())
            assert logged >= 300
            assert entries < logged / 2
            fires = server.call(lambda: node.status().stats.completed)
            assert fires > 0
    finally:
        server.stop()
    snapshot_lines = [r for r in caplog.records if r.getMessage().startswith("snapshot of")]
    # Records are counted from where the last snapshot began: not one a batch.
    assert len(snapshot_lines) <= logged // 300 + 1

    caplog.clear()
    again = InProcessServer(tmp_path, checkpoint_dir=checkpoint_dir).start()
    try:
        assert "restored from the checkpoint" in caplog.text
        assert again.call(lambda: again.node.status().jobs) == JOBS  # type: ignore[union-attr]
    finally:
        again.stop()
