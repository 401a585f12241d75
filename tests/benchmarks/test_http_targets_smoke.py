"""Smoke test of the HTTP targets benchmark: both phases at a tiny rate,
real processes. It pins the JSON the issue names, that every signed request
verified and arrived once, and that the ratio is the phases' own figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "http_targets.py"
KEYS = {
    "offered_per_s", "delivered_per_s", "lag_p99_ms", "bad_signatures", "duplicates", "lost",
    "cpu_s_per_1k", "cpu_ratio_vs_noop",
}  # fmt: skip
PHASE_KEYS = {
    "expected_fires", "delivered", "delivered_per_s", "lag_p50_ms", "lag_p99_ms", "lost",
    "duplicates", "cpu_s_per_1k", "node_cpu_s_per_1k", "worker_cpu_s_per_1k",
}  # fmt: skip


@pytest.mark.slow
def test_both_phases_deliver_every_fire_once_with_good_signatures(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    cmd = [sys.executable, str(BENCH), "--smoke", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result  # printed as well as written
    assert result.keys() >= KEYS | {"http", "noop", "cpu_counts"}
    assert result["offered_per_s"] == 50
    http, noop = result["http"], result["noop"]
    for phase in (http, noop):
        assert phase.keys() >= PHASE_KEYS
        # --smoke: 50 fires/s for 2 s, every one delivered once.
        assert phase["expected_fires"] == phase["delivered"] == 100
        assert (phase["lost"], phase["duplicates"]) == (0, 0)
        assert 0 <= phase["lag_p50_ms"] <= phase["lag_p99_ms"] < 1000
        assert phase["cpu_s_per_1k"] > 0
    # Every request the receiver got verified, one per fire, at its own time.
    assert (result["bad_signatures"], result["lost"], result["duplicates"]) == (0, 0, 0)
    assert http["requests"] == 100 and http["scheduled_for_mismatches"] == 0
    # Keep-alive: far fewer connections than requests.
    assert 1 <= http["connections"] <= 20
    assert "receiver_cpu_s_per_1k" in http and "receiver_cpu_s_per_1k" not in noop
    assert result["cpu_s_per_1k"] == http["cpu_s_per_1k"]
    ratio = http["cpu_s_per_1k"] / noop["cpu_s_per_1k"]
    assert result["cpu_ratio_vs_noop"] == pytest.approx(ratio, abs=0.001)
