"""Smoke test of the runs benchmark at a small scale on SQLite: a store of
ended runs over 40 days, dispatch against an empty one in the same run, the
history calls, and the node's own retention pass deleting what is past 30
days while fires keep coming."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "runs.py"
KEYS = {
    "runs", "store", "fill_s", "bytes_per_run", "cpu_s_per_1k", "empty_cpu_s_per_1k",
    "dispatch_cost_ratio", "lag_p99_ms", "empty_lag_p99_ms", "history_p99_ms", "retention_s",
    "retention_stall_ms_max", "lost", "duplicates",
}  # fmt: skip


@pytest.mark.slow
def test_the_runs_benchmark_measures_dispatch_history_and_a_retention_pass(
    tmp_path: Path,
) -> None:
    out = tmp_path / "runs.json"
    cmd = [sys.executable, str(BENCH), "--store", "sqlite", "--runs", "20000"]
    cmd += ["--history-jobs", "100", "--rate", "200", "--duration", "2", "--drain", "3"]
    cmd += ["--repeat", "3", "--retention-after", "10", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result.keys() >= KEYS
    assert (result["runs"], result["store"]) == (20000, "sqlite")
    assert (result["lost"], result["duplicates"]) == (0, 0)
    # A quarter of 40 days is past the 30 kept: their runs (5,000) and their
    # missed fires (one every 50 runs: 100) went in the node's one pass, and
    # neither window measured it (the horizon moved on a few runs, 173 s
    # apart, while the node started).
    assert 5100 <= result["retention_purged_rows"] <= 5110
    assert result["empty"]["purged_in_window"] == result["full"]["purged_in_window"] == 0
    assert result["bytes_per_run"] > result["heap_bytes_per_run"] > 0
    assert result["full"]["history"].keys() >= {"runs JOB_ID", "console job runs"}
    assert result["dispatch_cost_ratio"] > 0
