"""Smoke test of the tracing benchmark: two pairs of phases at a tiny rate,
real processes. It pins the JSON, that every fire arrived once in each
phase, and that the ratio is the median pair's own figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "tracing.py"
KEYS = {
    "offered_per_s", "cpu_s_per_1k_off", "cpu_s_per_1k_on", "cpu_ratio_traced",
    "cpu_ratio_traced_rounds", "rounds_whole", "lag_p99_ms_off", "lag_p99_ms_on", "lost",
    "duplicates", "off", "on",
}  # fmt: skip


@pytest.mark.slow
def test_two_pairs_of_phases_deliver_every_fire_once_and_report_the_median(
    tmp_path: Path,
) -> None:
    out = tmp_path / "tracing.json"
    cmd = [sys.executable, str(BENCH), "--smoke", "--rounds", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result.keys() >= KEYS and result["offered_per_s"] == 50
    assert (result["lost"], result["duplicates"]) == (0, 0)
    assert result["rounds_whole"] == [True, True]
    ratios = result["cpu_ratio_traced_rounds"]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)
    assert result["cpu_ratio_traced"] == max(ratios)  # of two, the higher
    off, on = result["off"], result["on"]
    for phase in (off, on):
        assert phase["expected_fires"] == phase["delivered"] == 100  # 50/s for 2 s
    assert result["cpu_ratio_traced"] == round(on["cpu_s_per_1k"] / off["cpu_s_per_1k"], 3)
