"""Smoke test of the failover benchmark: a real three-node cluster, one
SIGKILL at a low rate with idle jobs loaded, and the restart after it. It
pins the JSON the issues name and that the kill loses no fire."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.services import EtcdServer
from tests.conftest import PG_DSN

ROOT = Path(__file__).resolve().parents[2]
FAILOVER = ROOT / "benchmarks" / "failover.py"
KEYS = {
    "nodes", "rate", "kills", "ttl_s", "failover_s_p50", "failover_s_max", "late_p99_ms",
    "lost", "duplicates", "jobs", "handover_unowned_s_max", "handover_unowned_poll_s_max",
    "handover_late_max_ms", "duplicates_planned",
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.etcd
def test_one_kill_at_a_low_rate_reports_every_key_and_loses_nothing(
    tmp_path: Path, pg_dsn: str, etcd_server: EtcdServer
) -> None:
    # The fixtures prove PostgreSQL and etcd are there (or skip/fail per CI);
    # the benchmark runs its own etcd and schema.
    out = tmp_path / "failover.json"
    cmd = [sys.executable, str(FAILOVER), "--nodes", "3", "--rate", "50", "--kills", "1"]
    cmd += ["--ttl", "3", "--settle", "2", "--drain", "10", "--workers", "1", "--jobs", "5000"]
    cmd += ["--pg-dsn", PG_DSN, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result) == KEYS
    assert json.loads(proc.stdout) == result  # printed as well as written
    assert (result["nodes"], result["rate"], result["kills"], result["ttl_s"]) == (3, 50, 1, 3)
    assert result["lost"] == 0
    # The move takes about the TTL: etcd expires the dead node's lease first.
    assert 1.0 <= result["failover_s_p50"] <= result["failover_s_max"] <= 3 + 5
    assert result["late_p99_ms"] > 0
    assert result["duplicates"] >= 0
    # The restart is a planned move: its shards come back, prepared.
    assert result["jobs"] == 5000
    # The gap from the nodes' own records; seen from outside it can only be longer.
    assert 0 <= result["handover_unowned_s_max"] < 3
    assert result["handover_unowned_poll_s_max"] >= result["handover_unowned_s_max"] - 0.05
    assert result["handover_late_max_ms"] > 0
    assert result["duplicates_planned"] >= 0
