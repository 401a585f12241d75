"""Smoke test of the owner benchmark: it drives every fire through and prints its keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("lead", "least"), [(0, 64), (250, 64), (250, 1)])
def test_owner_bench_dispatches_every_fire_and_reports_a_ratio(
    tmp_path: Path, lead: int, least: int
) -> None:
    out = tmp_path / "owner.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "owner.py"), "--rate", "2000"]
    cmd += ["--seconds", "2", "--claim-ahead-ms", str(lead), "--claim-ahead-min", str(least)]
    cmd += ["--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # Every fire due before the drive's last millisecond reached a worker.
    assert 0.99 * 4_000 <= result["dispatched"] <= 4_000
    assert result["owner_us_per_dispatch"] > 0 and result["timer_round_us"] > 0
    assert result["owner_per_timer_round"] > 1
    assert result["claim_ahead_ms"] == lead and result["claim_ahead_min"] == least
