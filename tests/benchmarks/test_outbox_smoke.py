"""Smoke test of the outbox benchmark: it relays every row and reports its
keys, the arm lag with the relay busy included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PG_DSN

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_outbox_bench_relays_every_row_and_reports_throughput_and_arm_lag(
    tmp_path: Path, pg_dsn: str
) -> None:
    out = tmp_path / "outbox.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "outbox.py"), "--rows", "2000"]
    cmd += ["--lag-rows", "40", "--lag-rate", "200", "--busy-rate", "500"]
    cmd += ["--pg-dsn", PG_DSN, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rows"] == 2000 and result["lag_rows"] == 40
    for key in ("rows_per_s", "baseline_submit_many_per_s", "arm_lag_p99_ms"):
        assert result[key] > 0, key
    assert result["arm_lag_p50_ms"] <= result["arm_lag_p99_ms"] <= result["arm_lag_max_ms"]
    # The same probe rows with a steady background committed meanwhile.
    assert result["busy_rows_per_s"] > 0 and result["busy_pending_max"] >= 0
    busy = [result[f"busy_arm_lag_{k}_ms"] for k in ("p50", "p99", "max")]
    assert 0 < busy[0] <= busy[1] <= busy[2]
