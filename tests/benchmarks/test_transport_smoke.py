"""Smoke test of the transport benchmark: both exchanges run between real
processes and report the keys the closing notes quote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_transport_benchmark_measures_both_exchanges(tmp_path: Path) -> None:
    out = tmp_path / "transport.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "transport.py")]
    cmd += ["--rates", "100", "--runs", "4", "--seconds", "1", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for kind in ("grpc", "socket"):
        # Paced at 100 rounds/s for 1 s: nearly all of them went round.
        assert 50 <= result[kind]["rounds_per_s"] <= 101
        assert result[kind]["client_cpu_ms_per_round"] >= 0
    assert result["grpc_cpu_ms_per_round"] > 0
    assert result["floor_cpu_s_per_1k"] > 0
