"""Smoke test of the limits benchmark: a real three-node cluster, a key that
binds, one that does not and one rated, an owner and a worker SIGKILLed and
restarted.
It pins the JSON keys the issue names and the limits themselves: never more
in flight than the key allows by the handlers' own records, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.services import EtcdServer
from tests.conftest import PG_DSN

ROOT = Path(__file__).resolve().parents[2]
LIMITS = ROOT / "benchmarks" / "limits.py"
KEYS = {
    "nodes", "jobs", "max_concurrent", "run_ms", "period_ms", "duration_s", "demand",
    "max_in_flight_observed", "utilization", "throughput_ratio", "runs_per_s", "kills",
    "worker_kills", "lost", "duplicates", "missed", "rate_max_starts_1s", "rate_starts_per_s",
    "rate_max_claims_1s", "permits",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.etcd
def test_a_kill_under_a_binding_key_keeps_the_limit_and_loses_nothing(
    tmp_path: Path, pg_dsn: str, etcd_server: EtcdServer
) -> None:
    # The fixtures prove PostgreSQL and etcd are there; the benchmark runs
    # its own etcd and schema.
    out = tmp_path / "limits.json"
    cmd = [sys.executable, str(LIMITS), "--nodes", "3", "--jobs", "12", "--max-concurrent", "3"]
    cmd += ["--run-ms", "300", "--duration", "8", "--kills", "1", "--worker-kills", "1"]
    cmd += ["--rate", "4/s"]
    cmd += ["--burst", "2", "--pg-dsn", PG_DSN, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == KEYS
    assert json.loads(proc.stdout) == result  # printed as well as written
    assert (result["kills"], result["worker_kills"]) == (1, 1)
    assert 0 < result["max_in_flight_observed"] <= 3
    assert result["lost"] == 0
    # Figures, not targets, at this size and under a kill (a loaded machine
    # moves them: benchmarks/README.md has the measured ones): in range.
    assert 0 < result["utilization"] <= 1
    permits = result["permits"]
    assert set(permits) == {"held", "before_start", "after_end", "after_end_late", "free"}
    assert 0 <= permits["after_end_late"] <= permits["after_end"] <= permits["held"]
    assert result["throughput_ratio"] > 0
    # No one-second window holds more claims (tokens taken) than the rate
    # and the burst, give or take one period: the benchmark counts claims by
    # their runs' `dispatched_at_ms`, the owner's clock when it formed the
    # claim, while the bucket takes tokens by the store's clock when the
    # batch arrives; on a loaded machine a batch waits up to about a second
    # between the two, so a window of stamps can hold a few claims of the
    # next second (7 seen once in a full CI run). The exact bound (N + burst)
    # is the benchmark's figure on a quiet machine (benchmarks/README.md).
    assert 0 < result["rate_max_claims_1s"] <= 4 + 2 + 4
