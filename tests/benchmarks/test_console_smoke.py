"""Smoke test of the console benchmark at a small scale, with jobs and runs
loaded straight into SQLite (and into PostgreSQL, all in one day): every
call answers, the overview's calls are among them, and the JSON has the
keys the benchmark has always had plus each call's p99 and first call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "console.py"
KEYS = {"jobs", "store", "load_s", "repeat", "budget_ms", "worst_max_ms", "within_budget"}
OVERVIEW = {"overview, hour", "overview, day", "recent runs", "recent runs, failed", "job history"}


@pytest.mark.slow
def test_the_console_benchmark_times_the_overview_calls_over_loaded_runs(tmp_path: Path) -> None:
    out = tmp_path / "console.json"
    cmd = [sys.executable, str(BENCH), "--jobs", "500", "--runs", "5000", "--repeat", "3"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=150, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result.keys() >= KEYS | {"runs", "worst_p99_ms"}
    assert (result["jobs"], result["runs"], result["store"]) == (500, 5000, "sqlite")
    calls = result["endpoints"]
    assert calls.keys() >= OVERVIEW
    for row in calls.values():
        assert row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert calls["overview, hour"]["grpc_p99_ms"] > 0


@pytest.mark.slow
@pytest.mark.postgres
def test_the_console_benchmark_loads_a_dense_day_into_postgresql(tmp_path: Path) -> None:
    out = tmp_path / "console.json"
    cmd = [sys.executable, str(BENCH), "--store", "postgres", "--dense-day"]
    cmd += ["--jobs", "500", "--runs", "5000", "--repeat", "3", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["store"], result["runs"], result["dense_day"]) == ("postgresql", 5000, True)
    calls = result["endpoints"]
    assert calls.keys() >= OVERVIEW
    assert result["worst_first_ms"] == max(row["first_ms"] for row in calls.values())
