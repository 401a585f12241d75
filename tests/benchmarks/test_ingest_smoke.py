"""Smoke test of the ingest benchmark: a few thousand jobs through a real node
in several bulk submits, the store's own rate beside it. It pins the JSON
keys the issue names and that every job is held, before and after a restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INGEST = ROOT / "benchmarks" / "ingest.py"


@pytest.mark.slow
def test_an_ingest_stores_every_job_and_says_how_fast_against_the_store(tmp_path: Path) -> None:
    out = tmp_path / "ingest.json"
    cmd = [sys.executable, str(INGEST), "--store", "sqlite", "--jobs", "3000", "--batch", "500"]
    cmd += ["--json", str(out), "--hold-timeout", "120"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert (result["store"], result["jobs"], result["nodes"], result["duplicates"]) == (
        "sqlite", 3000, 1, 0
    )  # fmt: skip
    # Figures, not targets (a loaded machine moves them): present and in range.
    assert result["submit_per_s"] > 0 and result["store_limit_per_s"] > 0
    assert (
        0
        < result["submit_ratio"]
        == pytest.approx(result["submit_per_s"] / result["store_limit_per_s"], rel=0.01)
    )
    assert result["loop_stall_ms_max"] >= 0 and result["restart_held_s"] >= 0
    assert result["node_cpu_us_per_job"] > 0 and result["client_cpu_us_per_job"] > 0
