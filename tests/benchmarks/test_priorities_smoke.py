"""Smoke test of the priorities benchmark: a small saturated pool, real
processes. Every run starts once, the JSON has the keys the issue names, and
the priority-0 runs' lag is well below the priority-9 runs'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "priorities.py"
KEYS = {
    "lag_p99_ms_p0", "lag_p99_ms_p9", "lag_ratio", "max_wait_ms", "aging_bound_ms", "lost",
    "duplicates",
}  # fmt: skip


@pytest.mark.slow
def test_a_saturated_pool_starts_every_run_once_and_priority_0_first(tmp_path: Path) -> None:
    out = tmp_path / "priorities.json"
    cmd = [sys.executable, str(BENCH), "--jobs", "150", "--capacity", "2", "--run-ms", "50"]
    cmd += ["--duration", "3", "--burst-ms", "1000", "--p0-share", "0.1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result  # printed as well as written
    assert result.keys() >= KEYS
    assert result["jobs"] == 150 and result["p0_jobs"] == 15
    assert (result["lost"], result["duplicates"]) == (0, 0)
    assert result["aging_bound_ms"] == 90_000 and result["within_bound"]
    assert result["max_wait_ms"] <= result["aging_bound_ms"]
    assert result["lag_p99_ms_p0"] < result["lag_p99_ms_p9"]
    assert result["lag_ratio"] == pytest.approx(
        result["lag_p99_ms_p0"] / result["lag_p99_ms_p9"], abs=1e-3
    )
